"""The step-time gate's yardstick over repeats: ``timing/train_over_reference`` (the policy worker's
train call over plain torch's forward and backward of the same model and micro-batches, timed in the
same process; ``policy.reference_timing_period``), healthy and with a slowdown injected into the
train step, for calibrating the gate's bound on a machine.

    python benchmarks/train_over_reference.py [--repeats 10] [--steps 12] [--threads 1] [--extra-forwards 3]

Each repeat is a fresh Hugging Face worker on the tiny test model training ``--steps`` calls on a
GRPO-shaped batch (16 rows, 12 prompt tokens, 3-11 completion tokens, fp32); its median ratio
over the calls after the first two (warm-up) is one sample. The slow side wraps the worker's
logprob forward (``tests/harness/step_time_gate.py::slowed``) so that each micro-batch's train
forward runs ``--extra-forwards`` more times without gradients (a recompute, as a logging change
might add): 3 make the train call about 2x as long. Prints each
side's per-repeat medians, their min / median / max, and the slow/healthy ratio of medians.
Run it beside ``stress`` (2x the cores) to see the ratio hold under load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests")]

from harness.step_time_gate import median_ratio  # noqa: E402
from unit.prepare_unit_test_assets import tiny_model_path  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (grpo.sh's worker: 1)")
    parser.add_argument("--extra-forwards", type=int, default=3)
    args = parser.parse_args()
    for name, value, low in (("--repeats", args.repeats, 1), ("--steps", args.steps, 3), ("--threads", args.threads, 1),
                             ("--extra-forwards", args.extra_forwards, 1)):
        if value < low:
            parser.error(f"{name} {value}: must be >= {low}")
    torch.set_num_threads(args.threads)
    path = str(tiny_model_path())
    sides: dict[str, list[float]] = {"healthy": [], "slowed": []}
    for r in range(args.repeats):
        sides["healthy"].append(median_ratio(path, args.steps, 0, seed=r))
        sides["slowed"].append(median_ratio(path, args.steps, args.extra_forwards, seed=r))
        print(f"repeat {r}: healthy {sides['healthy'][-1]:.3f}  slowed {sides['slowed'][-1]:.3f}", flush=True)
    for name, values in sides.items():
        print(f"{name:8s} min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}  "
              f"mean {statistics.mean(values):.3f}  sd {statistics.stdev(values) if len(values) > 1 else 0.0:.3f}")
    print(f"slowed/healthy (medians): {statistics.median(sides['slowed']) / statistics.median(sides['healthy']):.2f}")


if __name__ == "__main__":
    main()
