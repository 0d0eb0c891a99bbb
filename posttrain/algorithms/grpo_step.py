"""One GRPO step's pieces, shared by the sync loop (:mod:`.grpo`) and the asynchronous one
(:mod:`.async_grpo`, its producer in :mod:`.rollout_producer`):

    generate_rollouts -> score_rollouts -> learn (advantages, kept rows, reference logprobs, train)

GRPO: Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath, arXiv:2402.03300).
Notation: N = P * G rollouts per step, B rows kept for training, L completion window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from posttrain.algorithms.advantages import compute_group_advantages, nonzero_variance_mask
from posttrain.algorithms.evaluation import greedy_accuracy, reference_batch, sampling_accuracy
from posttrain.algorithms.grpo_config import GRPOConfig, GRPOMasterConfig
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.runtime import Runtime
from posttrain.data.batch import TokenBatch, make_batch
from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem
from posttrain.environments.math_verifier import math_reward
from posttrain.errors import StaleWeightsError
from posttrain.models.generation.interfaces import Generation, SamplingParams
from posttrain.models.policy.interfaces import TrainResult
from posttrain.ops import masked_mean
from posttrain.rollouts.samples import RolloutSample
from posttrain.utils.timer import Timer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class Rollouts:
    """N = P * G sampled completions; the G completions of a prompt are contiguous."""

    problems: list[MathProblem]
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    generation_logprobs: list[list[float]]
    rewards: torch.Tensor  # [N] float32
    weight_version: int  # of the weights the engine sampled with


def generate_rollouts(engine: Generation, chat: ChatEncoder, problems: list[MathProblem], cfg: GRPOMasterConfig,
                      step: int) -> Rollouts:
    """Sample G completions per problem with ``engine``'s current weights; the sampling seed
    is a function of ``(grpo.seed, step)``, so step ``step``'s samples do not depend on who
    asks for them (the synchronous loop or the asynchronous producer) or when."""
    g = cfg.grpo.completions_per_prompt
    repeated = [p for p in problems for _ in range(g)]
    prompt_ids = [list(chat.prompt(p.question)) for p in repeated]
    gen = cfg.generation
    params = SamplingParams(max_new_tokens=gen.max_new_tokens, temperature=gen.temperature, top_p=gen.top_p,
                            top_k=gen.top_k, seed=cfg.grpo.seed * 100_003 + step)
    out = engine.generate(prompt_ids, params)
    return Rollouts(repeated, prompt_ids, out.completion_ids, out.logprobs, torch.zeros(len(repeated)),
                    out.weight_version)


def to_samples(rollouts: Rollouts, batch_index: int, completions_per_prompt: int) -> list[RolloutSample]:
    """The N = P * G rollouts of step ``batch_index`` as tagged samples (see ``RolloutSample``):
    ``sample_id = (batch_index - 1) * N + row``, ``group_id = (batch_index - 1) * P + row // G``.

    Args:
        rollouts: one step's, scored.
    """
    n = len(rollouts.completion_ids)
    p = n // completions_per_prompt
    return [
        RolloutSample(sample_id=(batch_index - 1) * n + i, group_id=(batch_index - 1) * p + i // completions_per_prompt,
                      weight_version=rollouts.weight_version, seq_len=len(prompt) + len(completion),
                      batch_index=batch_index, prompt_ids=list(prompt), completion_ids=list(completion),
                      generation_logprobs=list(logprobs), reward=float(reward), question=problem.question,
                      answer=problem.answer)
        for i, (problem, prompt, completion, logprobs, reward) in enumerate(zip(
            rollouts.problems, rollouts.prompt_ids, rollouts.completion_ids, rollouts.generation_logprobs,
            rollouts.rewards.tolist(), strict=True))
    ]


def to_rollouts(samples: list[RolloutSample]) -> Rollouts:
    """The samples (whole groups, contiguous) as the synchronous loop's ``Rollouts``; its
    ``weight_version`` is the oldest sample's."""
    return Rollouts(
        problems=[MathProblem(s["question"], s["answer"], s["answer"]) for s in samples],
        prompt_ids=[s["prompt_ids"] for s in samples], completion_ids=[s["completion_ids"] for s in samples],
        generation_logprobs=[s["generation_logprobs"] for s in samples],
        rewards=torch.tensor([s["reward"] for s in samples], dtype=torch.float32),
        weight_version=min(s["weight_version"] for s in samples))


