"""Drift of a functional script's metrics across its archived runs: ``functional-trend DIR``.

    functional-trend $POSTTRAIN_CACHE/functional_history/grpo [--history 10] [--k 4] [--metric val/accuracy ...]

``DIR`` is one script's archive (``tests/functional/common.sh`` writes it, keeping the newest
``$FUNCTIONAL_HISTORY_KEEP`` runs)::

    $POSTTRAIN_CACHE/functional_history/<script>/<UTC time YYYYmmddTHHMMSSZ>_<commit>/metrics.json
                                                                                  /check_report.json

Run directories sort by name, oldest first; the newest is the run judged, the up to ``--history``
runs before it whose rules all passed (check_report.json; a run without one counts) are its
history. For each metric (every ``train/*`` and ``val/*`` one by default) the tool compares:

* the final value: the mean of the last 10% of the metric's logged values (at least one);
* the curve: the mean over each of ``--windows`` equal step ranges of the newest run;
* each rule's value in check_report.json (``mean(acc, -1) - acc["0"]``: the gain the rule judged),

with the history's band ``median +- max(k * 1.4826 * MAD, floor, relative_floor * |median|)``
(MAD, the median absolute deviation, times 1.4826 estimates a normal standard deviation and is
not moved by one odd run; the floors keep a history of identical values from flagging rounding).
A value outside its band is flagged even when every rule passed: a run whose accuracy fell by
0.10 still clears a gain bound of 0.02, and only its history says it is worse than it was.

Exit status: 0 nothing flagged (or too little history to judge: said so), 1 something
flagged, 2 usage error (no such directory, no run in it, an unreadable file, a bad option).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROG = "functional-trend"
MAD_TO_STD = 1.4826  # 1 / Phi^-1(3/4): MAD * this estimates sigma for normal data


class UsageError(Exception):
    """Bad input: exit 2 with one line naming it."""


@dataclass(frozen=True)
class Run:
    """One archived run: its directory name (time_commit), metrics and rule rows."""

    name: str
    metrics: Mapping[str, Any]
    rules: Sequence[Mapping[str, Any]] | None

    @property
    def passed(self) -> bool:
        """Every rule PASS/WARN/SKIP (a run archived without check_report.json counts as passed)."""
        return self.rules is None or all(r.get("status") in ("PASS", "WARN", "SKIP") for r in self.rules)


@dataclass(frozen=True)
class Band:
    """The history's band of one quantity: ``centre +- half_width``."""

    centre: float
    half_width: float

    def contains(self, value: float) -> bool:
        """Whether ``value`` is inside the band (edges included)."""
        return abs(value - self.centre) <= self.half_width


@dataclass(frozen=True)
class Drift:
    """One quantity of the newest run: its value, the history's band, whether it is outside."""

    what: str
    value: float
    band: Band
    n_history: int

    @property
    def flagged(self) -> bool:
        """Outside the band."""
        return not self.band.contains(self.value)


def band_of(history: Sequence[float], k: float, floor: float, relative_floor: float) -> Band:
    """``median +- max(k * 1.4826 * MAD, floor, relative_floor * |median|)`` of ``history``.

    Raises:
        ValueError: an empty history.
    """
    if not history:
        raise ValueError("a band needs at least one historical value")
    centre = statistics.median(history)
    mad = statistics.median(abs(v - centre) for v in history)
    return Band(centre, max(k * MAD_TO_STD * mad, floor, relative_floor * abs(centre)))


def load_archive(directory: Path) -> list[Run]:
    """The runs archived in ``directory``, oldest first (directory names sort by UTC time).

    Raises:
        UsageError: no such directory, no run in it, or an unreadable / malformed file.
    """
    if not directory.is_dir():
        raise UsageError(f"no archive directory {directory}")
    runs = []
    for run_dir in sorted(p for p in directory.iterdir() if (p / "metrics.json").is_file()):
        try:
            metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
            report = run_dir / "check_report.json"
            rules = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"cannot read {run_dir}: {e}") from None
        if not isinstance(metrics, dict) or not (rules is None or isinstance(rules, list)):
            raise UsageError(f"{run_dir}: metrics.json is not an object or check_report.json not a list")
        runs.append(Run(run_dir.name, metrics, rules))
    if not runs:
        raise UsageError(f"no archived run (a subdirectory with metrics.json) in {directory}")
    return runs


def _points(series: Any) -> list[tuple[int, float]]:
    """``(step, value)`` of a metric's finite values, by step; [] for a plain number or junk."""
    if not isinstance(series, Mapping):
        return []
    points = []
    for step, value in series.items():
        try:
            step_number = int(step)
        except ValueError:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            points.append((step_number, float(value)))
    return sorted(points)


def final_value(series: Any) -> float | None:
    """The mean of the last 10% of the logged values (at least one); None when none is finite."""
    points = _points(series)
    if not points:
        return None
    last = max(1, round(len(points) / 10))
    return statistics.fmean(v for _, v in points[-last:])


