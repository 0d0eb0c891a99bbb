"""The rollout buffer between the producer (generation) and the trainer of asynchronous GRPO.

One object, usable in-process (drive it with ``asyncio``) or as an asyncio actor (the loop
starts it through its transport: ``algorithms/async_actors.py``). Samples move unclaimed ->
claimed -> cleared (consumed or dropped); ``capacity`` bounds unclaimed + claimed, so a
producer far ahead of the trainer waits instead of piling up stale samples. Every method runs on one event loop with no
``await`` between a check and the mutation it guards, so each call is atomic: two consumers
never claim the same sample, and a call that raises changes nothing.

The producer puts whole GRPO groups (one group is never spread over two ``put`` calls), so
groups sit contiguous in put order and a claim can tell when it would split one.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from posttrain.errors import BufferTimeoutError, RolloutTagError
from posttrain.rollouts.filters import check_tags, describe
from posttrain.rollouts.samples import RolloutSample

Outcome = Literal["consumed", "dropped"]


@dataclass(frozen=True)
class BufferStatus:
    """A snapshot of a :class:`RolloutBuffer`: counts of samples by state, and the cleared ids."""

    unclaimed: int
    claimed: int
    consumed: int
    dropped: int
    put_total: int  # samples ever put
    claim_cursor: int  # samples ever claimed (the position of the next claim in put order)
    consumed_ids: frozenset[int]
    dropped_ids: frozenset[int]

    @property
    def size(self) -> int:
        """Samples held now (unclaimed + claimed), which ``capacity`` bounds."""
        return self.unclaimed + self.claimed


def check_capacity(capacity: object) -> int:
    """``capacity``, checked.

    Raises:
        ValueError: not an int >= 1.
    """
    if type(capacity) is not int or capacity < 1:
        raise ValueError(f"buffer capacity must be an int >= 1, got {capacity!r}")
    return capacity


async def _wait(cond: asyncio.Condition, ready: Callable[[], bool], timeout_s: float | None) -> bool:
    """Wait (holding ``cond``) until ``ready()``; False on timeout. ``cond`` is held again on return."""
    if ready():  # wait_for with timeout 0 would time out before even looking
        return True
    try:
        await asyncio.wait_for(cond.wait_for(ready), timeout_s)
    except TimeoutError:
        return False
    return True


class RolloutBuffer:
    """FIFO of rollout samples with exclusive claims, bounded by ``capacity`` samples held.

    Raises (from ``__init__``):
        ValueError: ``capacity`` not an int >= 1.
    """

    def __init__(self, capacity: int):
        self.capacity = check_capacity(capacity)
        self._cond = asyncio.Condition()
        self._unclaimed: deque[RolloutSample] = deque()
        self._claimed: dict[int, RolloutSample] = {}  # sample_id -> sample
        self._ids_put: set[int] = set()
        self._groups_put: set[int] = set()
        self._outcomes: dict[Outcome, set[int]] = {"consumed": set(), "dropped": set()}
        self._claim_cursor = 0

    def _size(self) -> int:
        return len(self._unclaimed) + len(self._claimed)

    def _check_new(self, samples: list[RolloutSample]) -> None:
        if len(samples) > self.capacity:
            raise ValueError(f"cannot put {len(samples)} samples into a buffer of capacity {self.capacity} "
                             "(it would wait forever)")
        ids: set[int] = set()
        groups: set[int] = set()
        for i, sample in enumerate(samples):
            check_tags(sample, ("sample_id", "group_id"))
            if sample["sample_id"] in self._ids_put or sample["sample_id"] in ids:
                raise RolloutTagError(f"{describe(sample)} was put before (sample ids must be unique)")
            group = sample["group_id"]
            if group in self._groups_put or (group in groups and samples[i - 1]["group_id"] != group):
                raise RolloutTagError(f"{describe(sample)}: group {group} is put in pieces "
                                      "(put each group whole, its samples together)")
            ids.add(sample["sample_id"])
            groups.add(group)

    async def put(self, samples: list[RolloutSample], timeout_s: float | None = 60.0) -> None:
        """Append ``samples`` (whole groups) at once, waiting while there is no room for all.

        Args:
            samples: samples whose groups are all in this call, each group's samples together.
            timeout_s: seconds to wait for room; None waits forever.

        Raises:
            BufferTimeoutError: no room within ``timeout_s``.
            ValueError: more samples than ``capacity``.
            RolloutTagError: a sample without an int ``sample_id``/``group_id``, a ``sample_id``
                put before (or twice here), or a group put before or not contiguous here.
        """
        self._check_new(samples)  # fail at once, not after the wait
        async with self._cond:
            if not await _wait(self._cond, lambda: self._size() + len(samples) <= self.capacity, timeout_s):
                raise BufferTimeoutError(
                    f"put of {len(samples)} samples timed out after {timeout_s} s: buffer holds {self._size()} of "
                    f"capacity {self.capacity} ({len(self._unclaimed)} unclaimed, {len(self._claimed)} claimed)")
            self._check_new(samples)  # again: another put may have taken these ids while we waited
            self._unclaimed.extend(copy.deepcopy(samples))  # the producer's later edits stay out
            self._ids_put.update(s["sample_id"] for s in samples)
            self._groups_put.update(s["group_id"] for s in samples)
            self._cond.notify_all()

    async def claim(self, n: int, timeout_s: float | None = 60.0) -> list[RolloutSample]:
        """Take the oldest ``n`` unclaimed samples (put order), exclusively, as copies.

        Args:
            n: exactly this many samples, made of whole groups.
            timeout_s: seconds to wait for ``n`` unclaimed samples; None waits forever.

        Raises:
            BufferTimeoutError: fewer than ``n`` unclaimed samples within ``timeout_s``.
            ValueError: ``n`` < 1 or > ``capacity`` (never satisfiable), or the oldest ``n``
                would split a group (``n`` is not a whole number of the groups in line).
        """
        if type(n) is not int or n < 1 or n > self.capacity:
            raise ValueError(f"claim size must be an int in [1, capacity {self.capacity}], got {n!r}")
        async with self._cond:
            if not await _wait(self._cond, lambda: len(self._unclaimed) >= n, timeout_s):
                raise BufferTimeoutError(f"claim of {n} samples timed out after {timeout_s} s: "
                                         f"{len(self._unclaimed)} unclaimed")
            if len(self._unclaimed) > n and self._unclaimed[n]["group_id"] == self._unclaimed[n - 1]["group_id"]:
                raise ValueError(f"claiming {n} samples would split group {self._unclaimed[n]['group_id']} "
                                 f"(at sample {self._unclaimed[n]['sample_id']}): claim whole groups")
            taken = [self._unclaimed.popleft() for _ in range(n)]
            self._claimed.update((s["sample_id"], s) for s in taken)
            self._claim_cursor += n
            return copy.deepcopy(taken)  # the consumer's edits stay out of the buffer

    async def clear(self, sample_ids: list[int], outcome: Outcome) -> None:
        """Remove claimed samples, recording them as ``outcome``; frees room for waiting puts.

        Raises:
            ValueError: ``outcome`` not "consumed" or "dropped", or an id not claimed now
                (unknown, unclaimed, already cleared, or twice in ``sample_ids``); then
                nothing is cleared.
        """
        if outcome not in self._outcomes:
            raise ValueError(f"clear outcome must be 'consumed' or 'dropped', got {outcome!r}")
        async with self._cond:  # check inside: acquiring may await, and another clear run meanwhile
            seen: set[int] = set()
            for sample_id in sample_ids:
                if sample_id not in self._claimed or sample_id in seen:
                    cleared = sample_id in seen or any(sample_id in ids for ids in self._outcomes.values())
                    state = "cleared already" if cleared else "unclaimed" if sample_id in self._ids_put else "never put"
                    raise ValueError(f"cannot clear sample {sample_id!r}: it is not claimed ({state})")
                seen.add(sample_id)
            for sample_id in sample_ids:
                del self._claimed[sample_id]
            self._outcomes[outcome].update(sample_ids)
            self._cond.notify_all()

    async def status(self) -> BufferStatus:
        """A snapshot of the counts (see :class:`BufferStatus`)."""
        return BufferStatus(unclaimed=len(self._unclaimed), claimed=len(self._claimed),
                            consumed=len(self._outcomes["consumed"]), dropped=len(self._outcomes["dropped"]),
                            put_total=len(self._ids_put), claim_cursor=self._claim_cursor,
                            consumed_ids=frozenset(self._outcomes["consumed"]),
                            dropped_ids=frozenset(self._outcomes["dropped"]))
