"""Vacuity check: a rule that passes whatever the run did cannot catch anything.

A passing rule is evaluated again with the metrics it reads replaced by adversarial
stand-ins: values (all zeros, constant huge, constant hugely negative, reversed,
alternating noise, ramps up and down, a NaN) and structure (the last step missing, the
first half only, the first step only, a step the rule names missing, a middle step
missing, the metric absent). A rule that still passes on every stand-in is VACUOUS.

"Huge" is relative to the metric: ``HUGE_FACTOR`` (1e3) times its observed scale, the
largest of 1, its largest absolute value and its range (:func:`huge`). A bound no plausible
run of the metric reaches - ``max(data["train/loss"]) < 1e29`` for a loss of order 1 - is
therefore never crossed by a stand-in either, and the rule is VACUOUS: it could only catch
a value a thousand times beyond anything the run showed.

Three stand-ins are special: a NaN, the metric absent, and a run of one step already fail
every rule that reads them through some helper (a NaN, a missing key, ``slope`` of one
point). They count only when the rule itself says no (``all_finite`` finds the NaN;
``"m" in data`` is False; ``len(x) >= 2`` is False), so ``all_finite(...)`` and
``"train/loss" in data`` are sound while ``min(x) >= min(x)`` and ``abs(slope(x)) < 1e29``
stay vacuous. Stand-ins are
never empty (every rule fails on an empty metric anyway).

Stand-in values are clipped to the metric's known range (``METRIC_DOMAINS``): a clip
fraction is never negative, so ``min(data["train/clip_fraction"]) >= 0`` is vacuous.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.testing.rules.interpreter import Evaluation, evaluate
from posttrain.testing.rules.series import Series

HUGE_FACTOR = 1e3  # stand-in magnitude, in units of the metric's observed scale
MAX_NAMED_STEPS = 8  # steps a rule names, each tried missing on its own

# Known ranges of the metrics posttrain logs: (exact name or prefix ending in "/", low, high), each
# from the metric's definition (tests/unit/testing/rules/test_rule_domains.py derives them): fractions
# in [0, 1]; a mean of exp(|logp_engine - logp_trainer|) >= 1; norms, |differences|, exp(.), k3 KL,
# NLL, counts, seconds and GiB >= 0. Unlisted (train/loss, train/reward_mean): of any sign.
# fmt: off
METRIC_DOMAINS: tuple[tuple[str, float, float], ...] = (
    ("train/accuracy", 0.0, 1.0), ("train/clip_fraction", 0.0, 1.0),
    ("train/fraction_groups_kept", 0.0, 1.0), ("val/accuracy", 0.0, 1.0), ("val/sampling_accuracy", 0.0, 1.0),
    ("async/dropped_fraction", 0.0, 1.0),
    ("train/grad_norm", 0.0, math.inf), ("train/entropy", 0.0, math.inf),
    ("train/kl", 0.0, math.inf), ("train/lr", 0.0, math.inf),
    ("train/completion_length", 0.0, math.inf), ("train/num_optimizer_steps", 0.0, math.inf),
    ("train/skipped_optimizer_steps", 0.0, math.inf), ("train/probs_ratio_min", 0.0, math.inf),
    ("train/probs_ratio_max", 0.0, math.inf), ("train/importance_weight", 0.0, math.inf),
    ("train/token_mult_prob_error", 1.0, math.inf), ("train/refit_token_mult_prob_error", 1.0, math.inf),
    ("train/refit_logprob_error", 0.0, math.inf),
    ("val/loss", 0.0, math.inf), ("timing/", 0.0, math.inf), ("memory/", 0.0, math.inf),
    ("async/", 0.0, math.inf),  # staleness (versions), samples dropped, buffer size, overlap seconds
    ("placement/", 0.0, math.inf),  # node counts and node numbers (0: policy rank 0's node)
)
# fmt: on


@dataclass(frozen=True)
class StandIn:
    """Replacement metrics for one re-evaluation (None: the metric is removed).

    ``universal``: the engine fails every reader of this stand-in (NaN, metric absent);
    only a verdict of the rule itself counts as catching it.
    """

    name: str
    replace: Mapping[str, Series | float | None]
    universal: bool = False


@dataclass(frozen=True)
class Vacuity:
    """The decision: ``vacuous`` and why (``reason``), after ``tried`` stand-ins."""

    vacuous: bool
    reason: str
    tried: int


def domain(metric: str) -> tuple[float, float]:
    """The range a metric's values can take (``(-inf, inf)`` when unknown)."""
    for name, low, high in METRIC_DOMAINS:
        if metric == name or (name.endswith("/") and metric.startswith(name)):
            return low, high
    return -math.inf, math.inf


