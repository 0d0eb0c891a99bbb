"""GRPO learning behaviour on the tiny model, in-process on CPU (seconds each).

These tests drive the real pieces a GRPO step is made of: rollout grouping and scoring
(``posttrain.algorithms.grpo``), group advantages, the clipped policy-gradient loss, and the
policy worker's train step (``PolicyWorkerBase`` constructed directly: Ray adds nothing
here). Each checks a behaviour whose absence trains silently: the job runs, the loss prints,
nothing is learned. ``tests/mutation/`` breaks the library on purpose to prove they catch it.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from harness.policy_backends import BACKENDS, make_worker

from posttrain.algorithms import grpo, grpo_step
from posttrain.algorithms.advantages import compute_group_advantages
from posttrain.algorithms.loss_functions import ClippedPGLoss, kl_k3
from posttrain.data.batch import make_batch
from posttrain.data.chat import ChatEncoder
from posttrain.data.types import MathProblem
from posttrain.models.generation.interfaces import GenerationOutput
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase

QUESTION = "12+34="
COMPLETIONS = ["46", "47", "64", "4"]  # the first is right


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatEncoder(tokenizer)


def make_policy(backend: str, model_path: str, **policy) -> PolicyWorkerBase:
    """A fresh policy worker of ``backend`` (same seed, same start) with ``policy`` config overrides."""
    return make_worker(backend, model_path, **policy)


def group_batch(chat: ChatEncoder, completions: list[str] = COMPLETIONS, question: str = QUESTION):
    pairs = [chat.sft_example(question, c) for c in completions]
    return make_batch([p for p, _ in pairs], [c for _, c in pairs], chat.tokenizer.pad_token_id)


def sequence_logprobs(policy: PolicyWorkerBase, batch, reference: bool = False) -> torch.Tensor:
    """``[B]`` log-probability of each whole completion."""
    return (policy.get_logprobs(batch, reference=reference) * batch.completion_mask).sum(-1)


def train_call(policy: PolicyWorkerBase, batch, advantages: torch.Tensor, loss_fn: ClippedPGLoss,
              old_logprobs: torch.Tensor | None = None) -> dict[str, float]:
    """One GRPO train call as the loop makes it: reference logprobs first, then train, which
    scores the old logprobs itself (unless ``old_logprobs`` are given)."""
    extra = {"advantages": advantages, "ref_logprobs": policy.get_logprobs(batch, reference=True)}
    if old_logprobs is not None:
        extra["old_logprobs"] = old_logprobs
    return policy.train(batch, extra, loss_fn)


@pytest.mark.parametrize("backend", BACKENDS)
def test_high_reward_completion_gains_probability(backend, tiny_model_path, chat) -> None:
    policy = make_policy(backend, tiny_model_path, lr=1e-3)
    batch = group_batch(chat)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    before = sequence_logprobs(policy, batch)
    for _ in range(3):
        train_call(policy, batch, compute_group_advantages(rewards, group_size=4), ClippedPGLoss())
    change = sequence_logprobs(policy, batch) - before
    assert change[0] > 0.05, change
    assert (change[0] > change[1:]).all(), change
    if backend != "lora":  # a rank-8 update also lifts "64", which shares both digits with "46"
        assert (change[1:] < 0).all(), change
    # the rewarded completion gains probability relative to every other one
    assert torch.softmax(sequence_logprobs(policy, batch), 0)[0] > torch.softmax(before, 0)[0]


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("backend", BACKENDS)
def test_advantage_sign_sets_the_direction(backend, tiny_model_path, chat, sign: float) -> None:
    policy = make_policy(backend, tiny_model_path, lr=1e-3)
    batch = group_batch(chat, ["46"])
    before = sequence_logprobs(policy, batch)
    train_call(policy, batch, torch.tensor([sign]), ClippedPGLoss())
    change = (sequence_logprobs(policy, batch) - before).item()
    assert change * sign > 0.01, change


@pytest.mark.parametrize("backend", BACKENDS)
def test_first_update_reads_the_loss_and_ratio_at_one(backend, tiny_model_path, chat) -> None:
    """At the start of a step the trainer scores the very tokens ``get_logprobs`` scored (ratio
    exactly 1) and the loss is ``-sum(A * mask) / num_tokens`` over completion tokens only."""
    policy = make_policy(backend, tiny_model_path, lr=1e-3, train_micro_batch_size=2, train_global_batch_size=4)
    batch = group_batch(chat, ["46", "4", "123", "7"])  # completions of 3, 2, 4 and 2 tokens: padding
    assert batch.completion_mask.sum() < batch.completion_mask.numel()
    advantages = torch.tensor([1.5, -0.5, 0.25, -1.25])
    metrics = train_call(policy, batch, advantages, ClippedPGLoss())
    assert metrics["probs_ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["probs_ratio_max"] == pytest.approx(1.0, abs=1e-5)
    mask = batch.completion_mask
    expected = -(advantages[:, None] * mask).sum() / mask.sum()
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-5)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loss_and_gradients_stay_finite(backend, tiny_model_path, chat) -> None:
    """Extreme advantages, and garbage under the mask (padded engine logprobs can be anything)."""
    policy = make_policy(backend, tiny_model_path, lr=1e-2)
    batch = group_batch(chat, ["46", "4", "99999", "1"])
    advantages = torch.tensor([1e4, -1e4, 3.0, -3.0])  # extreme, as a near-zero-std group gives
    padding = batch.completion_mask == 0
    assert padding.any()
    for _ in range(5):
        old = policy.get_logprobs(batch).masked_fill(padding, -1e4)
        extra = {"advantages": advantages, "old_logprobs": old,
                 "ref_logprobs": policy.get_logprobs(batch, reference=True).masked_fill(padding, 1e4)}
        metrics = policy.train(batch, extra, ClippedPGLoss(kl_coef=0.5))
        for key in ("loss", "kl", "grad_norm", "entropy", "probs_ratio_min", "probs_ratio_max"):
            assert math.isfinite(metrics[key]), (key, metrics)
        assert metrics["grad_norm"] > 0
        assert metrics["skipped_optimizer_steps"] == 0
    assert all(torch.isfinite(p).all() for p in policy.model.parameters())


@pytest.mark.parametrize("backend", BACKENDS)
def test_learning_rate_sets_the_update_size(backend, tiny_model_path, chat) -> None:
    """Adam's first step moves each parameter by at most lr (|m / sqrt(v)| = 1), the largest by ~lr."""
    batch = group_batch(chat)
    for lr in (2e-5, 5e-3):
        policy = make_policy(backend, tiny_model_path, lr=lr, max_grad_norm=1e9)
        start = [p.detach().clone() for p in policy.model.parameters()]
        train_call(policy, batch, torch.tensor([1.5, -0.5, -0.5, -0.5]), ClippedPGLoss())
        moved = max((p.detach() - s).abs().max().item() for p, s in zip(policy.model.parameters(), start,
                                                                          strict=True))
        assert 0.5 * lr < moved <= 1.01 * lr, (lr, moved)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_policy_stays_frozen(backend, tiny_model_path, chat) -> None:
    policy = make_policy(backend, tiny_model_path, lr=1e-3)
    batch = group_batch(chat)
    initial = policy.get_logprobs(batch)
    for _ in range(2):
        train_call(policy, batch, torch.tensor([1.5, -0.5, -0.5, -0.5]), ClippedPGLoss())
    torch.testing.assert_close(policy.get_logprobs(batch, reference=True), initial)
    assert (policy.get_logprobs(batch) - initial).abs().max() > 1e-3


