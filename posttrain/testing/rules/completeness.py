"""Run completeness (``--expect-steps N``): a run that ended early never passes.

A rule over the first 60 steps of a run that was meant to take 200 can pass while the job
crashed at step 60; with ``--expect-steps 200`` every rule fails with "run stopped at step
60 of 200", and a rule that reads a metric which stops before step 200 fails too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from posttrain.testing.rules.series import Series


@dataclass(frozen=True)
class Completeness:
    """Whether the data a rule reads reaches the expected step; ``message`` says where it stops."""

    complete: bool
    message: str = ""


def last_logged_step(data: Mapping[str, Any], metrics: Iterable[str] | None = None) -> int | None:
    """The last step of any step-series metric (of ``metrics`` when given), or None if there is none."""
    names = data if metrics is None else [m for m in metrics if m in data]
    last = [data[m].steps[-1] for m in names if isinstance(data[m], Series) and len(data[m])]
    return max(last) if last else None


def run_progress(data: Mapping[str, Any], metrics_read: Iterable[str], expect_steps: int) -> int | None:
    """The run's last logged step, as far as the completeness check needs it.

    The metrics the rules read are scanned first; only when they stop before
    ``expect_steps`` is every metric scanned (so the message names the run's real last
    step, and a complete run does not parse steps of metrics no rule reads).

    Args:
        data: metric -> Series / number.
        metrics_read: the union of the metrics the rules read.
        expect_steps: the step the run must reach.

    Returns:
        The last step, or None when no metric has a step.
    """
    last = last_logged_step(data, metrics_read)
    if last is None or last < expect_steps:
        last = last_logged_step(data)
    return last


def check_completeness(
    data: Mapping[str, Any], metrics_read: Iterable[str], expect_steps: int, run_last: int | None
) -> Completeness:
    """Decide whether the run, and each step metric a rule reads, reached step ``expect_steps``.

    Args:
        data: metric -> Series / number (numbers have no steps and are not checked).
        metrics_read: the metrics the rule read (absent ones are the rule's own failure).
        expect_steps: the step the run must reach (its ``num_steps``).
        run_last: the run's last logged step (:func:`run_progress`).

    Returns:
        Incomplete with "run stopped at step K of N" when the run stops before N (every
        rule gets this), or "'metric' stopped at step K of N" for a metric the rule reads
        that stops early; complete otherwise. Steps past N are allowed.
    """
    if run_last is None:
        return Completeness(False, f"run logged no steps (expected {expect_steps})")
    if run_last < expect_steps:
        return Completeness(False, f"run stopped at step {run_last} of {expect_steps}")
    for name in sorted(metrics_read):
        series = data.get(name)
        if isinstance(series, Series) and len(series) and series.steps[-1] < expect_steps:
            return Completeness(False, f"{name!r} stopped at step {series.steps[-1]} of {expect_steps}")
    return Completeness(True)
