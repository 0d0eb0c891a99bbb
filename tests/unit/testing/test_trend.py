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


# --- the band, the windows and the quantities judged, by hand ---

def test_a_value_on_the_bands_edge_is_inside() -> None:
    band = trend.band_of([1.0, 1.0, 1.0], k=4, floor=0.5, relative_floor=0)
    assert band.contains(1.5) and band.contains(0.5) and not band.contains(1.5000001)


def test_an_empty_history_has_no_band() -> None:
    with pytest.raises(ValueError, match=r"^a band needs at least one historical value$"):
        trend.band_of([], k=4, floor=0, relative_floor=0)


def test_a_key_that_is_not_a_step_is_skipped_and_the_later_steps_still_count() -> None:
    assert trend.final_value({"0": 1.0, "note": 9.0, "10": 3.0}) == 3.0


def test_each_window_holds_the_steps_from_its_lower_edge_to_before_its_upper_and_the_last_its_upper_too() -> None:
    series = {"0": 0.0, "5": 1.0, "10": 2.0, "15": 3.0, "20": 4.0, "30": 5.0}
    assert trend.window_means(series, [0, 10, 20, 30]) == [0.5, 2.5, 4.5]
    assert trend.window_means(series, [0, 1, 4, 30]) == [0.0, None, 3.0]  # no step in [1, 4)


def run(name: str, value: float, rule_value: object = 0.2, dip: float | None = None) -> trend.Run:
    """A run logging train/loss at steps 10, 20, ..., 110 (``value``; ``dip`` at steps 50 and 60)
    and one rule value, with two rows whose values are not numbers to judge."""
    loss = {str(s): dip if dip is not None and s in (50, 60) else value for s in range(10, 111, 10)}
    rules = [{"rule": "R", "status": "PASS", "value": rule_value}, {"rule": "B", "status": "PASS", "value": True},
             {"rule": "N", "status": "PASS", "value": float("nan")}]
    return trend.Run(name, {"train/loss": loss, "other/x": {"10": 1.0}}, rules)


def test_the_final_value_each_curve_window_and_each_rule_value_are_judged_and_only_what_moved_is_flagged() -> None:
    history = [run("a", 1.0), run("b", 1.01), run("c", 0.99)]  # exactly min_history runs
    found = trend.drifts(run("new", 1.0, rule_value=0.5, dip=3.0), history, trend.Options())
    assert [d.what for d in found] == ["train/loss final"] + [
        f"train/loss curve steps {lo}..{hi}" for lo, hi in [(10, 30), (30, 50), (50, 70), (70, 90), (90, 110)]
    ] + ["rule value: R"]
    assert [d.what for d in found if d.flagged] == ["train/loss curve steps 50..70", "rule value: R"]
    curve = found[3]
    assert (curve.value, curve.band.centre, curve.n_history) == (3.0, 1.0, 3)  # steps 50, 60: the dip


def test_a_metric_logged_at_two_steps_has_a_curve_and_one_window_is_one_range() -> None:
    two = [trend.Run(n, {"val/acc": {"0": v, "100": v}}, None) for n, v in [("a", 1.0), ("b", 1.0), ("c", 1.0)]]
    newest = trend.Run("new", {"val/acc": {"0": 1.0, "100": 1.0}}, None)
    assert [d.what for d in trend.drifts(newest, two, trend.Options(windows=1))] == [
        "val/acc final", "val/acc curve steps 0..100"]


def test_no_curve_without_windows_nor_for_a_single_step_and_the_next_metric_is_still_judged() -> None:
    def runs(name):
        return trend.Run(name, {"train/once": {"5": 1.0}, "train/loss": {"0": 1.0, "10": 1.0}}, None)

    history = [runs("a"), runs("b"), runs("c")]
    assert [d.what for d in trend.drifts(runs("new"), history, trend.Options(windows=0))] == [
        "train/once final", "train/loss final"]
    assert [d.what for d in trend.drifts(runs("new"), history, trend.Options(windows=2))] == [
        "train/once final", "train/loss final", "train/loss curve steps 0..5", "train/loss curve steps 5..10"]


# --- the command line ---

def flat_runs(root: Path, finals: list[float], newest: float) -> None:
    """Passing runs whose train/x is ``value`` at steps 0..100 (11 steps), then the newest."""
    for i, value in enumerate([*finals, newest]):
        archive(root, f"202601{i + 1:02d}T000000Z_{i:02d}", {"train/x": {str(s): value for s in range(0, 101, 10)}})


def test_the_defaults_judge_the_last_10_passing_runs_with_k_4_and_5_windows(tmp_path, capsys) -> None:
    # history 1, 2, 3: median 2, MAD 1, so k = 4 puts the band at 2 +- 5.93; 8.5 is outside it, inside k = 5's
    flat_runs(tmp_path, [1.0, 2.0, 3.0], 8.5)
    assert trend.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("newest run 20260104T000000Z_03 (rules passed); history: 3 earlier passing run(s), "
                                   "20260101T000000Z_00..20260103T000000Z_02")
    assert "FLAGGED train/x final: 8.5 outside 2 +- 5.93 (median of 3 earlier runs; +6.5)" in out
    assert out.splitlines()[-1] == "6 of 7 quantities outside their historical band"  # 1 final, 5 windows, 1 rule


