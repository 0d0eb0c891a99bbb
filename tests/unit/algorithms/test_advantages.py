"""Tests for posttrain.algorithms.advantages: group-relative advantages of GRPO / Dr. GRPO.

Normalizing over the whole batch instead of per group, or grouping with the wrong G, still
gives zero-mean, unit-scale advantages and a loss that prints; only the per-group checks
below tell the difference.
"""

import math
import statistics

import pytest
import torch

from posttrain.algorithms.advantages import compute_group_advantages, nonzero_variance_mask


def _hand_grpo(rewards: list[float], group_size: int, eps: float = 1e-6) -> list[float]:
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        std = statistics.stdev(group)  # unbiased (n - 1)
        out += [(r - mean) / (std + eps) for r in group]
    return out


def _hand_dr_grpo(rewards: list[float], group_size: int) -> list[float]:
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        out += [r - mean for r in group]
    return out


def test_grpo_matches_hand_computation() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.25, 0.0, 2.0]
    got = compute_group_advantages(torch.tensor(rewards), group_size=4)
    assert got.shape == (12,) and got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(_hand_grpo(rewards, 4)))


def test_grpo_uses_the_unbiased_std_on_a_worked_example() -> None:
    # group [1, 0]: mean 0.5, unbiased std sqrt(0.5) (the biased one would be 0.5)
    got = compute_group_advantages(torch.tensor([1.0, 0.0]), group_size=2)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(got, torch.tensor([expected, -expected]))
    # group [1, 0, 0, 0]: mean 0.25, unbiased std 0.5
    got = compute_group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4)
    torch.testing.assert_close(got, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=1e-5)


def test_eps_is_added_to_the_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])  # unbiased std 0.5
    got = compute_group_advantages(rewards, 4, eps=0.5)
    torch.testing.assert_close(got, torch.tensor([0.75, -0.25, -0.25, -0.25]))


def test_groups_are_normalized_in_isolation() -> None:
    base = [1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0]
    changed = [1.0, 0.0, 0.0, 0.0, 30.0, -7.0, 0.5, 100.0]  # only group 2 changes
    a = compute_group_advantages(torch.tensor(base), 4)
    b = compute_group_advantages(torch.tensor(changed), 4)
    torch.testing.assert_close(a[:4], b[:4])
    assert not torch.allclose(a[4:], b[4:])
    # and the group's advantages equal those of the group alone
    torch.testing.assert_close(a[:4], compute_group_advantages(torch.tensor(base[:4]), 4))
    torch.testing.assert_close(a[4:], compute_group_advantages(torch.tensor(base[4:]), 4))


def test_each_group_has_zero_mean_and_unit_unbiased_std() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(6 * 8, generator=gen) + torch.arange(6).repeat_interleave(8) * 10  # groups far apart
    got = compute_group_advantages(rewards, 8).view(6, 8)
    torch.testing.assert_close(got.mean(dim=1), torch.zeros(6), atol=1e-5, rtol=0)
    torch.testing.assert_close(got.std(dim=1), torch.ones(6), atol=1e-4, rtol=0)


def test_groups_are_contiguous_not_strided() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])  # G=2: groups [1, 1] and [0, 0]
    assert torch.equal(compute_group_advantages(rewards, 2), torch.zeros(4))


@pytest.mark.parametrize(("n", "group_size"), [(10, 4), (7, 2), (3, 4)])
def test_rewards_not_divisible_by_the_group_size_raise(n: int, group_size: int) -> None:
    with pytest.raises(ValueError, match=f"groups of {group_size}"):
        compute_group_advantages(torch.zeros(n), group_size)
    with pytest.raises(ValueError, match=f"groups of {group_size}"):
        nonzero_variance_mask(torch.zeros(n), group_size)


@pytest.mark.parametrize("group_size", [0, -2])
def test_non_positive_group_size_raises(group_size: int) -> None:
    with pytest.raises(ValueError):
        compute_group_advantages(torch.zeros(4), group_size)


