"""Tests for posttrain.data.sampler: new problems every step, each once per epoch, reproducibly."""

from __future__ import annotations

import pytest

from posttrain.data.sampler import EpochSampler
from posttrain.errors import ConfigError

POOL = [f"p{i}" for i in range(23)]  # 23 = 4 batches of 5 + 3 left over


def test_epoch_arithmetic_with_a_remainder() -> None:
    sampler = EpochSampler(POOL, 5, seed=0)
    assert sampler.steps_per_epoch == 4
    assert [sampler.epoch_of(s) for s in range(1, 10)] == [0, 0, 0, 0, 1, 1, 1, 1, 2]


def test_an_epoch_uses_each_problem_at_most_once_and_all_but_the_remainder() -> None:
    sampler = EpochSampler(POOL, 5, seed=0)
    for epoch in range(3):
        steps = range(1 + 4 * epoch, 5 + 4 * epoch)
        seen = [p for s in steps for p in sampler.batch(s)]
        assert len(seen) == len(set(seen)) == 20, epoch  # 23 - 23 % 5
        assert set(seen) <= set(POOL)


def test_every_step_gets_new_problems_and_batches_hold_no_repeats() -> None:
    sampler = EpochSampler(POOL, 5, seed=0)
    batches = [sampler.batch(s) for s in range(1, 13)]
    for step, (a, b) in enumerate(zip(batches, batches[1:], strict=False), start=1):
        assert a != b, step
        assert len(set(a)) == 5
    assert batches[0] != batches[4]  # epoch 1 starts in a new order


def test_each_epoch_has_its_own_order_and_the_left_out_problems_change() -> None:
    sampler = EpochSampler(POOL, 5, seed=0)
    left_out = [set(POOL) - {p for s in range(1 + 4 * e, 5 + 4 * e) for p in sampler.batch(s)} for e in range(4)]
    assert all(len(x) == 3 for x in left_out)
    assert len({frozenset(x) for x in left_out}) > 1  # not the same three problems every epoch


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    a, b, c = EpochSampler(POOL, 5, 7), EpochSampler(POOL, 5, 7), EpochSampler(POOL, 5, 8)
    assert [a.batch(s) for s in range(1, 9)] == [b.batch(s) for s in range(1, 9)]
    assert [a.batch(s) for s in range(1, 9)] != [c.batch(s) for s in range(1, 9)]


def test_a_step_gives_the_same_batch_whatever_was_asked_before() -> None:
    """Stateless in the step: a run resumed at step 7 uses the problems an uninterrupted run did."""
    walked = EpochSampler(POOL, 5, 3)
    in_order = [walked.batch(s) for s in range(1, 10)]
    fresh = EpochSampler(POOL, 5, 3)
    assert [fresh.batch(s) for s in (7, 2, 9, 1)] == [in_order[6], in_order[1], in_order[8], in_order[0]]


def test_a_batch_of_the_whole_pool_is_one_step_per_epoch() -> None:
    sampler = EpochSampler(POOL, 23, 0)
    assert sampler.steps_per_epoch == 1
    assert sorted(sampler.batch(1)) == sorted(POOL) == sorted(sampler.batch(2))
    assert sampler.batch(1) != sampler.batch(2)  # reshuffled


@pytest.mark.parametrize("batch_size", [0, 24])
def test_a_batch_size_the_pool_cannot_fill_is_a_config_error(batch_size: int) -> None:
    with pytest.raises(ConfigError, match=f"cannot draw {batch_size} distinct problems per step from a pool of 23"):
        EpochSampler(POOL, batch_size, 0)


def test_steps_count_from_one() -> None:
    with pytest.raises(ValueError, match="training steps count from 1, got step 0"):
        EpochSampler(POOL, 5, 0).batch(0)
