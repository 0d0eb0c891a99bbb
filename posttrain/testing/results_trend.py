"""A metric's history across archived unit-test runs, and a flag when it moves.

    uv run python tests/unit_results_trend.py METRIC_KEY [--tolerance 0.2] [--dir tests/unit/unit_results]

METRIC_KEY is ``<test node id>/<name>`` as in unit_results.json's ``metrics``, e.g.
``tests/unit/testing/harness/test_harness_tracker.py::test_max_mem_grows_when_a_ray_actor_allocates_1_gib/after_1gib_actor``
(``.../_elapsed`` for a test's duration). It prints one line per archived run, oldest first:
start time, git commit, value (``-`` when that run lacks the metric). A value is flagged
when it differs from the median of all earlier runs' values by more than ``--tolerance``
(relative: 0.2 = 20%); the first run with a value has nothing to compare with.

Exit status: 0 nothing flagged; 1 a value flagged; 2 usage error (unknown directory, a
METRIC_KEY without ``/``, no archived run holding the metric, an unreadable archive file).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path("tests/unit/unit_results")  # where the harness archives runs, from the repository root


@dataclass(frozen=True)
class Point:
    start_time: str
    git_commit: str
    value: float | None
    flagged: bool = False
    median_before: float | None = None


def load_runs(directory: Path) -> list[dict]:
    """Archived unit_results documents, oldest first (by start_time).

    Raises:
        ValueError: a file is not valid JSON or lacks ``start_time`` (names the file).
    """
    runs = []
    for path in sorted(directory.glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            doc["start_time"]  # noqa: B018 -- every archived run has one
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a unit_results file ({e})") from e
        runs.append(doc)
    return sorted(runs, key=lambda d: d["start_time"])


def metric_value(doc: dict, key: str) -> float | None:
    """``metrics[test][name]`` for ``key = "test/name"`` (the test id may itself hold ``/``)."""
    test, _, name = key.rpartition("/")
    value = doc.get("metrics", {}).get(test, {}).get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def trend(runs: list[dict], key: str, tolerance: float) -> list[Point]:
    """Each run's value, flagged when ``|value - median(previous values)| > tolerance * |median|``."""
    points: list[Point] = []
    previous: list[float] = []
    for doc in runs:
        value = metric_value(doc, key)
        median = statistics.median(previous) if previous else None
        flagged = (value is not None and median is not None
                   and abs(value - median) > tolerance * abs(median))
        points.append(Point(doc["start_time"], doc.get("git_commit", "?"), value, flagged, median))
        if value is not None:
            previous.append(value)
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metric_key")
    parser.add_argument("--tolerance", type=float, default=0.2, help="relative, default 0.2 (20%%)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="archived runs (default: %(default)s)")
    args = parser.parse_args(argv)
    if "/" not in args.metric_key:
        parser.exit(2, f"unit_results_trend.py: METRIC_KEY {args.metric_key!r} must be '<test id>/<name>'\n")
    if args.tolerance < 0:
        parser.exit(2, f"unit_results_trend.py: --tolerance {args.tolerance} must be >= 0\n")
    if not args.dir.is_dir():
        parser.exit(2, f"unit_results_trend.py: no archive directory {args.dir}\n")
    try:
        points = trend(load_runs(args.dir), args.metric_key, args.tolerance)
    except ValueError as e:
        parser.exit(2, f"unit_results_trend.py: {e}\n")
    if all(p.value is None for p in points):
        parser.exit(2, f"unit_results_trend.py: no run in {args.dir} has {args.metric_key!r}\n")
    for p in points:
        value = "-" if p.value is None else f"{p.value:.6g}"
        flag = ""
        if p.flagged and p.value is not None and p.median_before is not None:
            # a median of 0 has no relative change to print
            change = f"{p.value / p.median_before - 1:+.0%} " if p.median_before else ""
            flag = f"  FLAGGED: {change}vs median {p.median_before:.6g} of earlier runs"
        print(f"{p.start_time}  {p.git_commit[:12]:<12}  {value}{flag}")
    flagged = sum(p.flagged for p in points)
    if flagged:
        print(f"{flagged} value(s) moved more than {args.tolerance:.0%} from the median of earlier runs")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