def check_on_policy(rollouts: Rollouts, trainer_version: int, step: int) -> None:
    """The rollouts must come from the weights being trained (this loop is on-policy).

    Raises:
        StaleWeightsError: the engine reports another weight version than the trainer's: its
            samples would be trained on as if the current policy had drawn them.
    """
    if rollouts.weight_version != trainer_version:
        raise StaleWeightsError(f"step {step}: rollouts were sampled with weight version {rollouts.weight_version}, "
                                f"the trainer is at {trainer_version} (stale engine: off-policy samples)")


def score_rollouts(tokenizer: PreTrainedTokenizerBase, rollouts: Rollouts) -> None:
    """Fill ``rollouts.rewards`` with the verifier's 1.0 / 0.0 per completion."""
    texts = tokenizer.batch_decode(rollouts.completion_ids, skip_special_tokens=True)
    rollouts.rewards = torch.tensor([math_reward(t, p.answer) for t, p in zip(texts, rollouts.problems, strict=True)])


def select_rows(rollouts: Rollouts, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages ``[N]``, bool keep ``[N]``): which rollouts carry a learning signal.

    Groups with zero reward variance are dropped when configured; if that drops every
    group the whole batch is kept (its advantages are all zero, only the KL term acts).
    """
    advantages = compute_group_advantages(rollouts.rewards, cfg.completions_per_prompt, cfg.advantage_estimator)
    keep = torch.ones_like(rollouts.rewards, dtype=torch.bool)
    if cfg.drop_zero_variance_groups:
        varied = nonzero_variance_mask(rollouts.rewards, cfg.completions_per_prompt)
        keep = varied if varied.any() else keep
    return advantages, keep


def to_train_batch(rollouts: Rollouts, keep: torch.Tensor, pad_id: int) -> tuple[TokenBatch, torch.Tensor]:
    """The kept rollouts as a padded batch, and the engine's logprobs aligned to it ``[B, L]``."""
    rows = keep.nonzero().squeeze(-1).tolist()
    batch = make_batch([rollouts.prompt_ids[i] for i in rows], [rollouts.completion_ids[i] for i in rows], pad_id)
    width = batch.completion_mask.shape[1]
    lens = batch.completion_lens.tolist()
    gen_logprobs = torch.tensor([[*rollouts.generation_logprobs[i][:n], *([0.0] * (width - n))]
                                 for i, n in zip(rows, lens, strict=True)], dtype=torch.float32)
    return batch, gen_logprobs


def rollout_metrics(rollouts: Rollouts, cfg: GRPOConfig) -> dict[str, float]:
    """Reward and sampling statistics of one step (before any row is dropped).

    ``train/fraction_groups_kept`` is the fraction of prompt groups with non-zero reward
    variance, the groups that carry a policy-gradient signal; it reads 0 when no group does
    (even though the loop then trains on the whole batch, see :func:`select_rows`).
    """
    varied = nonzero_variance_mask(rollouts.rewards, cfg.completions_per_prompt)
    lengths = torch.tensor([len(c) for c in rollouts.completion_ids], dtype=torch.float32)
    reward = rollouts.rewards.float()
    return {
        "train/reward_mean": reward.mean().item(),
        "train/accuracy": (reward == 1.0).float().mean().item(),
        "train/completion_length": lengths.mean().item(),
        "train/fraction_groups_kept": varied.view(-1, cfg.completions_per_prompt)[:, 0].float().mean().item(),
    }


