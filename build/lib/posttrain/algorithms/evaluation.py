"""Validation: greedy accuracy of the generation engine on held-out problems."""

from __future__ import annotations

from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem
from posttrain.environments.math_verifier import math_reward
from posttrain.models.generation.interfaces import Generation, SamplingParams


def is_validation_step(step: int, period: int, num_steps: int) -> bool:
    """Validate every ``period`` steps (0: never in between) and always after the last step."""
    return (period > 0 and step % period == 0) or step == num_steps


def greedy_outcomes(generation: Generation, chat: ChatEncoder, problems: list[MathProblem],
                    max_new_tokens: int) -> list[float]:
    """Per problem, 1.0 if its greedy completion has the right final answer, else 0.0
    (``math_reward``); same order as ``problems``."""
    prompts = [list(chat.prompt(p.question)) for p in problems]
    out = generation.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))
    texts = chat.tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
    return [math_reward(t, p.answer) for t, p in zip(texts, problems, strict=True)]


def greedy_accuracy(generation: Generation, chat: ChatEncoder, problems: list[MathProblem],
                    max_new_tokens: int) -> float:
    """Fraction of ``problems`` whose greedy completion has the right final answer.

    Raises:
        ValueError: ``problems`` is empty (an accuracy over nothing would read as 0.0).
    """
    if not problems:
        raise ValueError("greedy_accuracy needs at least one problem")
    return sum(greedy_outcomes(generation, chat, problems, max_new_tokens)) / len(problems)