def huge(real: Series | float) -> float:
    """The stand-ins' magnitude for a metric: ``HUGE_FACTOR`` x max(1, largest |value|,
    largest - smallest) over its finite real values (1 when it has none)."""
    values = [v for v in (real.step_values if isinstance(real, Series) else [real]) if math.isfinite(v)]
    spread = max(values) - min(values) if values else 0.0
    return HUGE_FACTOR * max([1.0, spread, *(abs(v) for v in values)])


def _ramp(n: int, big: float) -> list[float]:
    return [big * i / (n - 1) for i in range(n)] if n > 1 else [0.0]


# name -> values of the stand-in from the real values (same steps) and the metric's huge()
# fmt: off
VALUE_KINDS: dict[str, Callable[[Sequence[float], float], list[float]]] = {
    "zeros": lambda v, big: [0.0] * len(v),
    "constant huge": lambda v, big: [big] * len(v),
    "constant -huge": lambda v, big: [-big] * len(v),
    "reversed": lambda v, big: list(v)[::-1],
    "alternating +-huge": lambda v, big: [big if i % 2 else -big for i in range(len(v))],
    "ramp up": lambda v, big: _ramp(len(v), big),
    "ramp down": lambda v, big: _ramp(len(v), big)[::-1],
}
# fmt: on
_NUMBER_KINDS = ("zeros", "constant huge", "constant -huge")


def _clipped(values: list[float], metric: str) -> list[float]:
    low, high = domain(metric)
    if low == -math.inf and high == math.inf:
        return values
    return [min(max(v, low), high) for v in values]


def _value_stand_in(kind: str, metric: str, real: Series | float) -> Series | float | None:
    """The ``kind`` stand-in for one metric, clipped to its domain; None when it does not apply."""
    if not isinstance(real, Series):  # a plain number
        return _clipped(VALUE_KINDS[kind]([real], huge(real)), metric)[0] if kind in _NUMBER_KINDS else None
    return Series(real.steps, _clipped(VALUE_KINDS[kind](real.step_values, huge(real)), metric))


