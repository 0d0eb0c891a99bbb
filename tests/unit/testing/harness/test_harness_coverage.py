"""``--cov`` counts code that only a Ray actor runs (coverage inside Ray workers), in one process and
under ``-n 2`` (pytest-xdist), where each worker starts a Ray cluster of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing.harness.parallel import RAY_NICENESS_ENV, available_cpus, thread_share

REPO = Path(__file__).resolve().parents[4]
TREE = REPO / "tests/unit/testing/harness/fixture_tree"


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one_process", "two_xdist_workers"])
@pytest.mark.slow(reason="coverage measured inside real Ray actors, under xdist too")
def test_actor_only_lines_are_covered(tmp_path, workers):
    env = {**os.environ, "POSTTRAIN_UNIT_RESULTS_DIR": str(tmp_path / "results"),
           "COVERAGE_FILE": str(tmp_path / ".coverage"),  # keep clear of any outer --cov run's data files
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(
        # the tree's two tests are marked slow, as a Ray actor's start-up makes them
        ["bash", "tests/run_unit.sh", "--slow-only", *workers, "-o", "python_files=case_*.py", "-p", "no:cacheprovider",
         f"--cov={TREE}", f"--cov-report=json:{tmp_path / 'cov.json'}", str(TREE / "case_coverage.py"),
         str(TREE / "case_cluster.py")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "cov.json").read_text())
    actor_file = next(v for k, v in report["files"].items() if k.endswith("fixture_tree/actor_only.py"))
    source = (TREE / "actor_only.py").read_text().splitlines()
    actor_only = [i + 1 for i, line in enumerate(source)
                  if "ACTOR-ONLY LINE" in line or "return doubled_plus_one" in line]
    assert len(actor_only) == 2
    assert set(actor_only) <= set(actor_file["executed_lines"]), actor_file["missing_lines"]
    results = json.loads((tmp_path / "results" / "unit_results.json").read_text())
    assert results["coverage"] == pytest.approx(report["totals"]["percent_covered"], abs=0.01)
    # Ray: one cluster in one process; under -n 2 (one module per worker) a cluster per worker, in its own
    # session directory, each with the 2 CPUs the tests are sized for
    clusters = [m for m in results["metrics"].values() if "gcs" in m]
    assert len(clusters) == 2 and {m["cpus"] for m in clusters} == {2.0}
    expected = 2 if workers else 1
    assert len({m["gcs"] for m in clusters}) == len({m["session_dir"] for m in clusters}) == expected, clusters
    if workers:
        assert {m["worker"] for m in clusters} == {"gw0", "gw1"}
        # a worker's torch: its share of the cores (or the OMP_NUM_THREADS this run inherited)
        share = int(os.environ.get("OMP_NUM_THREADS") or thread_share(available_cpus(), 2))
        assert {m["torch_threads"] for m in clusters} == {share}
        # its Ray actors at the test processes' priority: at Ray's default nice 15 the other workers'
        # tests starve them (a Ray test took minutes instead of seconds on 2 cores)
        assert {m["actor_niceness"] for m in clusters} == {0}
    else:  # left alone: Ray's default 15, or what this run inherited (an outer xdist worker's 0)
        assert {m["actor_niceness"] for m in clusters} == {int(os.environ.get(RAY_NICENESS_ENV, "15"))}
