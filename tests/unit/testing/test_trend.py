"""``functional-trend``: a run that passes its rules but moved from its history is flagged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from posttrain.testing import trend
from posttrain.testing.check_metrics import main as check_metrics_main

ROOT = Path(__file__).resolve().parents[3]
BASE = json.loads((Path(__file__).parent / "fixtures" / "metrics" / "grpo_vllm_healthy.json").read_text())
GAIN_RULE = 'mean(data["val/sampling_accuracy"], -1) - data["val/sampling_accuracy"]["0"] >= 0.02'
REWARD_RULE = 'mean(data["train/reward_mean"], -30) > mean(data["train/reward_mean"], 1, 31)'


def scaled(factor: float) -> dict:
    """The healthy run with every value times ``factor``: a run-to-run spread on every metric."""
    return {m: {s: v * factor for s, v in series.items()} if isinstance(series, dict) else series
            for m, series in BASE.items()}


def archive(root: Path, name: str, metrics: dict, status: str = "PASS") -> None:
    """One run as common.sh's archive_run lays it out."""
    run = root / name
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "check_report.json").write_text(json.dumps([{"rule": GAIN_RULE, "status": status, "value": 0.2}]))


def healthy_history(root: Path) -> None:
    """Six passing runs, values within +-2.5% of the fixture's."""
    for i, factor in enumerate([0.975, 0.985, 0.995, 1.005, 1.015, 1.025]):
        archive(root, f"2026010{i + 1}T000000Z_{i:012x}", scaled(factor))


def test_band_is_median_plus_minus_k_robust_sigmas_or_the_floors() -> None:
    band = trend.band_of([1, 2, 3, 4, 100], k=4, floor=0, relative_floor=0)
    assert band.centre == 3 and band.half_width == pytest.approx(4 * 1.4826 * 1)  # MAD of the five is 1
    assert trend.band_of([2, 2, 2], k=4, floor=1e-3, relative_floor=0.1).half_width == pytest.approx(0.2)
    assert trend.band_of([2, 2, 2], k=4, floor=1e-3, relative_floor=0).half_width == 1e-3


def test_final_value_is_the_mean_of_the_last_tenth() -> None:
    assert trend.final_value({str(s): float(s) for s in range(1, 101)}) == pytest.approx(95.5)  # steps 91..100
    assert trend.final_value({"0": 0.1, "300": 0.5}) == 0.5
    assert trend.final_value({"1": float("nan")}) is None


def test_a_run_that_passes_its_rules_with_accuracy_010_lower_is_flagged(tmp_path, capsys) -> None:
    healthy_history(tmp_path)
    drifted = scaled(1.0)
    for metric in ("val/sampling_accuracy", "val/accuracy"):
        drifted[metric]["300"] -= 0.10
    run = tmp_path / "20260201T000000Z_drifted"
    run.mkdir()
    (run / "metrics.json").write_text(json.dumps(drifted))
    assert check_metrics_main([str(run / "metrics.json"), GAIN_RULE, REWARD_RULE, "--pack", "grpo",
                               "--output-json", str(run / "check_report.json")]) == 0
    capsys.readouterr()
    assert trend.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FLAGGED val/sampling_accuracy final" in out and "FLAGGED val/accuracy final" in out
    assert "FLAGGED train/" not in out  # only what moved


def test_a_run_like_its_history_is_not_flagged(tmp_path, capsys) -> None:
    healthy_history(tmp_path)
    archive(tmp_path, "20260201T000000Z_same", scaled(1.0))
    assert trend.main([str(tmp_path)]) == 0
    assert "0 of " in capsys.readouterr().out


def test_failing_runs_are_left_out_of_the_history(tmp_path) -> None:
    for i in range(3):
        archive(tmp_path, f"2026010{i}T000000Z_ok", scaled(0.99 + 0.01 * i))
    for i in range(4):  # more failing runs than passing ones: they would move the median
        archive(tmp_path, f"2026011{i}T000000Z_bad", scaled(3.0), status="FAIL")
    archive(tmp_path, "20260201T000000Z_new", scaled(1.0))
    assert trend.main([str(tmp_path)]) == 0


def test_too_little_history_gives_no_verdict(tmp_path, capsys) -> None:
    archive(tmp_path, "20260101T000000Z_a", scaled(1.0))
    archive(tmp_path, "20260102T000000Z_b", scaled(2.0))
    assert trend.main([str(tmp_path)]) == 0
    assert "no verdict" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path, capsys) -> None:
    assert trend.main([str(tmp_path / "none")]) == 2
    assert trend.main([str(tmp_path)]) == 2  # no run in it
    (tmp_path / "20260101T000000Z_a").mkdir()
    (tmp_path / "20260101T000000Z_a" / "metrics.json").write_text("{not json")
    assert trend.main([str(tmp_path)]) == 2
    assert "20260101T000000Z_a" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        trend.main([str(tmp_path), "--k", "-1"])
    assert exited.value.code == 2


def test_common_sh_archives_each_checked_run_and_keeps_the_newest(tmp_path) -> None:
    """archive_run, as check_run calls it: <cache>/functional_history/<script>/<UTC time>_<commit>/."""
    history = tmp_path / "cache" / "functional_history" / "grpo"
    for old in ("20200101T000000Z_aaaaaaaaaaaa", "20200102T000000Z_bbbbbbbbbbbb"):
        (history / old).mkdir(parents=True)
    work = tmp_path / "work" / "grpo"
    work.mkdir(parents=True)
    (work / "metrics.json").write_text(json.dumps(BASE))
    (work / "check_report.json").write_text("[]")
    script = (f"source {ROOT}/tests/functional/common.sh; WORK={work}; "
              f"archive_run {work}/metrics.json {work}/check_report.json")
    env = {**os.environ, "POSTTRAIN_CACHE": str(tmp_path / "cache"), "FUNCTIONAL_HISTORY_KEEP": "2",
           "FUNCTIONAL_HISTORY": "1"}
    subprocess.run(["bash", "-c", script], check=True, env=env, capture_output=True)
    kept = sorted(p.name for p in history.iterdir())
    assert len(kept) == 2 and kept[0] == "20200102T000000Z_bbbbbbbbbbbb"
    newest = history / kept[1]
    assert newest.name[:8].isdigit() and newest.name[8] == "T" and newest.name[15:17] == "Z_"
    assert json.loads((newest / "metrics.json").read_text()) == BASE
    assert (newest / "check_report.json").read_text() == "[]"