def token_mult_prob_error(gen_logprobs: torch.Tensor, train_logprobs: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over tokens of ``exp(|logp_engine - logp_trainer|)``; 1.0 means they agree exactly.

    Both sides must score the same weights (the engine was refit from this trainer state).
    A value well above 1 means generation and training disagree: a broken refit, a
    temperature mismatch, or misaligned logprobs.
    """
    return masked_mean(torch.exp((gen_logprobs - train_logprobs).abs()), mask).item()


def validate(rt: Runtime, val: list[MathProblem], cfg: GRPOMasterConfig) -> dict[str, float]:
    """``val/accuracy``: the engine's greedy accuracy on ``val``; ``val/sampling_accuracy``: the
    policy's probability of sampling each reference answer, averaged (``sampling_accuracy``: smooth
    in the weights, where greedy accuracy jumps; the functional tests judge the run's gain on it)."""
    return {"val/accuracy": greedy_accuracy(rt.engine, rt.chat, val, cfg.generation.max_new_tokens),
            "val/sampling_accuracy": sampling_accuracy(rt.policy, reference_batch(rt.chat, val))}


def learn(rt: Runtime, rollouts: Rollouts, cfg: GRPOMasterConfig, loss_fn: ClippedPGLoss, timer: Timer,
          trainer_version: int, off_policy: bool = False) -> tuple[dict[str, float], TrainResult]:
    """One policy update from scored rollouts: advantages, the kept rows, (when ``kl_coef``
    > 0) reference logprobs, the train call; returns the step's ``train/*`` metrics and the
    train call's :class:`TrainResult` (its peak memory goes to ``Runtime.resource_metrics``).

    The old logprobs (the trainer's, of the weights the update starts from) are scored by the
    worker inside the train call (``PolicyWorkerBase.train``): from the train forward itself
    when the call is one optimizer step, so an on-policy step scores its batch once.

    Args:
        trainer_version: the policy's weight version before this update.
        off_policy: the rollouts may come from older weights (asynchronous GRPO): the PPO
            ratio is taken against the engine's (behaviour) logprobs, or, with the loss's
            ``importance_weight_cap``, against the trainer's old logprobs times the truncated
            weight (see :class:`ClippedPGLoss`). ``train/token_mult_prob_error`` is reported
            only when every row was sampled by the trainer's current weights (otherwise the
            two sides score different weights and the number means nothing).
    """
    with timer.time("advantages"):  # the rewards were scored before ("reward"), by the caller
        advantages, keep = select_rows(rollouts, cfg.grpo)
        batch, gen_logprobs = to_train_batch(rollouts, keep, rt.tokenizer.pad_token_id)
    extra = {"advantages": advantages[keep]}
    if loss_fn.kl_coef > 0:
        # The reference policy only enters the loss through the KL term: at kl_coef 0 it is
        # not scored at all (and train/kl is not logged), as in TRL and verl.
        with timer.time("logprobs"):
            extra["ref_logprobs"] = rt.policy.get_logprobs(batch, reference=True)
    if off_policy and loss_fn.importance_weight_cap is not None:
        extra["behaviour_logprobs"] = gen_logprobs
    elif off_policy:
        extra["old_logprobs"] = gen_logprobs
    with timer.time("train"):
        trained = rt.policy.train(batch, extra, loss_fn)
    metrics = {f"train/{k}": v for k, v in trained.metrics.items()}
    metrics.update(rollout_metrics(rollouts, cfg.grpo))
    if rollouts.weight_version == trainer_version:
        if trained.old_logprobs is None:
            raise RuntimeError("the policy's train call reported no old logprobs (its loss reads them)")
        metrics["train/token_mult_prob_error"] = token_mult_prob_error(gen_logprobs, trained.old_logprobs,
                                                                       batch.completion_mask)
    return metrics, trained