def window_means(series: Any, edges: Sequence[float]) -> list[float | None]:
    """The mean of the values in each step range ``[edges[i], edges[i + 1])`` (the last range closed)."""
    points = _points(series)
    means: list[float | None] = []
    for i in range(len(edges) - 1):
        lo, hi = edges[i], edges[i + 1]
        inside = [v for s, v in points if lo <= s < hi or (i == len(edges) - 2 and s == hi)]
        means.append(statistics.fmean(inside) if inside else None)
    return means


def rule_values(run: Run) -> dict[str, float]:
    """rule text -> its numeric value in the run's check_report.json."""
    values = {}
    for row in run.rules or ():
        value = row.get("value")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            values[str(row.get("rule"))] = float(value)
    return values


@dataclass(frozen=True)
class Options:
    """The band's ``k``, ``floor``, ``relative_floor``; ``windows`` of the curve; the metric names
    (empty: every train/ and val/ metric); ``min_history``: fewer runs give no verdict."""

    k: float = 4.0
    floor: float = 1e-6
    relative_floor: float = 0.02
    windows: int = 5
    metrics: tuple[str, ...] = ()
    min_history: int = 3


def drifts(newest: Run, history: Sequence[Run], options: Options) -> list[Drift]:
    """Every quantity of ``newest`` (final values, curve windows, rule values) against the band of
    the same quantity over ``history``; a quantity with fewer than ``min_history`` historical
    values is not judged."""
    names = options.metrics or tuple(m for m in newest.metrics if m.startswith(("train/", "val/")))
    found: list[Drift] = []

    def judge(what: str, value: float | None, past: Sequence[float | None]) -> None:
        known = [v for v in past if v is not None]
        if value is not None and len(known) >= options.min_history:
            band = band_of(known, options.k, options.floor, options.relative_floor)
            found.append(Drift(what, value, band, len(known)))

    for name in names:
        series = newest.metrics.get(name)
        judge(f"{name} final", final_value(series), [final_value(r.metrics.get(name)) for r in history])
        steps = [s for s, _ in _points(series)]
        if len(steps) < 2 or options.windows < 1:
            continue
        width = (steps[-1] - steps[0]) / options.windows
        edges = [steps[0] + i * width for i in range(options.windows)] + [steps[-1]]
        past_windows = [window_means(r.metrics.get(name), edges) for r in history]
        for i, value in enumerate(window_means(series, edges)):
            span = f"steps {math.ceil(edges[i])}..{math.floor(edges[i + 1])}"
            judge(f"{name} curve {span}", value, [w[i] for w in past_windows])
    past_rules = [rule_values(r) for r in history]
    for rule, value in rule_values(newest).items():
        judge(f"rule value: {rule}", value, [p.get(rule) for p in past_rules])
    return found


def _positive(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The CLI."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog="docs/testing.md (\"Drift across runs\") has the archive layout and band.")
    parser.add_argument("archive", type=Path, help="one script's archive: $POSTTRAIN_CACHE/functional_history/<script>")
    parser.add_argument("--history", type=_count, default=10, metavar="N", help="earlier runs compared (default 10)")
    parser.add_argument("--min-history", type=_count, default=3, metavar="N",
                        help="fewer passing earlier runs: no verdict (default 3)")
    parser.add_argument("--k", type=_positive, default=4.0, help="band half-width in robust standard deviations (4)")
    parser.add_argument("--floor", type=_positive, default=1e-6, help="smallest band half-width (default 1e-6)")
    parser.add_argument("--relative-floor", type=_positive, default=0.02,
                        help="smallest half-width relative to the median (default 0.02)")
    parser.add_argument("--windows", type=_count, default=5, help="curve windows (default 5)")
    parser.add_argument("--metric", action="append", default=[], help="a metric to follow (default: train/*, val/*)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Judge the newest archived run against its history; exit 0 / 1 (flagged) / 2 (usage)."""
    args = build_parser().parse_args(argv)
    try:
        runs = load_archive(args.archive)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    newest = runs[-1]
    history = [r for r in runs[:-1] if r.passed][-args.history:]
    print(f"newest run {newest.name} ({'rules passed' if newest.passed else 'RULES FAILED'}); "
          f"history: {len(history)} earlier passing run(s)" + (f", {history[0].name}..{history[-1].name}"
                                                                if history else ""))
    if len(history) < args.min_history:
        print(f"no verdict: {len(history)} earlier passing run(s), {args.min_history} needed")
        return 0
    options = Options(args.k, args.floor, args.relative_floor, args.windows, tuple(args.metric), args.min_history)
    found = drifts(newest, history, options)
    flagged = [d for d in found if d.flagged]
    for d in flagged:
        print(f"FLAGGED {d.what}: {d.value:.6g} outside {d.band.centre:.6g} +- {d.band.half_width:.3g} "
              f"(median of {d.n_history} earlier runs; {d.value - d.band.centre:+.6g})")
    print(f"{len(flagged)} of {len(found)} quantities outside their historical band")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
