"""Tests for posttrain.data.chat: the prompt and the trained response through a chat template.

The tokenizer is the tiny model's (one token per ASCII character, ``<pad>`` 0 and ``<eos>`` 1), with
its own role-less template or another set on it; the token ids are read back as text.
"""

from __future__ import annotations

import copy

import pytest

from posttrain.data.chat import ChatEncoder
from posttrain.models.tiny import build_tokenizer

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
    refusal = r"^chat template: the conversation does not start with the generation prompt$"
    with pytest.raises(ValueError, match=refusal):
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
