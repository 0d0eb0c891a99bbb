"""Filters the driver applies to claimed rollouts before training: which to keep, which to drop.

A filter splits a list of samples into (kept, dropped); GRPO groups go one way whole, since a
group's advantages are relative to its other members. Tags are checked, never guessed: a
missing or mistyped tag raises :class:`posttrain.errors.RolloutTagError`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable

from posttrain.errors import RolloutTagError
from posttrain.rollouts.samples import TAGS, RolloutSample


def describe(sample: object) -> str:
    """``"sample 17"``, or what there is to name a sample by when it has no usable sample_id."""
    sample_id = sample.get("sample_id") if isinstance(sample, dict) else None
    return f"sample {sample_id!r}" if sample_id is not None else f"a sample without a sample_id ({_short(sample)})"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_tags(sample: object, tags: Iterable[str] = TAGS) -> None:
    """Raise unless ``sample`` is a dict whose ``tags`` are all present and plain ints.

    Raises:
        RolloutTagError: not a dict, a tag missing, or a tag that is not an ``int`` (a bool,
            float, string or None included), naming the sample and the bad value.
    """
    if not isinstance(sample, dict):
        raise RolloutTagError(f"a rollout sample must be a dict, got {type(sample).__name__}: {_short(sample)}")
    for tag in tags:
        if tag not in sample:
            raise RolloutTagError(f"{describe(sample)} has no {tag!r} tag")
        value = sample[tag]
        if type(value) is not int:  # bool is an int subclass: True is not version 1
            raise RolloutTagError(f"{describe(sample)}: tag {tag!r} must be an int, "
                                  f"got {_short(value)} ({type(value).__name__})")


def _check_version(current_version: object) -> int:
    if type(current_version) is not int:
        raise ValueError(f"current_version must be an int, got {current_version!r} ({type(current_version).__name__})")
    return current_version


def staleness(sample: RolloutSample, current_version: int) -> int:
    """How many weight updates the trainer is ahead of the weights that drew ``sample``:
    ``current_version - weight_version`` (>= 0; 0 is on-policy). For ``async/staleness_*``.

    Raises:
        RolloutTagError: the sample's tags are missing or not ints, or its weight version is
            newer than ``current_version`` (a sample from the future is a bug).
        ValueError: ``current_version`` is not an int (a bool included).
    """
    current = _check_version(current_version)
    check_tags(sample)
    lag = current - sample["weight_version"]
    if lag < 0:
        raise RolloutTagError(f"{describe(sample)}: weight_version {sample['weight_version']} is newer than "
                              f"the trainer's version {current} (a sample from the future)")
    return lag


class RolloutFilter(ABC):
    """Splits samples into (kept, dropped); see :meth:`split`."""

    @abstractmethod
    def split(self, samples: list[RolloutSample],
              current_version: int) -> tuple[list[RolloutSample], list[RolloutSample]]:
        """Return ``(kept, dropped)``: every input sample in exactly one of them, each list in
        input order, made of fresh deep copies (mutating one never changes the input or the
        other list). ``current_version`` is the trainer's weight version now."""


class StalenessFilter(RolloutFilter):
    """Drops the GRPO groups drawn by weights more than ``max_staleness`` updates old.

    A group is kept when ``current_version - weight_version <= max_staleness`` (0 keeps only
    on-policy samples). Bounding staleness is how asynchronous RL keeps off-policy drift in
    check, e.g. AReaL (Fu et al., 2025, arXiv:2505.24298).

    Raises (from ``__init__``):
        ValueError: ``max_staleness`` negative or not an int (a bool included).
    """

    def __init__(self, max_staleness: int):
        if type(max_staleness) is not int or max_staleness < 0:
            raise ValueError(f"max_staleness must be an int >= 0, got {max_staleness!r}")
        self.max_staleness = max_staleness

    def split(self, samples: list[RolloutSample],
              current_version: int) -> tuple[list[RolloutSample], list[RolloutSample]]:
        """See :meth:`RolloutFilter.split`. Every sample is checked before anything is split.

        Raises:
            RolloutTagError: a tag missing or not an int, a sample from the future, or a group
                (same ``group_id``) whose samples carry different weight versions.
            ValueError: ``current_version`` is not an int (a bool included).
        """
        _check_version(current_version)
        group_version: dict[int, tuple[int, int]] = {}  # group_id -> (weight_version, first sample_id)
        for sample in samples:
            staleness(sample, current_version)
            seen = group_version.setdefault(sample["group_id"], (sample["weight_version"], sample["sample_id"]))
            if seen[0] != sample["weight_version"]:
                raise RolloutTagError(f"group {sample['group_id']} mixes weight versions: sample {seen[1]} has "
                                      f"{seen[0]}, sample {sample['sample_id']} has {sample['weight_version']}")
        kept: list[RolloutSample] = []
        dropped: list[RolloutSample] = []
        for sample in samples:
            stale = current_version - group_version[sample["group_id"]][0] > self.max_staleness
            (dropped if stale else kept).append(copy.deepcopy(sample))
        return kept, dropped
