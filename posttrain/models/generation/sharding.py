"""Data-parallel plumbing shared by the generation backends: split prompts over engines,
gather their outputs in order, and insist that every engine holds the same weights."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from posttrain.errors import StaleWeightsError
from posttrain.models.generation.interfaces import GenerationOutput, RefitReceipt

T = TypeVar("T")


def contiguous_shards(items: Sequence[T], n: int) -> list[list[T]]:
    """``n`` contiguous shards of ``items``, sizes differing by at most one, in order
    (a shard is empty when there are fewer items than shards)."""
    bounds = [len(items) * r // n for r in range(n + 1)]
    return [list(items[bounds[r]:bounds[r + 1]]) for r in range(n)]


def agreed_version(versions: Iterable[int], who: str) -> int:
    """The one weight version all engines report.

    Raises:
        StaleWeightsError: they disagree (a refit reached some engines and not others).
    """
    distinct = set(versions)
    if len(distinct) != 1:
        raise StaleWeightsError(f"{who} disagree on the weight version: {sorted(distinct)}")
    return distinct.pop()


def gather_outputs(outs: Sequence[GenerationOutput], who: str) -> GenerationOutput:
    """Concatenate per-shard outputs in shard order; the engines must agree on the weight version.

    Raises:
        StaleWeightsError: see :func:`agreed_version`.
    """
    return GenerationOutput(
        completion_ids=[c for o in outs for c in o.completion_ids],
        logprobs=[lp for o in outs for lp in o.logprobs],
        weight_version=agreed_version((o.weight_version for o in outs), who),
    )


def gather_receipts(receipts: Sequence[RefitReceipt], who: str) -> RefitReceipt:
    """The engines' answers to one refit as one receipt: the version they agree on, and the
    probe rows of every shard in shard order (None only when no engine was asked to probe).
    An engine that answers without its rows leaves the probe short: ``RefitProbe.measure``
    refuses that, rather than the driver asking the engines to score again.

    Raises:
        StaleWeightsError: the engines disagree on the version.
    """
    version = agreed_version((r.weight_version for r in receipts), who)
    if all(r.probe_logprobs is None for r in receipts):
        return RefitReceipt(version)
    return RefitReceipt(version, [row for r in receipts for row in r.probe_logprobs or []])
