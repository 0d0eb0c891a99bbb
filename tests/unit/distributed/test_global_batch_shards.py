"""The data-parallel split of a train call (``distributed.sharding.global_batch_shards``): every
row to exactly one rank, each global batch split over the ranks in contiguous parts."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.distributed.sharding import global_batch_shards


def test_each_global_batch_is_split_in_contiguous_parts_rank_by_rank() -> None:
    assert global_batch_shards(7, 3, 2) == [([0, 3], [1, 1, 0]), ([1, 2, 4, 5, 6], [2, 2, 1])]  # rank 0 idles last
    assert global_batch_shards(4, 8, 2) == [([0, 1], [2]), ([2, 3], [2])]
    assert global_batch_shards(0, 8, 2) == [([], []), ([], [])]
    with pytest.raises(ValueError, match="global_batch=0 and n=2 must be >= 1"):
        global_batch_shards(4, 0, 2)


@given(st.integers(0, 200), st.integers(1, 40), st.integers(1, 8))
def test_every_row_goes_to_one_rank_and_every_rank_sees_every_optimizer_step(rows: int, gbs: int, n: int) -> None:
    shares = global_batch_shards(rows, gbs, n)
    assert sorted(r for share, _ in shares for r in share) == list(range(rows))
    steps = -(-rows // gbs)
    assert all(len(per_step) == steps for _, per_step in shares)  # the ranks step together
    for k in range(steps):
        sizes = [per_step[k] for _, per_step in shares]
        assert sum(sizes) == min(gbs, rows - k * gbs) and max(sizes) - min(sizes) <= 1
