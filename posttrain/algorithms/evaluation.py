"""Validation on held-out problems: the generation engine's greedy accuracy, and the policy's
sampling accuracy (the exact probability of sampling the reference answer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from posttrain.data.batch import TokenBatch, make_batch
from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem
from posttrain.environments.math_verifier import math_reward
from posttrain.models.generation.interfaces import Generation, SamplingParams

if TYPE_CHECKING:
    from posttrain.models.policy.interfaces import PolicyInterface


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


def reference_batch(chat: ChatEncoder, problems: list[MathProblem]) -> TokenBatch:
    """Prompt = question, completion = reference solution + EOS (SFT's trained tokens, and the
    sequence whose probability :func:`sampling_accuracy` takes)."""
    pairs = [chat.sft_example(p.question, p.solution) for p in problems]
    return make_batch([p for p, _ in pairs], [c for _, c in pairs], chat.tokenizer.pad_token_id)


def sampling_accuracy(policy: PolicyInterface, batch: TokenBatch) -> float:
    """Mean over rows of the probability that the policy samples exactly the row's completion.

    Per row ``exp(sum_t log pi(y_t | x, y_<t))`` over the completion's tokens (the reference answer
    and EOS, ``batch.completion_mask``), under the policy's sampling distribution (the temperature,
    top-k and top-p the engine samples with: ``PolicyInterface.get_logprobs``), computed by teacher
    forcing: the expected exact-match reward of one sample, GRPO's objective (Shao et al. 2024,
    DeepSeekMath, eq. 3) with a 0/1 reward, without sampling noise. Other right answers (a
    differently written solution) count 0, so it is a lower bound of the sampled accuracy.
    Greedy accuracy is a step function of the logits: one evaluation to the next it moved by
    +-0.05 in a healthy run, and a machine's float kernels move it as much as a seed does.

    Args:
        batch: ``reference_batch(chat, problems)``; ``[B, L]`` rows.

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: ``batch`` has no rows (an accuracy over nothing would read as 0.0).
    """
    if batch.input_ids.shape[0] == 0:
        raise ValueError("sampling_accuracy needs at least one problem")
    logprobs = policy.get_logprobs(batch)  # [B, L] float32, 0 outside the completion
    per_row = torch.exp((logprobs * batch.completion_mask).sum(dim=1))
    return per_row.mean().item()
