"""Rollout samples for the tests of posttrain.rollouts: whole GRPO groups with every tag set."""

from __future__ import annotations

from posttrain.rollouts.samples import RolloutSample


def make_group(group_id: int, size: int = 4, version: int = 0, seq_len: int = 10,
               first_id: int | None = None) -> list[RolloutSample]:
    """Group ``group_id`` of ``size`` samples (ids ``first_id + j``, by default ``group_id * size + j``),
    drawn by weights ``version``; sample j has ``seq_len + j`` tokens, so groups of equal size and
    ``seq_len`` tie on tokens."""
    first = group_id * size if first_id is None else first_id
    return [RolloutSample(sample_id=first + j, group_id=group_id, weight_version=version,
                          seq_len=seq_len + j, batch_index=1, prompt_ids=[1, 2, 3],
                          completion_ids=[4, 5, j], generation_logprobs=[-0.5, -0.25, -1.0],
                          reward=float(j % 2), answer=str(group_id))
            for j in range(size)]


def groups_of(shapes: list[tuple[int, int]]) -> list[RolloutSample]:
    """Groups 0, 1, ... of ``(size, seq_len)`` each, sample ids consecutive over the whole list."""
    out: list[RolloutSample] = []
    for g, (size, seq_len) in enumerate(shapes):
        out += make_group(g, size=size, seq_len=seq_len, first_id=len(out))
    return out


def ids(samples: list[RolloutSample]) -> list[int]:
    return [s["sample_id"] for s in samples]
