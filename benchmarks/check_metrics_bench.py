"""Benchmark of the metric rule checker (not a test): 50 rules against 200 metrics x 10,000 steps.

    uv run python benchmarks/check_metrics_bench.py [--steps 10000] [--metrics 200] [--repeat 3]

Prints the best of ``--repeat`` wall times (seconds) for: loading (parsing + validating) the
metrics JSON; checking 50 sound rules with ``--expect-steps``, without and with the vacuity
check, on freshly loaded data; and the worst case for the vacuity check, 50 vacuous rules
(every stand-in tried).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from posttrain.testing.rules.checker import CheckOptions, RuleSpec, run_checks  # noqa: E402
from posttrain.testing.rules.interpreter import load_metrics  # noqa: E402  (tests/ is not a package)

# Rule templates over one metric ``m``; all pass on the synthetic series below.
SOUND_TEMPLATES = (
    'mean(data["{m}"], -100) < mean(data["{m}"], 1, 101)',
    'max(data["{m}"]) < 10',
    'min(data["{m}"]) > 0',
    'ratio_above(data["{m}"], 5) < 0.01',
    'median(data["{m}"]) < 2',
    'std(data["{m}"], -1000) < 1',
    'slope(data["{m}"]) < 0',
    'all_finite(data["{m}"])',
    'last_step(data["{m}"]) == {steps}',
    'data["{m}"]["1"] > data["{m}"]["{steps}"]',
)
VACUOUS_TEMPLATE = 'min(data["{m}"]) >= min(data["{m}"])'


def synthetic_metrics(num_metrics: int, steps: int, seed: int = 0) -> dict[str, dict[str, float]]:
    """``num_metrics`` loss-like series (decaying from ~2 to ~0.5, with noise) over steps 1..steps."""
    rng = random.Random(seed)
    metrics = {}
    for i in range(num_metrics):
        scale = rng.uniform(0.5, 1.5)
        metrics[f"train/metric_{i:03d}"] = {
            str(s): scale * (0.5 + 1.5 * math.exp(-s / (steps / 5))) + rng.uniform(-0.05, 0.05)
            for s in range(1, steps + 1)
        }
    return metrics


def rules(num_rules: int, num_metrics: int, steps: int, vacuous: bool) -> list[RuleSpec]:
    """``num_rules`` rules spread over the metrics (sound templates in turn, or the vacuous one)."""
    specs = []
    for i in range(num_rules):
        metric = f"train/metric_{(i * 7) % num_metrics:03d}"
        template = VACUOUS_TEMPLATE if vacuous else SOUND_TEMPLATES[i % len(SOUND_TEMPLATES)]
        specs.append(RuleSpec(template.format(m=metric, steps=steps)))
    return specs


def best_of(repeat: int, setup: Callable[[], Any], fn: Callable[[Any], Any]) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls of ``fn(setup())`` (``setup`` is not timed), and the last result."""
    times, result = [], None
    for _ in range(repeat):
        arg = setup()
        start = time.perf_counter()
        result = fn(arg)
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=200)
    parser.add_argument("--rules", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "metrics.json"
        path.write_text(json.dumps(synthetic_metrics(args.metrics, args.steps)))
        size_mb = path.stat().st_size / 1e6
        load_s, _ = best_of(args.repeat, lambda: path, load_metrics)
        print(f"log: {args.metrics} metrics x {args.steps} steps ({size_mb:.0f} MB JSON), {args.rules} rules")
        print(f"  load (parse + validate JSON)          {load_s:7.3f} s")
        cases = (
            ("sound rules, no vacuity check", False, False),
            ("sound rules, vacuity check", False, True),
            ("vacuous rules, vacuity check (worst)", True, True),
        )
        for label, vacuous, vacuity in cases:
            specs = rules(args.rules, args.metrics, args.steps, vacuous)
            options = CheckOptions(expect_steps=args.steps, vacuity_check=vacuity)
            # fresh data each time: a metric's steps are parsed on its first read, and that is timed
            check = functools.partial(run_checks, specs=specs, options=options)
            seconds, results = best_of(args.repeat, lambda: load_metrics(path), check)
            statuses = sorted({r.status for r in results})
            print(f"  check: {label:36s} {seconds:7.3f} s   statuses: {', '.join(statuses)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
