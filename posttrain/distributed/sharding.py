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
