"""``tests/unit/unit_results.json``: what ran, when, on what, how long and how much memory.

Schema (docs/testing.md shows an example)::

    exit_status  int    pytest's exit status of the session
    git_commit   str    ``git rev-parse HEAD`` ("-dirty" appended with uncommitted changes, untracked files
                        included; "unknown" outside git)
    start_time   str    session start, ISO 8601 UTC (``2026-11-21T02:10:45Z``)
    metrics      dict   {test node id (``path::test[param]``): {name: value, "_elapsed": seconds of the call phase,
                        "_total": seconds of set-up, call and teardown together}}
    gpu_types    list   one name per local GPU (``nvidia-smi -L``); [] without GPUs
    cpu_model    str    ``/proc/cpuinfo`` model name
    coverage     float | str   total percent with ``--cov`` (Ray workers included), else "n/a (run without --cov)"

A copy goes to ``tests/unit/unit_results/<start time>.json`` for ``tests/unit_results_trend.py``.
``$POSTTRAIN_UNIT_RESULTS_DIR`` moves both (the harness's own tests use it for their inner runs).
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from posttrain.testing.harness.machine import cpu_model, gpu_names

RESULTS_DIR_ENV = "POSTTRAIN_UNIT_RESULTS_DIR"
NO_COVERAGE = "n/a (run without --cov)"

ELAPSED = "_elapsed"  # seconds of a test's call phase
TOTAL = "_total"  # seconds of its set-up, call and teardown (module fixtures are paid by the first test)
TIMES = (ELAPSED, TOTAL)


def recorded_seconds(metrics: object) -> object:
    """A test's recorded time from its ``metrics`` entry: ``_total`` (set-up, call and teardown), else
    ``_elapsed`` (a document written before totals were recorded); None for a test whose call never
    ran (a set-up error, a skip at set-up). Not validated: the caller checks it is seconds."""
    if not isinstance(metrics, dict) or ELAPSED not in metrics:
        return None
    return metrics.get(TOTAL, metrics[ELAPSED])


def results_dir(rootdir: Path) -> Path:
    """``$POSTTRAIN_UNIT_RESULTS_DIR`` or ``<rootdir>/tests/unit``."""
    return Path(os.environ.get(RESULTS_DIR_ENV) or rootdir / "tests" / "unit")


def git_commit(rootdir: Path) -> str:
    """HEAD's hash, with "-dirty" when the tree is not HEAD: a change unstaged or staged, or a file
    git does not ignore and does not track yet (an experiment's new module); "unknown" without git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=rootdir, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("-dirty" if git("status", "--porcelain") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def build(exit_status: int, start: datetime, metrics: dict[str, dict[str, Any]], coverage: float | None,
          rootdir: Path) -> dict[str, Any]:
    """The unit_results.json document (see the module doc for the schema)."""
    return {
        "exit_status": int(exit_status),
        "git_commit": git_commit(rootdir),
        "start_time": start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "metrics": metrics,
        "gpu_types": gpu_names(),
        "cpu_model": cpu_model(),
        "coverage": round(coverage, 2) if coverage is not None else NO_COVERAGE,
    }


def write(results: dict[str, Any], directory: Path) -> tuple[Path, Path]:
    """Write ``unit_results.json`` and its archive copy; returns both paths."""
    archive = directory / "unit_results"
    archive.mkdir(parents=True, exist_ok=True)
    stamp = results["start_time"].replace(":", "").replace("-", "")
    copy = archive / f"{stamp}.json"
    if copy.exists():  # two sessions started in the same second
        copy = archive / f"{stamp}-{os.getpid()}.json"
    text = json.dumps(results, indent=2, sort_keys=True) + "\n"
    latest = directory / "unit_results.json"
    for path in (latest, copy):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # readers never see half a file
    return latest, copy
