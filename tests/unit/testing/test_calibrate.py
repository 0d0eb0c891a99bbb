"""``check-metrics calibrate``: recommended bounds where the math puts them, and the CLI's edges."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from posttrain.testing import calibrate
from posttrain.testing.check_metrics import main as check_metrics_main

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"
HEALTHY = [str(FIXTURES / "grpo_vllm_healthy.json"), str(FIXTURES / "grpo_async_healthy.json")]
COLLAPSED = str(FIXTURES / "grpo_collapsed.json")


def run_file(tmp_path: Path, name: str, peak: float) -> str:
    """A metrics file whose metric ``m`` has its max (and min, and last) at ``peak``."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"m": {"1": peak, "2": peak}}))
    return str(path)


@pytest.mark.parametrize(("p", "df", "expected"), [
    (0.99, 1, 31.8205), (0.99, 4, 3.7469), (0.975, 10, 2.2281), (0.95, 30, 1.6973), (0.995, 7, 3.4995),
])  # fmt: skip
def test_student_t_quantile_matches_the_tables(p, df, expected) -> None:
    assert calibrate.student_t_quantile(p, df) == pytest.approx(expected, abs=2e-4)
    assert calibrate.student_t_quantile(1 - p, df) == pytest.approx(-expected, abs=2e-4)


def test_with_many_runs_the_factor_tends_to_the_normal_quantile() -> None:
    assert calibrate.prediction_factor(5000, 0.01) == pytest.approx(statistics.NormalDist().inv_cdf(0.99), rel=2e-3)


def test_the_recommended_upper_bound_is_mean_plus_t_times_s_times_the_small_n_widening(tmp_path) -> None:
    values = [1.0, 2.0, 3.0, 4.0, 5.0]  # mean 3, s = sqrt(2.5)
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", v) for i, v in enumerate(values)])
    for alpha, t in ((0.01, 3.7469), (0.05, 2.1318)):  # t(1 - alpha; 4) from the tables
        cal = calibrate.calibrate_rule('max(data["m"]) < 10', healthy, {}, alpha)
        expected = 3 + t * math.sqrt(2.5) * math.sqrt(1 + 1 / 5)
        assert cal.recommended_bound == pytest.approx(expected, abs=1e-3)
        assert cal.distribution == calibrate.Distribution(5, 1.0, 3.0, 5.0, 3.0, pytest.approx(math.sqrt(2.5)))
        assert cal.current_false_alarms == []
    lower = calibrate.calibrate_rule('0.5 < min(data["m"])', healthy, {}, 0.01)  # bound on the left
    assert lower.op == ">" and lower.current_bound == 0.5
    assert lower.recommended_bound == pytest.approx(3 - 3.7469 * math.sqrt(2.5 * 1.2), abs=1e-3)
    assert lower.current_false_alarms == []


def test_the_bound_is_beaten_by_a_new_healthy_run_at_the_stated_rate() -> None:
    """Normal data, n = 5: a fresh draw falls beyond the bound with probability alpha (5% here)."""
    rng, alpha, trials = random.Random(36), 0.05, 4000
    alarms = 0
    for _ in range(trials):
        sample = [rng.gauss(10, 2) for _ in range(5)]
        bound = calibrate.prediction_bound(sample, alpha, upper=True)
        alarms += rng.gauss(10, 2) > bound
    assert 0.035 < alarms / trials < 0.065  # binomial sd 0.0034


def test_on_a_log_scale_the_bound_is_the_exponential_of_the_logs_bound(tmp_path, capsys) -> None:
    """``--log-scale``: runs e^1..e^5 give exp(3 + t s sqrt(1.2)), s the logs' sd; a log-normal
    quantity's fresh draw falls beyond it at the stated rate; a value <= 0 is refused per rule."""
    paths = [run_file(tmp_path, f"r{i}", math.exp(v)) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])]
    healthy = calibrate.load_runs(paths)
    cal = calibrate.calibrate_rule('max(data["m"]) < 1000', healthy, {}, 0.01, log_scale=True)
    assert cal.log_scale and cal.recommended_bound == pytest.approx(math.exp(3 + 3.7469 * math.sqrt(2.5 * 1.2)),
                                                                    rel=1e-3)
    lower = calibrate.calibrate_rule('min(data["m"]) > 0.1', healthy, {}, 0.01, log_scale=True)
    assert lower.recommended_bound == pytest.approx(math.exp(3 - 3.7469 * math.sqrt(2.5 * 1.2)), rel=1e-3)
    broken = calibrate.load_runs([run_file(tmp_path, "spike", 1e9), run_file(tmp_path, "zero", 0.0)])
    rows = calibrate.calibrate_rule('max(data["m"]) < 1000', healthy, broken, 0.01, log_scale=True).broken
    assert rows[0]["fails_recommended"] and rows[0]["margin_in_std"] > 0
    assert not rows[1]["fails_recommended"] and rows[1]["margin_in_std"] == -math.inf
    with_zero = calibrate.load_runs([*paths, run_file(tmp_path, "z", 0.0)])
    refused = calibrate.calibrate_rule('max(data["m"]) < 1000', with_zero, {}, 0.01, log_scale=True)
    assert refused.recommended_bound is None and refused.reason == "log scale needs every healthy value > 0, got 0"
    rng, alarms = random.Random(7), 0
    for _ in range(4000):
        bound = calibrate.prediction_bound([rng.lognormvariate(1, 0.8) for _ in range(5)], 0.05, upper=True,
                                           log_scale=True)
        alarms += rng.lognormvariate(1, 0.8) > bound
    assert 0.035 < alarms / 4000 < 0.065
    assert calibrate.main([*paths, "--rule", 'max(data["m"]) < 1000', "--log-scale"]) == 0
    assert "at false-alarm rate 0.01: 13225.5 (exp(mean(log) + 4.105 * std(log)))" in capsys.readouterr().out