def _nan_stand_in(real: Series | float) -> Series | float:
    if not isinstance(real, Series):  # a plain number
        return math.nan
    values = list(real.step_values)
    values[len(values) // 2] = math.nan
    return Series(real.steps, values)


def _without(real: Series, drop: set[int]) -> Series:
    pairs = [(s, v) for s, v in zip(real.steps, real.step_values, strict=True) if s not in drop]
    return Series([s for s, _ in pairs], [v for _, v in pairs])


def _structure_stand_ins(metric: str, real: Series, named: frozenset[str]) -> Iterator[StandIn]:
    """Shorter runs and missing steps of one metric (never empty)."""
    steps, n = real.steps, len(real.steps)
    if n < 2:
        return

    def shorter(name: str, series: Series) -> StandIn:
        # universal when one step is left: a one-step series makes every two-point helper (slope)
        # raise, whatever the rule says, so only the rule's own verdict counts (``len(x) >= 2`` says
        # no to it itself). Not only "first step only": a 2-step run's "last step missing" is one step too.
        return StandIn(f"{metric}: {name}", {metric: series}, universal=len(series) < 2)

    yield shorter("last step missing", Series(steps[:-1], real.step_values[:-1]))
    yield shorter("first half only", Series(steps[: n // 2], real.step_values[: n // 2]))
    yield shorter("first step only", Series(steps[:1], real.step_values[:1]))
    # A step the rule names, missing: the rule's own lookup failing is what these stand-ins test.
    named_steps = sorted(int(k) for k in named if k.isdigit() and k in real)
    for step in named_steps[:MAX_NAMED_STEPS]:
        yield StandIn(f"{metric}: step {step} missing", {metric: _without(real, {step})})
    if len(named_steps) > 1 and len(named_steps) < n:
        yield StandIn(f"{metric}: named steps missing", {metric: _without(real, set(named_steps))})
    if not named_steps:
        yield shorter("a middle step missing", _without(real, {steps[n // 2]}))


def _value_stand_ins(data: Mapping[str, Any], metrics: list[str], kinds: Sequence[str]) -> Iterator[StandIn]:
    """Value stand-ins of ``kinds`` for all ``metrics`` at once, then (if several) each alone."""
    groups = [metrics] + ([[m] for m in metrics] if len(metrics) > 1 else [])
    for kind in kinds:
        for group in groups:
            replace = {m: _value_stand_in(kind, m, data[m]) for m in group}
            if all(r is not None for r in replace.values()):
                yield StandIn(f"{kind} ({', '.join(group)})", replace)


def stand_ins(data: Mapping[str, Any], reads: Mapping[str, frozenset[str]]) -> Iterator[StandIn]:
    """Every stand-in for a rule that read ``reads``, the likeliest to make it fail first.

    Constants first (they catch most sound rules), then a NaN per metric (what
    ``all_finite`` catches), the other value stand-ins, structure stand-ins one metric at
    a time, and last each metric absent.
    """
    metrics = sorted(m for m in reads if m in data)
    yield from _value_stand_ins(data, metrics, _NUMBER_KINDS)
    for metric in metrics:
        yield StandIn(f"NaN ({metric})", {metric: _nan_stand_in(data[metric])}, universal=True)
    yield from _value_stand_ins(data, metrics, [k for k in VALUE_KINDS if k not in _NUMBER_KINDS])
    for metric in metrics:
        if isinstance(data[metric], Series):
            yield from _structure_stand_ins(metric, data[metric], reads[metric])
    for metric in metrics:
        yield StandIn(f"{metric} absent", {metric: None}, universal=True)


def _with(data: Mapping[str, Any], stand_in: StandIn) -> dict[str, Any]:
    replaced = {**data, **stand_in.replace}
    return {k: v for k, v in replaced.items() if v is not None}


def caught(evaluation: Evaluation, stand_in: StandIn) -> bool:
    """Whether the rule failed on a stand-in in a way that counts (see the module docstring)."""
    if evaluation.passed:
        return False
    return evaluation.judged if stand_in.universal else True


def check_vacuity(data: Mapping[str, Any], tree: ast.Expression, reads: Mapping[str, frozenset[str]]) -> Vacuity:
    """Re-evaluate a passing rule on stand-ins until one makes it fail.

    Args:
        data: metric -> Series / number (the real run).
        tree: the compiled rule.
        reads: what the rule read when it passed on ``data`` (``Evaluation.reads``).

    Returns:
        Not vacuous with the first stand-in that made the rule fail; vacuous when none
        did, or when the rule reads no metric at all.
    """
    if not any(m in data for m in reads):
        return Vacuity(True, "reads no metric, so no run can make it fail", 0)
    tried = 0
    for stand_in in stand_ins(data, reads):
        tried += 1
        if caught(evaluate(_with(data, stand_in), tree), stand_in):
            return Vacuity(False, f"fails on stand-in: {stand_in.name}", tried)
    metrics = ", ".join(sorted(m for m in reads if m in data))
    reason = (
        f"passes on all {tried} stand-ins for {metrics} (zeros, +-{HUGE_FACTOR:g} x the observed scale, "
        "reversed, noise, ramps, NaN, missing steps, shorter runs): cannot catch a broken run"
    )
    return Vacuity(True, reason, tried)
