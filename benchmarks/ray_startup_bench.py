"""Ray start-up on a busy machine: ``init_ray`` (with its retries) against Ray's plain
``ray.init``, side by side, under the same load. Prints a table.

    uv run python benchmarks/ray_startup_bench.py [--starts 20] [--load 10]

The load is ``--load`` processes that spin on the CPU for the whole run (a load average of
about that many). Each start is a fresh Python process that starts a local Ray node with 2
CPUs, runs one task and shuts down, as an entry point would. A start fails when the process
exits non-zero; "retries" counts the ``ray: ... starting it again`` lines of ``init_ray``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time

POSTTRAIN = """
import ray
from posttrain.distributed.ray_cluster import init_ray
init_ray(num_cpus=2)
assert ray.get(ray.remote(lambda: 1).remote()) == 1
ray.shutdown()
"""
PLAIN = """
import ray
ray.init(num_cpus=2, include_dashboard=False)
assert ray.get(ray.remote(lambda: 1).remote()) == 1
ray.shutdown()
"""


def spin() -> None:
    while True:
        pass


def run_starts(code: str, starts: int) -> tuple[int, int, list[float]]:
    """``starts`` fresh processes running ``code``: (failures, retry lines, seconds of each).

    A failed start prints its last stderr line, so a failure other than the start-up timeout
    shows for what it is."""
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("RAY_ADDRESS", None)
    failures, retries, seconds = 0, 0, []
    for _ in range(starts):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        seconds.append(time.perf_counter() - t)
        failures += out.returncode != 0
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            print(f"start {len(seconds)} failed (exit {out.returncode}): {last}", flush=True)
        retries += out.stdout.count("starting it again")
    return failures, retries, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--load", type=int, default=10, help="busy processes (the load average)")
    parser.add_argument("--plain", action="store_true", help="also time Ray's plain ray.init as the reference")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    for p in spinners:
        p.start()
    try:
        time.sleep(5)  # let the load settle
        rows = [("init_ray", *run_starts(POSTTRAIN, args.starts))]
        if args.plain:
            rows.append(("ray.init", *run_starts(PLAIN, args.starts)))
        load = os.getloadavg()[0]
    finally:
        for p in spinners:
            p.terminate()
    print(f"{args.starts} starts each, {args.load} busy processes on {os.cpu_count()} cores "
          f"(1-min load average at the end: {load:.1f})")
    print(f"{'start-up':10} {'failures':>8} {'retries':>8} {'median s':>9} {'max s':>7}")
    for name, failures, retries, seconds in rows:
        print(f"{name:10} {failures:>8} {retries:>8} {statistics.median(seconds):>9.1f} {max(seconds):>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