def test_current_bound_false_alarms_and_broken_runs_are_reported(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1, 2, 3, 4, 5])])
    broken = calibrate.load_runs([run_file(tmp_path, "diverged", 20.0), run_file(tmp_path, "mild", 6.0)])
    broken |= {"nan": {"m": {"1": float("nan")}}}
    cal = calibrate.calibrate_rule('max(data["m"]) < 4.5', healthy, broken, 0.01)
    assert cal.current_false_alarms == [str(tmp_path / "r4.json")]
    rows = {Path(r["run"]).stem: r for r in cal.broken}
    assert rows["diverged"]["fails_recommended"] and rows["diverged"]["margin"] == pytest.approx(
        20 - cal.recommended_bound)
    assert not rows["mild"]["fails_recommended"] and rows["mild"]["margin"] < 0
    assert rows["nan"]["fails_recommended"] and rows["nan"]["value"] is None


def test_a_rule_whose_bound_reads_the_metrics_is_calibrated_on_the_difference(tmp_path) -> None:
    paths = []
    for i, gain in enumerate([0.2, 0.3, 0.25, 0.35]):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps({"r": {"1": 0.1, "2": 0.1 + gain}}))
        paths.append(str(path))
    cal = calibrate.calibrate_rule('mean(data["r"], -1) > mean(data["r"], 1, 2)', calibrate.load_runs(paths), {}, 0.01)
    assert cal.current_bound == 0.0 and cal.distribution is not None
    assert cal.distribution.mean == pytest.approx(0.275)
    assert list(cal.values.values()) == pytest.approx([0.2, 0.3, 0.25, 0.35])


@pytest.mark.parametrize(("rule", "why"), [
    ('all_finite(data["m"])', "not a comparison"),
    ('0 < max(data["m"]) < 10', "chain"),
    ('max(data["m"]) == 3', "compares no value"),
    ('"m" in data', "compares no value"),
])  # fmt: skip
def test_rules_with_no_quantity_are_listed_as_such(tmp_path, rule, why) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, "a", 1.0), run_file(tmp_path, "b", 2.0)])
    cal = calibrate.calibrate_rule(rule, healthy, {}, 0.01)
    assert why in cal.reason and cal.recommended_bound is None


def test_no_spread_gives_no_recommendation(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, "a", 1.0), run_file(tmp_path, "b", 1.0)])
    cal = calibrate.calibrate_rule('max(data["m"]) < 2', healthy, {}, 0.01)
    assert cal.recommended_bound is None and "no spread" in cal.reason


def test_real_runs_the_collapsed_run_fails_the_calibrated_entropy_floor(tmp_path, capsys) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text('# the grpo pack\'s entropy floor and the script\'s gain\nmin(data["train/entropy"]) > 0.05\n\n'
                     'mean(data["val/sampling_accuracy"], -1) - data["val/sampling_accuracy"]["0"] >= 0.02\n'
                     'all_finite(data["train/loss"])\n')
    out = tmp_path / "cal.json"
    code = check_metrics_main(["calibrate", *HEALTHY, "--rules", str(rules), "--broken", COLLAPSED,
                               "--output-json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    entropy, gain, finite = doc["rules"]
    assert entropy["distribution"]["n"] == 2 and entropy["recommended_bound"] > 0.05
    assert entropy["broken"][0]["fails_recommended"] is True  # 0.028 < ~0.08
    assert gain["current_false_alarms"] == [] and gain["distribution"]["min"] == pytest.approx(0.23283)
    assert "not a comparison" in finite["reason"]
    text = capsys.readouterr().out
    assert "FAILS (caught)" in text and "not calibrated" in text


def test_rules_can_come_from_a_check_report(tmp_path, capsys) -> None:
    report = tmp_path / "check_report.json"
    assert check_metrics_main([HEALTHY[0], 'max(data["train/grad_norm"]) < 100', "--output-json", str(report)]) == 0
    capsys.readouterr()
    assert calibrate.main([*HEALTHY, "--rules", str(report)]) == 0
    assert 'rule: max(data["train/grad_norm"]) < 100' in capsys.readouterr().out


@pytest.mark.parametrize(("args", "names"), [
    (["one.json"], "got 1"),
    (["missing.json", "other.json", "--rule", 'max(data["m"]) < 1'], "missing.json"),
    (["a", "b", "--rule", "max(data['m']) <"], "invalid syntax"),
    (["a", "b"], "no rules"),
])  # fmt: skip
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, args, names) -> None:
    assert calibrate.main([str(tmp_path / a) if a.endswith(".json") else a for a in args]) == 2
    err = capsys.readouterr().err
    assert names in err and err.count("\n") == 1


def test_a_bad_rule_in_the_rules_file_names_the_file(tmp_path, capsys) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("max(data['m']) < 1\nimport os\n")
    assert calibrate.main([*HEALTHY, "--rules", str(rules)]) == 2
    assert str(rules) in capsys.readouterr().err
    assert calibrate.main([*HEALTHY, "--rules", str(tmp_path / "none.txt")]) == 2


def test_the_false_alarm_rate_must_be_a_small_probability(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        calibrate.main([*HEALTHY, "--rule", 'max(data["m"]) < 1', "--false-alarm-rate", "0.7"])
    assert exited.value.code == 2
