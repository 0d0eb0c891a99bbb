"""What a refit carries back: the probe the engines score as they load, and their receipt.

An engine answers a refit in the same call as it loads (one exchange per engine): the weight
version it now holds, read back from the engine itself, and its scores of its shard of the
weight-sync probe. :func:`gather_receipts` turns the engines' answers into one receipt, and
:func:`agreed_version` refuses engines that disagree on their version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from posttrain.errors import StaleWeightsError


@dataclass(frozen=True)
class ProbeRequest:
    """The weight-sync probe's sequences, for the engines to score as soon as a refit has
    loaded (in the refit's own call, while the trainer scores its side).

    Attributes:
        prompts, completions: token ids per row, as ``Generation.score`` takes them.
        temperature: the sampling temperature the rows are scored at.
    """

    prompts: list[list[int]]
    completions: list[list[int]]
    temperature: float


@dataclass
class RefitReceipt:
    """What the engines answer to a refit.

    Attributes:
        weight_version: the version the engines hold after loading, read back from them (the
            label they stamp on completions), not the version they were sent.
        probe_logprobs: ``Generation.score`` of the :class:`ProbeRequest` under the new
            weights, per row; None when no probe was asked for.
    """

    weight_version: int
    probe_logprobs: list[list[float]] | None = None


class Scorer(Protocol):
    """What :func:`refit_receipt` asks of an engine worker."""

    def weight_version(self) -> int: ...

    def score(self, prompts: list[list[int]], completions: list[list[int]],
              temperature: float) -> list[list[float]]: ...


def refit_receipt(engine: Scorer, probe: ProbeRequest | None) -> RefitReceipt:
    """An engine worker's answer to a refit it has just loaded: its own ``weight_version()``
    and, with a ``probe``, its ``score`` of the probe's rows (no call for an empty shard)."""
    if probe is None:
        return RefitReceipt(engine.weight_version())
    rows = engine.score(probe.prompts, probe.completions, temperature=probe.temperature) if probe.prompts else []
    return RefitReceipt(engine.weight_version(), rows)


def agreed_version(versions: Iterable[int], who: str) -> int:
    """The one weight version all engines report.

    Raises:
        StaleWeightsError: they disagree (a refit reached some engines and not others).
    """
    distinct = set(versions)
    if len(distinct) != 1:
        raise StaleWeightsError(f"{who} disagree on the weight version: {sorted(distinct)}")
    return distinct.pop()


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