def test_only_the_last_10_passing_runs_are_the_history(tmp_path, capsys) -> None:
    flat_runs(tmp_path, [1.0] * 11, 1.0)
    assert trend.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        "history: 10 earlier passing run(s), 20260102T000000Z_01..20260111T000000Z_10")


def test_a_newest_run_that_failed_its_rules_is_still_judged_and_says_so(tmp_path, capsys) -> None:
    flat_runs(tmp_path, [1.0, 1.0, 1.0], 1.0)
    archive(tmp_path, "20260201T000000Z_failed", {"train/x": {"0": 1.0}}, status="FAIL")
    assert trend.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("newest run 20260201T000000Z_failed (RULES FAILED); history: 4 earlier")


def test_every_option_reaches_the_judgement(tmp_path, capsys) -> None:
    for i, value in enumerate([1.0, 5.0, 1.0, 1.0, 1.0]):  # the second run is older than --history 3 reaches
        archive(tmp_path, f"2026010{i + 1}T000000Z_{i}", {"train/a": {"0": value, "10": value}, "train/b": {"0": 7.0},
                                                          "val/c": {"0": value}})
    args = ["--history", "3", "--min-history", "3", "--k", "0.5", "--floor", "0", "--relative-floor", "0",
            "--windows", "1", "--metric", "train/a", "--metric", "train/b"]
    assert trend.main([str(tmp_path), *args]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("history: 3 earlier passing run(s), 20260102T000000Z_1..20260104T000000Z_3")
    assert out[-1] == "0 of 4 quantities outside their historical band"  # a's final and curve, b's final, R
    assert trend.main([str(tmp_path), *args[:2], "--min-history", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no verdict: 3 earlier passing run(s), 4 needed"
    assert trend.main([str(tmp_path), "--min-history", "2", "--history", "2", "--metric", "val/c"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 of 2 quantities outside their historical band"


def test_a_first_run_has_an_empty_history_and_no_verdict(tmp_path, capsys) -> None:
    flat_runs(tmp_path, [], 1.0)
    assert trend.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "newest run 20260101T000000Z_00 (rules passed); history: 0 earlier passing run(s)",
        "no verdict: 0 earlier passing run(s), 3 needed"]


def test_a_run_archived_without_a_check_report_counts_as_passed(tmp_path, capsys) -> None:
    flat_runs(tmp_path, [1.0, 1.0], 1.0)
    (tmp_path / "20260101T000000Z_00" / "check_report.json").unlink()
    assert trend.main([str(tmp_path), "--min-history", "2"]) == 0
    assert "history: 2 earlier passing run(s)" in capsys.readouterr().out


def test_each_unusable_archive_is_one_line_naming_it(tmp_path, capsys) -> None:
    def error(directory: Path) -> str:
        assert trend.main([str(directory)]) == 2
        return capsys.readouterr().err

    assert error(tmp_path / "none") == f"functional-trend: error: no archive directory {tmp_path / 'none'}\n"
    assert error(tmp_path) == (f"functional-trend: error: no archived run (a subdirectory with metrics.json) in "
                               f"{tmp_path}\n")
    archive(tmp_path, "20260101T000000Z_a", {"train/x": {"0": 1.0}})
    (tmp_path / "20260101T000000Z_a" / "metrics.json").write_text("[1, 2]")
    assert error(tmp_path) == (f"functional-trend: error: {tmp_path / '20260101T000000Z_a'}: metrics.json is not an "
                               "object or check_report.json not a list\n")


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--k", "-1", "argument --k: must be a finite number >= 0, got -1"),
    ("--floor", "nan", "argument --floor: must be a finite number >= 0, got nan"),
    ("--history", "0", "argument --history: must be >= 1, got 0"),
    ("--windows", "x", "argument --windows: invalid _count value: 'x'"),
])
def test_a_bad_option_value_is_a_usage_error_naming_it(tmp_path, capsys, option, value, message) -> None:
    with pytest.raises(SystemExit) as exited:
        trend.main([str(tmp_path), option, value])
    assert exited.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == f"functional-trend: error: {message}"


def test_zero_is_a_valid_k_floor_and_relative_floor(tmp_path, capsys) -> None:
    flat_runs(tmp_path, [1.0, 1.0, 1.0], 1.0)
    assert trend.main([str(tmp_path), "--k", "0", "--floor", "0", "--relative-floor", "0.5"]) == 0


HELP = """usage: functional-trend [-h] [--history N] [--min-history N] [--k K] [--floor FLOOR]
[--relative-floor RELATIVE_FLOOR] [--windows WINDOWS] [--metric METRIC] archive
Drift of a functional script's metrics across its archived runs: ``functional-trend DIR``.
positional arguments:
archive one script's archive: $POSTTRAIN_CACHE/functional_history/<script>
options:
-h, --help show this help message and exit
--history N earlier runs compared (default 10)
--min-history N fewer passing earlier runs: no verdict (default 3)
--k K band half-width in robust standard deviations (4)
--floor FLOOR smallest band half-width (default 1e-6)
--relative-floor RELATIVE_FLOOR smallest half-width relative to the median (default 0.02)
--windows WINDOWS curve windows (default 5)
--metric METRIC a metric to follow (default: train/*, val/*)
docs/testing.md ("Drift across runs") has the archive layout and band."""


def test_the_help_names_each_option_what_it_does_its_default_and_the_docs_section(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        trend.main(["--help"])
    assert exited.value.code == 0
    assert "".join(capsys.readouterr().out.split()) == "".join(HELP.split())  # however argparse wraps it