def test_rewards_must_be_flat() -> None:
    with pytest.raises(ValueError, match="1-D"):
        compute_group_advantages(torch.zeros(2, 4), 4)


def test_divisible_but_wrong_group_size_gives_different_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])  # 2 groups of 4
    right = compute_group_advantages(rewards, 4)
    for wrong_g in (2, 8):
        wrong = compute_group_advantages(rewards, wrong_g)
        assert not torch.allclose(right, wrong), wrong_g


def test_higher_reward_gets_higher_advantage() -> None:
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.3, 5.0, -1.0, 2.0, 0.0])
    for estimator in ("grpo", "dr_grpo"):
        adv = compute_group_advantages(rewards, 4, estimator).view(2, 4)
        for g in range(2):
            order_r = torch.argsort(rewards.view(2, 4)[g])
            order_a = torch.argsort(adv[g])
            assert torch.equal(order_r, order_a), estimator
        # above the group mean -> positive, below -> negative
        centered = rewards.view(2, 4) - rewards.view(2, 4).mean(1, keepdim=True)
        assert torch.equal(adv > 0, centered > 0)
    # the single correct answer of a group gets the only positive advantage
    adv = compute_group_advantages(torch.tensor([0.0, 0.0, 1.0, 0.0]), 4)
    assert adv[2] > 0 and (adv[[0, 1, 3]] < 0).all()


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo"])
def test_zero_variance_group_gives_zeros_not_nan(estimator: str) -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    got = compute_group_advantages(rewards, 4, estimator)
    assert torch.isfinite(got).all()
    assert torch.equal(got[:4], torch.zeros(4))
    assert not torch.equal(got[4:], torch.zeros(4))
    all_same = compute_group_advantages(torch.full((8,), 0.7), 4, estimator)
    assert torch.isfinite(all_same).all()
    torch.testing.assert_close(all_same, torch.zeros(8), atol=1e-6, rtol=0)


def test_group_size_one_gives_zeros_not_nan() -> None:
    got = compute_group_advantages(torch.tensor([1.0, 0.0, 0.5]), 1)
    assert torch.equal(got, torch.zeros(3))


def test_dr_grpo_is_mean_centred_without_std_division() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 3.0, 1.0, 2.0, 2.0]
    got = compute_group_advantages(torch.tensor(rewards), 4, "dr_grpo")
    torch.testing.assert_close(got, torch.tensor(_hand_dr_grpo(rewards, 4)))
    torch.testing.assert_close(got[:4], torch.tensor([0.75, -0.25, -0.25, -0.25]))
    # scaling the rewards scales dr_grpo advantages, but not grpo's
    torch.testing.assert_close(compute_group_advantages(torch.tensor(rewards) * 3, 4, "dr_grpo"), got * 3)
    grpo = compute_group_advantages(torch.tensor(rewards), 4, "grpo")
    scaled = compute_group_advantages(torch.tensor(rewards) * 3, 4, "grpo")
    torch.testing.assert_close(scaled, grpo, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, grpo)


def test_integer_rewards_are_accepted() -> None:
    got = compute_group_advantages(torch.tensor([1, 0, 0, 0]), 4)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("estimator", ["ppo", "GRPO", ""])
def test_unknown_estimator_raises(estimator: str) -> None:
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_group_advantages(torch.tensor([1.0, 0.0]), 2, estimator)  # type: ignore[arg-type]


def test_nonzero_variance_mask() -> None:
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0])
    got = nonzero_variance_mask(rewards, 4)
    assert got.dtype == torch.bool and got.shape == (16,)
    assert got.tolist() == [True] * 4 + [False] * 4 + [False] * 4 + [True] * 4


def test_nonzero_variance_mask_agrees_with_nonzero_advantages() -> None:
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 2, (10 * 4,), generator=gen).float()
    mask = nonzero_variance_mask(rewards, 4)
    adv = compute_group_advantages(rewards, 4)
    has_signal = (adv.view(10, 4) != 0).any(dim=1).repeat_interleave(4)
    assert torch.equal(mask, has_signal)
    assert mask.any() and not mask.all()  # the seed gives both kinds of group
