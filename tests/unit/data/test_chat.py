"""The SFT example's prompt is the exact token prefix of the rendered conversation
(``posttrain.data.chat``), with real tokenizers built here (the ASCII tiny tokenizer, no hub) and
real chat templates.

GRPO samples from ``ChatEncoder.prompt(question)``; SFT trains the answer after
``sft_example(question, answer)[0]``. They must be the same tokens, compared token by token: a
template that renders the user turn differently once an assistant turn follows (as Mistral's
instruct templates do, folding the system prompt into the last user turn only) renders a
conversation that does not start with the generation prompt, and a check by length alone passes it
when the answer is long enough.
"""

from __future__ import annotations

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
