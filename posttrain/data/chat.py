"""Prompt and response tokenization through the tokenizer's chat template.

Rendering a chat template (Jinja) costs about a millisecond per call, as much as a training
step of a tiny model spends on a whole micro-batch; :class:`ChatEncoder` memoizes it, since
training draws the same problems again and again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from posttrain.errors import ConfigError


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where token sequences ``a`` and ``b`` differ (the shorter one's length
    when one is a prefix of the other), or None when they are equal: compared by content, token by
    token, never by length alone."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # the shorter one ends the comparison
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class ChatEncoder:
    """Memoized chat-template tokenization for one tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.prompt = functools.lru_cache(maxsize=None)(self._prompt)
        self.sft_example = functools.lru_cache(maxsize=None)(self._sft_example)

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        out = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                                 return_dict=True)
        return list(out["input_ids"])

    def _prompt(self, question: str) -> tuple[int, ...]:
        """Token ids of a one-turn user prompt, ready for generation (generation prompt added)."""
        return tuple(self._render([{"role": "user", "content": question}], add_generation_prompt=True))

    def _sft_example(self, question: str, response: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prompt ids, response ids) of a user/assistant exchange; the response ends with EOS.

        The response ids are the conversation's ids after the prompt's (which ends with the
        assistant header, where the template has one), up to and including the first EOS: the
        end-of-turn token is trained on, as the model must learn to stop; whatever a template
        renders after it (an instruct template's newline between turns) is never generated, so
        it is not trained on either.

        Raises:
            ConfigError: the conversation's tokens do not start with the prompt's, token for token (a
                template that renders the user turn differently once an assistant turn follows, such
                as one that folds a system prompt into the last user turn only): SFT would train on a
                prompt that GRPO and validation never sample from. One line naming the first token
                that differs.
        """
        prompt = self.prompt(question)
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": response}]
        full = self._render(messages, add_generation_prompt=False)
        if tuple(full[: len(prompt)]) != prompt:
            raise ConfigError(self._not_a_prefix(full, prompt))
        turn = full[len(prompt):]
        eos = self.tokenizer.eos_token_id
        return prompt, tuple(turn[: turn.index(eos) + 1] if eos in turn else turn)

    def _not_a_prefix(self, full: list[int], prompt: tuple[int, ...]) -> str:
        """Why the rendered conversation ``full`` does not start with the generation ``prompt``."""
        at = first_difference(full[: len(prompt)], prompt)
        assert at is not None

        def shown(ids: Sequence[int]) -> str:
            return repr(self.tokenizer.decode(list(ids[at: at + 12]))) if at < len(ids) else "nothing (it ends)"

        return (f"chat template: a user + assistant conversation does not start with the generation prompt: from "
                f"token {at} it has {shown(full)} where the prompt has {shown(prompt)} (the user turn rendered "
                "differently once an assistant turn follows?); SFT would train on a prompt GRPO never samples from")