def policy_kl(policy: PolicyWorkerBase, batch) -> float:
    """Token-mean k3 KL of the current policy from the reference on ``batch``'s completions."""
    kl = kl_k3(policy.get_logprobs(batch), policy.get_logprobs(batch, reference=True))
    return ((kl * batch.completion_mask).sum() / batch.completion_mask.sum()).item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_larger_kl_coefficient_stays_closer_to_the_reference(backend, tiny_model_path, chat) -> None:
    batch = group_batch(chat)
    advantages = torch.tensor([1.5, -0.5, -0.5, -0.5])
    kls = {}
    for kl_coef in (0.0, 2.0):
        policy = make_policy(backend, tiny_model_path, lr=3e-3)
        for _ in range(8):
            train_call(policy, batch, advantages, ClippedPGLoss(kl_coef=kl_coef))
        kls[kl_coef] = policy_kl(policy, batch)
    assert kls[0.0] > 0.01, kls
    assert kls[2.0] < 0.7 * kls[0.0], kls


@pytest.mark.parametrize("backend", BACKENDS)
def test_tokens_outside_the_clip_range_get_no_update(backend, tiny_model_path, chat) -> None:
    """Positive advantage and ratio already above 1 + eps: the clipped objective is flat there."""
    batch = group_batch(chat, ["46"])
    ratios = {}
    for clip_eps in (0.2, 1e6):
        policy = make_policy(backend, tiny_model_path, lr=1e-3)
        start = [p.detach().clone() for p in policy.model.parameters()]
        old = policy.get_logprobs(batch) - 0.5  # ratio exp(0.5) = 1.65 > 1.2 on every token
        metrics = train_call(policy, batch, torch.tensor([1.0]), ClippedPGLoss(clip_eps=clip_eps), old_logprobs=old)
        ratios[clip_eps] = metrics
        moved = max((p.detach() - s).abs().max().item() for p, s in zip(policy.model.parameters(), start,
                                                                          strict=True))
        if clip_eps == 0.2:
            assert metrics["clip_fraction"] == pytest.approx(1.0)
            assert moved == 0.0
        else:
            assert metrics["clip_fraction"] == 0.0
            assert moved > 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_clipping_limits_the_update_over_several_steps(backend, tiny_model_path, chat) -> None:
    """Several optimizer steps against one fixed ``old_logprobs`` (PPO epochs): with the clip
    the rewarded completion's probability ratio stops growing much past 1 + eps."""
    batch = group_batch(chat, ["46"])
    final = {}
    for clip_eps in (0.2, 1e6):
        policy = make_policy(backend, tiny_model_path, lr=3e-3)
        old = policy.get_logprobs(batch)
        for _ in range(8):
            train_call(policy, batch, torch.tensor([1.0]), ClippedPGLoss(clip_eps=clip_eps), old_logprobs=old)
        final[clip_eps] = math.exp((sequence_logprobs(policy, batch) - (old * batch.completion_mask).sum()).item())
    assert final[1e6] > 2.0 * final[0.2], final


