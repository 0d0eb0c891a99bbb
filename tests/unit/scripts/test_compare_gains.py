"""``compare_gains`` (tests/functional/common.sh): two backends' mean held-out accuracy gains
over their runs must agree within a bound; the gain of a run is its last three evaluations'
mean minus step 0."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def metrics(tmp_path: Path, name: str, accuracies: list[float]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"val/accuracy": {str(50 * i): a for i, a in enumerate(accuracies)}}))
    return str(path)


def compare(gap: str, runs_a: list[str], runs_b: list[str]) -> subprocess.CompletedProcess:
    script = f'source tests/functional/common.sh; compare_gains {gap} "{" ".join(runs_a)}" "{" ".join(runs_b)}"'
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("gap", "code"), [("0.05", 0), ("0.01", 1)])
def test_mean_gains_over_runs_are_compared(tmp_path, gap, code) -> None:
    # gains (mean of the last 3 minus the first): a = 0.2 and 0.3, b = 0.22 and 0.22
    a = [metrics(tmp_path, "a0", [0.4, 0.9, 0.6, 0.6, 0.6]), metrics(tmp_path, "a1", [0.4, 0.0, 0.7, 0.7, 0.7])]
    b = [metrics(tmp_path, "b0", [0.4, 0.62, 0.62, 0.62]), metrics(tmp_path, "b1", [0.3, 0.52, 0.52, 0.52])]
    result = compare(gap, a, b)
    assert result.returncode == code, result.stdout + result.stderr
    assert "gain 0.250 (runs 0.200, 0.300) vs 0.220 (runs 0.220, 0.220): |difference| 0.030" in result.stdout


def test_an_infinite_gap_reports_the_gains_without_a_verdict(tmp_path) -> None:
    a, b = metrics(tmp_path, "a", [0.4, 0.5, 0.5, 0.5]), metrics(tmp_path, "b", [0.4, 0.9, 0.9, 0.9])
    result = compare("inf", [a], [b])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("held-out accuracy gain 0.100 (runs 0.100) vs 0.500 (runs 0.500)")
    assert "PASS" not in result.stdout and "FAIL" not in result.stdout


def test_evaluations_are_ordered_by_step_not_by_text(tmp_path) -> None:
    # steps "100" < "50" as text: the gain must read step 0 first and step 100 last
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"val/accuracy": {"100": 0.9, "0": 0.1, "50": 0.5}}))
    result = compare("0.5", [str(path)], [str(path)])
    assert "gain 0.400" in result.stdout  # mean(0.1, 0.5, 0.9) - 0.1


def compare_runs(a: Path, b: Path, tol: str) -> subprocess.CompletedProcess:
    script = f"source tests/functional/common.sh; compare_runs {a} {b} {tol}"
    return subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_compare_runs_needs_every_train_and_val_value_within_the_tolerance(tmp_path) -> None:
    reference = {"train/loss": {"1": 0.5, "2": 0.4}, "val/accuracy": {"0": 0.3, "2": 0.5}, "timing/step": {"1": 9.0}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(reference))
    same = {**reference, "timing/step": {"1": 1.0}}  # timings may differ
    b.write_text(json.dumps(same))
    assert compare_runs(a, b, "1e-6").returncode == 0
    b.write_text(json.dumps({**same, "train/loss": {"1": 0.5, "2": 0.4 + 1e-5}}))
    result = compare_runs(a, b, "1e-6")
    assert result.returncode == 1 and "train/loss step 2" in result.stdout
    b.write_text(json.dumps({**same, "val/accuracy": {"0": 0.3}}))  # a step missing
    result = compare_runs(a, b, "1e-6")
    assert result.returncode == 1 and "val/accuracy step 2 missing" in result.stdout
