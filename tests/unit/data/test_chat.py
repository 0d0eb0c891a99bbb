"""The SFT example's prompt is the exact token prefix of the rendered conversation
(``posttrain.data.chat``), with real tokenizers built here (the ASCII tiny tokenizer, no hub) and
real chat templates.

GRPO samples from ``ChatEncoder.prompt(question)``; SFT trains the answer after
``sft_example(question, answer)[0]``. They must be the same tokens, compared token by token: a
template that renders the user turn differently once an assistant turn follows (as Mistral's
instruct templates do, folding the system prompt into the last user turn only) renders a
conversation that does not start with the generation prompt, and a check by length alone passes it
when the answer is long enough.

The tokenizer is the tiny model's (one token per ASCII character, ``<pad>`` 0 and ``<eos>`` 1), with
its own role-less template or another set on it; the token ids are read back as text.
"""

from __future__ import annotations

import copy

import pytest

from posttrain.data.chat import ChatEncoder, first_difference
from posttrain.errors import ConfigError
from posttrain.models.tiny import CHAT_TEMPLATE

# ChatML, as Qwen's instruct models render it: the assistant header only under add_generation_prompt
CHATML = (
    "{{- '<|im_start|>system\\nBe brief.' + eos_token + '\\n' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Mistral's instruct template, reduced: the system prompt goes into the *last* user turn, so a user
# turn answered by an assistant turn renders without it
SYSTEM_IN_LAST_USER_TURN = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' and loop.last -%}"
    "{{- '[INST] Be brief.\\n\\n' + message['content'] + '[/INST]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST] ' + message['content'] + '[/INST]' -}}"
    "{%- else -%}{{- message['content'] + eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)
QUESTION = "Natalia sold clips to 48 of her friends in April. How many clips did she sell?"
LONG_ANSWER = "She sold 48 clips in April and half as many in May: 48 + 24 = 72. #### 72"


@pytest.fixture(scope="module")
def ascii_tokenizer():
    from posttrain.models.tiny import build_tokenizer

    return build_tokenizer("ascii")


def encoder(tokenizer, template: str) -> ChatEncoder:
    tokenizer.chat_template = template
    return ChatEncoder(tokenizer)


def render(tokenizer, messages: list[dict], generation_prompt: bool) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt,
                                        return_dict=True)
    return list(out["input_ids"])


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML], ids=["roleless", "chatml"])
@pytest.mark.parametrize("answer", ["72", LONG_ANSWER])
def test_the_sft_prompt_is_grpos_prompt_and_prompt_plus_answer_is_the_conversation(ascii_tokenizer, template,
                                                                                   answer) -> None:
    chat = encoder(ascii_tokenizer, template)
    prompt, response = chat.sft_example(QUESTION, answer)
    assert prompt == chat.prompt(QUESTION)  # the very tokens GRPO samples after
    conversation = render(ascii_tokenizer, [{"role": "user", "content": QUESTION},
                                            {"role": "assistant", "content": answer}], generation_prompt=False)
    eos = ascii_tokenizer.eos_token_id
    trained = conversation[len(prompt):]
    assert list(prompt) == conversation[: len(prompt)]
    assert list(response) == trained[: trained.index(eos) + 1]
    assert ascii_tokenizer.decode(list(response)) == answer + ascii_tokenizer.eos_token


@pytest.mark.parametrize("answer", ["72", LONG_ANSWER], ids=["shorter-than-the-prompt", "longer"])
def test_a_template_that_renders_an_answered_user_turn_differently_is_refused_in_one_line(ascii_tokenizer,
                                                                                          answer) -> None:
    """With the long answer the conversation is longer than the prompt, so only a token-by-token
    comparison tells them apart."""
    chat = encoder(ascii_tokenizer, SYSTEM_IN_LAST_USER_TURN)
    prompt = chat.prompt(QUESTION)
    assert ascii_tokenizer.decode(list(prompt)).startswith("[INST] Be brief.\n\n")  # GRPO's prompt is fine
    conversation = render(ascii_tokenizer, [{"role": "user", "content": QUESTION},
                                            {"role": "assistant", "content": answer}], generation_prompt=False)
    assert (len(conversation) >= len(prompt)) is (answer == LONG_ANSWER)
    with pytest.raises(ConfigError, match=r"^chat template: a user \+ assistant conversation does not start with "
                                          r"the generation prompt: from token 7 it has 'Natalia sold' where the "
                                          r"prompt has 'Be brief.\\n\\nN' .*; SFT would train on a prompt GRPO "
                                          r"never samples from$") as err:
        chat.sft_example(QUESTION, answer)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ([1, 2, 3], [1, 2, 3], None), ([], [], None), ([1, 2, 3], [1, 9, 3], 1), ([5, 2], [1, 2], 0),
    ([1, 2], [1, 2, 3], 2), ([1, 2, 3], [1, 2], 2), ([1, 2, 3], [3, 2, 1], 0),
])  # fmt: skip
def test_first_difference_compares_token_by_token(a, b, expected) -> None:
    assert first_difference(a, b) == expected
    assert first_difference(b, a) == expected