class FakeEngine:
    """Answers each arithmetic prompt right or wrong by rollout index (``right(i)``)."""

    def __init__(self, tokenizer, right):
        self.tokenizer, self.right = tokenizer, right

    def generate(self, prompts, params):
        completions = []
        for i, prompt in enumerate(prompts):
            a, b = self.tokenizer.decode(prompt).rstrip("=").split("+")
            answer = int(a) + int(b) + (0 if self.right(i) else 1)
            completions.append(self.tokenizer.encode(str(answer)) + [self.tokenizer.eos_token_id])
        return GenerationOutput(completions, [[-1.0] * len(c) for c in completions], 0)


def fake_runtime(tokenizer, chat, right):
    return SimpleNamespace(engine=FakeEngine(tokenizer, right), tokenizer=tokenizer, chat=chat)


def grpo_cfg(num_prompts: int, group_size: int, **algo):
    return grpo.GRPOMasterConfig.model_validate(
        {"grpo": {"num_prompts_per_step": num_prompts, "completions_per_prompt": group_size, **algo}})


PROBLEMS = [MathProblem(f"{a}+{b}=", str(a + b), str(a + b)) for a, b in [(12, 34), (5, 7), (40, 40)]]


def test_rollouts_come_in_contiguous_groups_of_one_prompt(tokenizer, chat) -> None:
    cfg = grpo_cfg(3, 4)
    rollouts = grpo_step.generate_rollouts(FakeEngine(tokenizer, lambda i: True), chat, PROBLEMS, cfg, step=1)
    assert len(rollouts.problems) == len(rollouts.completion_ids) == len(rollouts.prompt_ids) == 3 * 4
    for g, problem in enumerate(PROBLEMS):
        assert rollouts.problems[4 * g: 4 * g + 4] == [problem] * 4
        assert all(tokenizer.decode(p) == problem.question for p in rollouts.prompt_ids[4 * g: 4 * g + 4])


