"""Data-parallel splits: a list shared out over workers in contiguous, order-keeping shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def contiguous_shards(items: Sequence[T], n: int) -> list[list[T]]:
    """``n`` contiguous shards of ``items``, sizes differing by at most one, in order
    (a shard is empty when there are fewer items than shards)."""
    bounds = [len(items) * r // n for r in range(n + 1)]
    return [list(items[bounds[r]:bounds[r + 1]]) for r in range(n)]


def global_batch_shards(num_rows: int, global_batch: int, n: int) -> list[tuple[list[int], list[int]]]:
    """Each of ``n`` data-parallel ranks' share of ``num_rows`` rows trained in global batches of
    ``global_batch`` rows (one optimizer step each): ``(its row indices, its rows in each global
    batch)``. Every global batch is split in ``n`` contiguous parts (:func:`contiguous_shards`),
    rank r taking the r-th; a part is empty when a global batch has fewer rows than ranks.

    Raises:
        ValueError: ``global_batch`` or ``n`` below 1.
    """
    if global_batch < 1 or n < 1:
        raise ValueError(f"global_batch={global_batch} and n={n} must be >= 1")
    shares: list[tuple[list[int], list[int]]] = [([], []) for _ in range(n)]
    for start in range(0, num_rows, global_batch):
        parts = contiguous_shards(range(start, min(start + global_batch, num_rows)), n)
        for (rows, per_step), part in zip(shares, parts, strict=True):
            rows.extend(part)
            per_step.append(len(part))
    return shares
