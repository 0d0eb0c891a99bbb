"""``grpo_step.learn`` with off-policy rollouts: which logprobs the PPO ratio is taken against.

Asynchronous GRPO trains on samples drawn by older weights. The ratio must then use the
behaviour (engine) logprobs of the weights that drew them, or the trainer's old logprobs
with the behaviour logprobs handed to the truncated importance weight; a loop that quietly
keeps the trainer's logprobs trains stale samples as if they were fresh. A recording policy
isolates the loop's hand-over from the workers (the losses themselves are tested in
test_loss_functions.py, the whole path with real actors in tests/integration/test_async_grpo.py).
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from posttrain.algorithms import grpo, grpo_step
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.types import MathProblem
from posttrain.models.policy.interfaces import TrainResult
from posttrain.utils.timer import Timer

TRAINER_LOGPROB = -0.5


class RecordingPolicy:
    """Trainer logprobs are all ``TRAINER_LOGPROB`` (reference: -0.7), and so are the old
    logprobs a train call reports; ``train`` records its inputs, ``get_logprobs`` its questions."""

    def __init__(self) -> None:
        self.extra: dict[str, torch.Tensor] = {}
        self.asked: list[bool] = []  # the ``reference`` argument of each get_logprobs call

    def get_logprobs(self, batch, reference: bool = False) -> torch.Tensor:
        self.asked.append(reference)
        return torch.full(batch.completion_mask.shape, -0.7 if reference else TRAINER_LOGPROB)

    def train(self, batch, extra, loss_fn) -> TrainResult:
        self.extra = extra
        return TrainResult({"loss": 0.0}, 1, 0.5, torch.full(batch.completion_mask.shape, TRAINER_LOGPROB))


def rollouts(version: int) -> grpo_step.Rollouts:
    """2 groups of 2, rewards varied in each; completion i has logprobs -(i + 1) / 10 per token."""
    problem = MathProblem("1+1=", "2", "2")
    completions = [[5, 6], [7], [5], [6, 7, 8]]
    return grpo_step.Rollouts([problem] * 4, [[1, 2]] * 4, completions,
                              [[-(i + 1) / 10] * len(c) for i, c in enumerate(completions)],
                              torch.tensor([1.0, 0.0, 0.0, 1.0]), version)


def learn(loss_fn: ClippedPGLoss, off_policy: bool, version: int = 3, trainer_version: int = 4,
          policy: RecordingPolicy | None = None):
    policy = policy or RecordingPolicy()
    rt = SimpleNamespace(policy=policy, tokenizer=SimpleNamespace(pad_token_id=0))
    cfg = grpo.GRPOMasterConfig.model_validate({"grpo": {"num_prompts_per_step": 2, "completions_per_prompt": 2}})
    metrics, _ = grpo_step.learn(rt, rollouts(version), cfg, loss_fn, Timer(), trainer_version, off_policy=off_policy)
    return policy.extra, metrics


def behaviour(width: int) -> torch.Tensor:
    """The rollouts' engine logprobs as the padded ``[B, width]`` batch holds them (zeros after)."""
    rows = torch.tensor([[-0.1, -0.1, 0.0], [-0.2, 0.0, 0.0], [-0.3, 0.0, 0.0], [-0.4, -0.4, -0.4]])
    return torch.nn.functional.pad(rows, (0, width - 3))


def test_off_policy_ratio_is_taken_against_the_behaviour_logprobs() -> None:
    extra, _ = learn(ClippedPGLoss(), off_policy=True)
    assert torch.equal(extra["old_logprobs"], behaviour(extra["old_logprobs"].shape[1]))
    assert "behaviour_logprobs" not in extra


def test_with_a_cap_the_ratio_uses_the_trainer_and_the_weight_the_behaviour() -> None:
    """No old logprobs sent: the worker scores the trainer's own (PolicyWorkerBase.train)."""
    extra, _ = learn(ClippedPGLoss(importance_weight_cap=2.0), off_policy=True)
    assert "old_logprobs" not in extra
    assert torch.equal(extra["behaviour_logprobs"], behaviour(extra["behaviour_logprobs"].shape[1]))


def test_on_policy_leaves_the_old_logprobs_to_the_worker() -> None:
    """On-policy: neither behaviour nor old logprobs are sent (the worker scores the old ones
    in the train call, no separate pass is asked for), and the engine-trainer error compares
    the engine with the old logprobs the train call reported."""
    policy = RecordingPolicy()
    extra, metrics = learn(ClippedPGLoss(), off_policy=False, version=4, policy=policy)
    assert set(extra) == {"advantages"}
    assert policy.asked == []
    mask = behaviour(3) != 0
    expected = torch.exp((behaviour(3) - TRAINER_LOGPROB).abs())[mask].mean().item()
    assert metrics["train/token_mult_prob_error"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("version", "reported"), [(4, True), (3, False)])
def test_engine_trainer_agreement_is_reported_only_for_current_weights(version: int, reported: bool) -> None:
    _, metrics = learn(ClippedPGLoss(), off_policy=True, version=version)
    assert ("train/token_mult_prob_error" in metrics) is reported


@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_the_reference_is_scored_only_when_the_kl_term_needs_it(kl_coef: float) -> None:
    """kl_coef 0: the reference policy is never asked for (one call fewer, no KL metric);
    kl_coef > 0: its logprobs reach the loss."""
    policy = RecordingPolicy()
    extra, _ = learn(ClippedPGLoss(kl_coef=kl_coef), off_policy=False, version=4, policy=policy)
    assert policy.asked == ([True] if kl_coef > 0 else [])
    assert ("ref_logprobs" in extra) is (kl_coef > 0)
    if kl_coef > 0:
        assert torch.equal(extra["ref_logprobs"], torch.full_like(extra["ref_logprobs"], -0.7))


def test_a_train_call_that_reports_no_old_logprobs_stops_the_step() -> None:
    """The engine-trainer error needs the trainer's old logprobs: a policy that reports none
    (a worker that skipped scoring them) fails the step in one line, not a silently missing metric."""

    class Silent(RecordingPolicy):
        def train(self, batch, extra, loss_fn) -> TrainResult:
            return dataclasses.replace(super().train(batch, extra, loss_fn), old_logprobs=None)

    with pytest.raises(RuntimeError, match="reported no old logprobs"):
        learn(ClippedPGLoss(), off_policy=False, version=4, policy=Silent())


def test_learn_times_its_work_in_phases_of_its_own_never_the_scoring_phase() -> None:
    """The loops time the verifier's scoring as ``reward``; a learn call's work (the kept rows
    and advantages, the reference logprobs, the train call) has phases of its own, so
    ``timing/reward`` is the scoring alone: every phase is named once."""
    timer = Timer()
    rt = SimpleNamespace(policy=RecordingPolicy(), tokenizer=SimpleNamespace(pad_token_id=0))
    cfg = grpo.GRPOMasterConfig.model_validate({"grpo": {"num_prompts_per_step": 2, "completions_per_prompt": 2}})
    grpo_step.learn(rt, rollouts(4), cfg, ClippedPGLoss(kl_coef=0.1), timer, trainer_version=4)
    assert set(timer.pop()) == {"timing/advantages", "timing/logprobs", "timing/train"}
