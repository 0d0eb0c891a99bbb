"""Tests for posttrain.rollouts.fan_out: sharding a batch over data-parallel ranks.

A lost or doubled group, or a group split over two ranks (its advantages then normalized
apart), still trains; only counting every sample_id and group per shard tells.
"""

from __future__ import annotations

from collections import Counter

import pytest
from unit.rollouts.rollout_helpers import groups_of, ids

from posttrain.errors import RolloutTagError
from posttrain.rollouts.fan_out import shard_for_data_parallel
from posttrain.rollouts.samples import RolloutSample


def _batch() -> list[RolloutSample]:
    """7 groups of uneven size and length: 4 x 10.., 2 x 50.., 8 x 3.., ..."""
    return groups_of([(4, 10), (2, 50), (8, 3), (4, 30), (1, 100), (4, 10), (3, 7)])


def _tokens(samples: list[RolloutSample]) -> int:
    return sum(s["seq_len"] for s in samples)


@pytest.mark.parametrize("dp_size", [1, 2, 3, 8, 20])  # 8 and 20: more shards than the 7 groups
def test_every_sample_in_exactly_one_shard_groups_whole_and_balanced(dp_size: int) -> None:
    batch = _batch()
    shards = shard_for_data_parallel(batch, dp_size)
    assert len(shards) == dp_size
    assert Counter(s["sample_id"] for shard in shards for s in shard) == Counter(ids(batch))
    owners: dict[int, set[int]] = {}
    for rank, shard in enumerate(shards):
        for s in shard:
            owners.setdefault(s["group_id"], set()).add(rank)
    assert all(len(ranks) == 1 for ranks in owners.values()), owners
    for shard in shards:  # input order within a shard
        assert ids(shard) == sorted(ids(shard))
    largest = max(_tokens([s for s in batch if s["group_id"] == g]) for g in owners)
    loads = [_tokens(shard) for shard in shards]
    assert max(loads) - min(loads) <= largest
    if dp_size > 7:
        assert sum(1 for shard in shards if shard) == 7  # one group per non-empty shard


def test_longest_processing_time_assignment_on_a_worked_example() -> None:
    # group tokens (make_group adds j to seq_len): 0 -> 10, 1 -> 40+6=46, 2 -> 10, 3 -> 20+1=21
    batch = groups_of([(1, 10), (4, 10), (1, 10), (2, 10)])

    def groups(dp_size: int) -> list[list[int]]:
        return [sorted({s["group_id"] for s in shard}) for shard in shard_for_data_parallel(batch, dp_size)]

    # 46 -> rank 0; 21 -> rank 1; 10 (group 0, first of the tie) -> rank 1 (21 < 46); 10 -> rank 1 (31 < 46)
    assert groups(2) == [[1], [0, 2, 3]]
    # ties among groups go by first appearance, ties among ranks to the lowest
    assert groups(4) == [[1], [3], [0], [2]]
    assert groups(5) == [[1], [3], [0], [2], []]


def test_sharding_is_deterministic() -> None:
    first = shard_for_data_parallel(_batch(), 3)
    for _ in range(3):
        assert [ids(shard) for shard in shard_for_data_parallel(_batch(), 3)] == [ids(shard) for shard in first]


def test_no_samples_gives_empty_shards() -> None:
    assert shard_for_data_parallel([], 3) == [[], [], []]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "2", None])
def test_bad_dp_size_raises(bad: object) -> None:
    with pytest.raises(ValueError, match="dp_size") as err:
        shard_for_data_parallel(_batch(), bad)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value) and "\n" not in str(err.value)


def test_a_sample_without_seq_len_raises() -> None:
    batch = _batch()
    del batch[3]["seq_len"]  # type: ignore[misc]
    with pytest.raises(RolloutTagError, match="sample 3 has no 'seq_len' tag"):
        shard_for_data_parallel(batch, 2)


def test_sharding_reads_only_the_ids_and_seq_len() -> None:
    # the weight version and the rest are the filters' business: fan-out needs only these three tags
    samples = [{"sample_id": i, "group_id": i // 2, "seq_len": 5} for i in range(4)]
    shards = shard_for_data_parallel(samples, 2)  # type: ignore[arg-type]
    assert [ids(s) for s in shards] == [[0, 1], [2, 3]]
