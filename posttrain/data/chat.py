"""Prompt and response tokenization through the tokenizer's chat template."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, question: str) -> list[int]:
    """Token ids of a one-turn user prompt, ready for generation (generation prompt added)."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=True,
                                              add_generation_prompt=True, return_dict=True)["input_ids"])


def encode_sft_example(tokenizer: Any, question: str, response: str) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a user/assistant exchange; the response ends with EOS.

    The response ids are the conversation's ids after the prompt's, so whatever the template
    appends to an assistant turn (EOS here) is trained on.

    Raises:
        ValueError: the template renders the conversation with a prefix other than the prompt.
    """
    prompt = encode_prompt(tokenizer, question)
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": response}]
    full = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
    if full[: len(prompt)] != prompt:
        raise ValueError("chat template: the conversation does not start with the generation prompt")
    return prompt, full[len(prompt):]
