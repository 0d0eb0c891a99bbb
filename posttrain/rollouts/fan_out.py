"""Fan-out of a training batch to the data-parallel ranks: whole GRPO groups, balanced by tokens."""

from __future__ import annotations

from posttrain.rollouts.filters import check_tags
from posttrain.rollouts.samples import RolloutSample


def shard_for_data_parallel(samples: list[RolloutSample], dp_size: int) -> list[list[RolloutSample]]:
    """Split ``samples`` into ``dp_size`` shards, one per data-parallel rank.

    Every sample lands in exactly one shard and a GRPO group (same ``group_id``) is never
    split. Shards are balanced by total ``seq_len`` (a rank's step time follows its tokens)
    with the longest-processing-time rule (Graham, 1969): groups by decreasing tokens, ties
    by first appearance, each onto the shard with the fewest tokens so far, ties to the
    lowest rank. Hence ``max - min`` shard tokens is at most the largest group's tokens.
    Deterministic; within a shard samples keep their input order. The samples are the input's
    objects, not copies.

    Args:
        samples: tagged samples (``group_id`` and ``seq_len`` are read).
        dp_size: number of shards, >= 1. More shards than groups is allowed: the extra
            shards are empty lists (a rank with nothing to train on this step).

    Returns:
        ``dp_size`` lists of samples.

    Raises:
        ValueError: ``dp_size`` not an int (a bool included) or < 1.
        RolloutTagError: a sample without an int ``sample_id``, ``group_id`` or ``seq_len``.
    """
    if type(dp_size) is not int or dp_size < 1:
        raise ValueError(f"dp_size must be an int >= 1, got {dp_size!r}")
    groups: dict[int, list[int]] = {}  # group_id -> indices into samples, in first-appearance order
    for i, sample in enumerate(samples):
        check_tags(sample, ("sample_id", "group_id", "seq_len"))
        groups.setdefault(sample["group_id"], []).append(i)
    tokens = {g: sum(samples[i]["seq_len"] for i in idx) for g, idx in groups.items()}
    loads = [0] * dp_size
    owner = [0] * len(samples)  # sample index -> shard
    for group in sorted(groups, key=lambda g: -tokens[g]):  # stable: ties keep first appearance
        shard = min(range(dp_size), key=lambda r: (loads[r], r))
        loads[shard] += tokens[group]
        for i in groups[group]:
            owner[i] = shard
    shards: list[list[RolloutSample]] = [[] for _ in range(dp_size)]
    for i, sample in enumerate(samples):
        shards[owner[i]].append(sample)
    return shards
