"""Prompt and response tokenization through the tokenizer's chat template.

Rendering a chat template (Jinja) costs about a millisecond per call, as much as a training
step of a tiny model spends on a whole micro-batch; :class:`ChatEncoder` memoizes it, since
training draws the same problems again and again.
"""

from __future__ import annotations

import functools
from typing import Any


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
            ValueError: the template renders the conversation with a prefix other than the prompt.
        """
        prompt = self.prompt(question)
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": response}]
        full = self._render(messages, add_generation_prompt=False)
        if tuple(full[: len(prompt)]) != prompt:
            raise ValueError("chat template: the conversation does not start with the generation prompt")
        turn = full[len(prompt):]
        eos = self.tokenizer.eos_token_id
        return prompt, tuple(turn[: turn.index(eos) + 1] if eos in turn else turn)