def test_each_reward_is_judged_against_its_own_problem(tokenizer, chat) -> None:
    right = lambda i: i % 3 != 1  # noqa: E731 - a pattern that crosses group boundaries
    cfg = grpo_cfg(3, 4)
    rt = fake_runtime(tokenizer, chat, right)
    rollouts = grpo_step.generate_rollouts(rt.engine, rt.chat, PROBLEMS, cfg, step=1)
    grpo_step.score_rollouts(rt.tokenizer, rollouts)
    assert rollouts.rewards.tolist() == [1.0 if right(i) else 0.0 for i in range(12)]


def test_group_advantages_are_isolated_per_prompt(tokenizer, chat) -> None:
    cfg = grpo_cfg(3, 4, drop_zero_variance_groups=True)
    right = lambda i: i in (0, 5, 6, 8, 9, 10, 11)  # noqa: E731 - groups: 1/4, 2/4 and 4/4 right
    rt = fake_runtime(tokenizer, chat, right)
    rollouts = grpo_step.generate_rollouts(rt.engine, rt.chat, PROBLEMS, cfg, step=1)
    grpo_step.score_rollouts(rt.tokenizer, rollouts)
    advantages, keep = grpo_step.select_rows(rollouts, cfg.grpo)
    grouped = advantages.view(3, 4)
    torch.testing.assert_close(grouped.mean(1), torch.zeros(3), atol=1e-6, rtol=0)
    assert (grouped[:2].std(1) - 1).abs().max() < 1e-4  # unit std within each varied group
    assert grouped[2].abs().max() == 0  # all right: no signal, and the group is dropped
    assert keep.tolist() == [True] * 8 + [False] * 4
    # rewards of one group never move another group's advantages
    changed = rollouts.rewards.clone()
    changed[4:8] = torch.tensor([0.0, 0.0, 0.0, 1.0])
    moved = compute_group_advantages(changed, 4).view(3, 4)
    torch.testing.assert_close(moved[[0, 2]], grouped[[0, 2]])


def test_a_wrong_group_size_is_detected(tokenizer, chat) -> None:
    rewards = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0])
    with pytest.raises(ValueError, match="do not split into groups of 5"):
        compute_group_advantages(rewards, 5)
    # a size that divides the batch still misgroups: groups no longer have zero mean per prompt
    wrong = compute_group_advantages(rewards, 6).view(3, 4)
    assert wrong.mean(1).abs().max() > 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_dr_grpo_advantages_are_mean_centred_and_learn(backend, tiny_model_path, chat) -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0])
    dr = compute_group_advantages(rewards, 4, "dr_grpo")
    torch.testing.assert_close(dr, torch.tensor([0.25, 0.25, 0.25, -0.75]))
    std = compute_group_advantages(rewards, 4, "grpo")
    torch.testing.assert_close(std, dr / rewards.std(), atol=1e-5, rtol=1e-5)  # only the std division differs
    policy = make_policy(backend, tiny_model_path, lr=1e-3)
    batch = group_batch(chat, ["46", "46", "46", "4"])
    before = sequence_logprobs(policy, batch)
    train_call(policy, batch, dr, ClippedPGLoss())
    change = sequence_logprobs(policy, batch) - before
    assert change[0] > 0 and change[3] < 0, change