# ChatML-style, as instruct models render it: a system turn, a header per turn, EOS and a newline
# after each turn, the assistant header only under add_generation_prompt.
INSTRUCT = (
    "{{- '<s>' -}}"
    "{%- for message in messages -%}"
    "{{- '[' + message['role'] + ']' + message['content'] + eos_token + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '[assistant]' -}}{%- endif -%}"
)
# No end of turn at all: a turn is its header ('A:' for the assistant) and its text, and a generation
# prompt opens one more assistant turn.
NO_EOS = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- 'A:' -}}{%- endif -%}{{- message['content'] -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'A:' -}}{%- endif -%}"
)
# The generation prompt's header is not the one the conversation renders the reply under.
OTHER_HEADER = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{- '>>' + message['content'] -}}"
    "{%- else -%}{{- message['content'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<<' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from posttrain.models.tiny import build_tokenizer

    return build_tokenizer("ascii")


def with_template(tokenizer, template: str):
    """A copy of ``tokenizer`` that renders ``template``."""
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


class CountingTokenizer:
    """The tokenizer, counting its chat-template renders."""

    def __init__(self, tokenizer):
        self.tokenizer, self.renders = tokenizer, 0
        self.eos_token_id = tokenizer.eos_token_id

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.tokenizer.apply_chat_template(*args, **kwargs)


def test_the_prompt_is_the_user_turn_with_the_generation_prompt(tiny_tokenizer):
    tokenizer = with_template(tiny_tokenizer, INSTRUCT)
    prompt = ChatEncoder(tokenizer).prompt("12+34=")
    assert isinstance(prompt, tuple)
    assert tokenizer.decode(prompt) == "<s>[user]12+34=<eos>\n[assistant]"


def test_the_response_is_the_turn_after_the_prompt_through_its_eos_and_no_further(tiny_tokenizer):
    tokenizer = with_template(tiny_tokenizer, INSTRUCT)
    prompt, response = ChatEncoder(tokenizer).sft_example("12+34=", "46")
    assert tokenizer.decode(prompt) == "<s>[user]12+34=<eos>\n[assistant]"
    assert isinstance(response, tuple)
    assert tokenizer.decode(response) == "46<eos>"  # the newline after the end of turn is never generated


def test_the_response_stops_at_its_first_eos(tiny_tokenizer):
    """A template that closes the turn twice: the response is trained up to the first EOS only."""
    tokenizer = with_template(tiny_tokenizer, INSTRUCT.replace("eos_token + '\\n'", "eos_token + 'x' + eos_token"))
    _, response = ChatEncoder(tokenizer).sft_example("1+1=", "2")
    assert tokenizer.decode(response) == "2<eos>"


def test_a_template_without_an_end_of_turn_trains_the_whole_reply_and_no_next_turn(tiny_tokenizer):
    tokenizer = with_template(tiny_tokenizer, NO_EOS)
    prompt, response = ChatEncoder(tokenizer).sft_example("1+1=", "2 then more")
    # the conversation is rendered finished: no generation prompt opens another turn after the reply
    assert (tokenizer.decode(prompt), tokenizer.decode(response)) == ("1+1=A:", "2 then more")


def test_the_tiny_template_prompts_with_the_question_and_trains_the_answer_and_eos(tiny_tokenizer):
    prompt, response = ChatEncoder(tiny_tokenizer).sft_example("9+9=", "18")
    assert (tiny_tokenizer.decode(prompt), tiny_tokenizer.decode(response)) == ("9+9=", "18<eos>")


def test_a_conversation_that_does_not_start_with_the_generation_prompt_is_refused(tiny_tokenizer):
    chat = ChatEncoder(with_template(tiny_tokenizer, OTHER_HEADER))
    refusal = r"^chat template: a user \+ assistant conversation does not start with the generation prompt: "
    with pytest.raises(ConfigError, match=refusal):
        chat.sft_example("1+1=", "2")


def test_each_question_is_rendered_once_however_often_it_is_asked(tiny_tokenizer):
    counting = CountingTokenizer(tiny_tokenizer)
    chat = ChatEncoder(counting)
    questions = [f"{i}+1=" for i in range(200)]  # more than functools.lru_cache's default of 128
    first = [chat.prompt(q) for q in questions]
    assert counting.renders == 200
    assert [chat.prompt(q) for q in questions] == first
    assert counting.renders == 200
    examples = [chat.sft_example(q, "2") for q in questions]  # one more render each: the conversation
    assert [chat.sft_example(q, "2") for q in questions] == examples
    assert counting.renders == 400


def test_a_conversation_that_ends_inside_the_generation_prompt_is_refused_saying_it_ends(tiny_tokenizer):
    """A template that drops assistant turns renders the conversation as a strict prefix of the prompt."""
    drops_replies = ("{%- for message in messages -%}{%- if message['role'] == 'user' -%}{{- message['content'] -}}"
                     "{%- endif -%}{%- endfor -%}{%- if add_generation_prompt -%}{{- 'A:' -}}{%- endif -%}")
    chat = ChatEncoder(with_template(tiny_tokenizer, drops_replies))
    with pytest.raises(ConfigError) as err:
        chat.sft_example("1+1=", "2")
    assert str(err.value) == ("chat template: a user + assistant conversation does not start with the generation "
                              "prompt: from token 4 it has nothing (it ends) where the prompt has 'A:' (the user "
                              "turn rendered differently once an assistant turn follows?); SFT would train on a "
                              "prompt GRPO never samples from")
