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


# --- the statistics' edges ---

def test_student_t_cdf_is_symmetric_and_a_half_at_zero() -> None:
    for df in (1, 2, 3, 6):
        assert calibrate.student_t_cdf(0.0, df) == 0.5
        for t in (0.3, 1.7):
            assert calibrate.student_t_cdf(t, df) > 0.5
            assert calibrate.student_t_cdf(-t, df) == pytest.approx(1 - calibrate.student_t_cdf(t, df), abs=1e-15)
    assert calibrate.student_t_cdf(-1.0, 1) == pytest.approx(0.25)  # Cauchy: 1/2 + atan(t)/pi


@pytest.mark.parametrize(("p", "df", "expected"), [(0.95, 3, 2.3534), (0.75, 10, 0.6998), (0.5, 4, 0.0)])
def test_student_t_quantile_below_one_at_the_median_and_for_three_degrees_of_freedom(p, df, expected) -> None:
    assert calibrate.student_t_quantile(p, df) == pytest.approx(expected, abs=2e-4)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: calibrate.student_t_cdf(1.0, 0), "degrees of freedom must be >= 1, got 0"),
    (lambda: calibrate.student_t_quantile(0.0, 3), r"probability must be in \(0, 1\), got 0.0"),
    (lambda: calibrate.student_t_quantile(1.0, 3), r"probability must be in \(0, 1\), got 1.0"),
    (lambda: calibrate.student_t_quantile(1.5, 3), r"probability must be in \(0, 1\), got 1.5"),
    (lambda: calibrate.prediction_factor(1, 0.01), "a prediction bound needs at least 2 runs, got 1"),
    (lambda: calibrate.prediction_bound([1.0, 0.0], 0.01, upper=True, log_scale=True),
     "a log-scale bound needs values > 0, got 0"),
])  # fmt: skip
def test_what_has_no_statistic_is_refused_naming_the_value(call, message) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        call()


# --- a rule's quantity ---

@pytest.mark.parametrize(("rule", "why"), [
    ('all_finite(data["m"])',
     "not a comparison (a boolean check such as all_finite passes or fails; no bound to move)"),
    ('0 < max(data["m"]) < 10', "a chain of comparisons: write each side as its own rule to calibrate it"),
    ('max(data["m"]) == 3', "`==` compares no value with a bound"),
    ("0 < 1", "reads no metric"),
])  # fmt: skip
def test_each_rule_without_a_quantity_says_why_in_full(rule, why) -> None:
    assert calibrate.quantity_of(rule) == why


def test_a_rule_reading_the_metrics_on_both_sides_keeps_its_direction(tmp_path) -> None:
    paths = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0])]
    cal = calibrate.calibrate_rule('max(data["m"]) > min(data["m"]) - 1', calibrate.load_runs(paths), {}, 0.01)
    assert (cal.quantity, cal.op, cal.current_bound) == ("max(data['m']) - (min(data['m']) - 1)", ">", 0.0)
    assert list(cal.values.values()) == [1.0, 1.0, 1.0]


def test_a_bound_that_is_not_a_finite_number_is_no_current_bound() -> None:
    quantity = calibrate.quantity_of('max(data["m"]) < 1e999')
    assert isinstance(quantity, calibrate.Quantity) and quantity.bound is None and quantity.bound_text == "1e309"
    assert calibrate.quantity_of('max(data["m"]) < 3 + 1') == calibrate.Quantity(
        "max(data['m'])", "<", "3 + 1", False, 4.0)


def test_a_passing_comparison_of_no_number_is_not_computed(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, "a", 1.0), run_file(tmp_path, "b", 2.0)])
    cal = calibrate.calibrate_rule('all_finite(data["m"]) < 2', healthy, {}, 0.01)  # True < 2: passes, no value
    assert list(cal.not_computed.values()) == ["not computed", "not computed"]
    assert cal.reason == "computed on 0 healthy run(s); 2 or more are needed"
    assert calibrate.render(cal, 0.01) == ('rule: all_finite(data["m"]) < 2\n'
                                           "  not calibrated: computed on 0 healthy run(s); 2 or more are needed")


def test_non_strict_rules_get_the_same_sides_as_strict_ones(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])])
    k, s = calibrate.prediction_factor(5, 0.01), math.sqrt(2.5)
    upper = calibrate.calibrate_rule('max(data["m"]) <= 10', healthy, {}, 0.01)
    lower = calibrate.calibrate_rule('max(data["m"]) >= 0', healthy, {}, 0.01)
    assert (upper.recommended_bound, lower.recommended_bound) == (pytest.approx(3 + k * s), pytest.approx(3 - k * s))
    assert "  recommended upper bound at false-alarm rate 0.01: " in calibrate.render(upper, 0.01)
    assert "  recommended lower bound at false-alarm rate 0.01: " in calibrate.render(lower, 0.01)


def test_every_healthy_run_that_fails_the_current_bound_is_named(tmp_path) -> None:
    paths = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])]
    cal = calibrate.calibrate_rule('max(data["m"]) < 3.5', calibrate.load_runs(paths), {}, 0.01)
    assert f"  current bound 3.5: healthy runs that fail it: {paths[3]}, {paths[4]}" in calibrate.render(cal, 0.01)


def test_an_upper_log_scale_margin_is_counted_in_the_logs_spread(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", math.exp(v)) for i, v in enumerate([1, 2, 3, 4, 5])])
    broken = calibrate.load_runs([run_file(tmp_path, "spike", math.exp(12.0))])
    cal = calibrate.calibrate_rule('max(data["m"]) < 1e6', healthy, broken, 0.01, log_scale=True)
    k, s = calibrate.prediction_factor(5, 0.01), math.sqrt(2.5)
    assert cal.broken[0]["margin_in_std"] == pytest.approx((12 - (3 + k * s)) / s)


def test_a_log_scale_takes_values_below_one(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", v) for i, v in enumerate([0.1, 0.2, 0.4])])
    cal = calibrate.calibrate_rule('max(data["m"]) < 1', healthy, {}, 0.01, log_scale=True)
    logs = [math.log(v) for v in (0.1, 0.2, 0.4)]
    expected = math.exp(statistics.fmean(logs) + calibrate.prediction_factor(3, 0.01) * statistics.stdev(logs))
    assert cal.reason == "" and cal.recommended_bound == pytest.approx(expected)


# --- the report of one rule, line by line ---

def test_the_report_of_an_upper_bound_shows_the_runs_the_bounds_and_each_broken_run(tmp_path) -> None:
    paths = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0, 4.0, 5.0])]
    nan = '{"m": {"1": NaN}}'
    (tmp_path / "n.json").write_text(nan)
    (tmp_path / "bn.json").write_text(nan)
    healthy = calibrate.load_runs([*paths, str(tmp_path / "n.json")])
    broken = calibrate.load_runs([run_file(tmp_path, "b20", 20.0), run_file(tmp_path, "b6", 6.0),
                                  str(tmp_path / "bn.json")])
    cal = calibrate.calibrate_rule('max(data["m"]) < 4.5', healthy, broken, 0.01)
    k, s = calibrate.prediction_factor(5, 0.01), math.sqrt(2.5)
    bound = 3 + k * s
    why = "metric 'm': step '1' is nan; non-finite values never pass"
    assert cal.broken[2] == {"run": str(tmp_path / "bn.json"), "value": None, "fails_recommended": True,
                             "margin": None, "why": why}
    assert cal.broken[0]["margin_in_std"] == pytest.approx((20 - bound) / s)
    assert calibrate.render(cal, 0.01).splitlines() == [
        'rule: max(data["m"]) < 4.5',
        "  quantity: max(data['m']) < bound",
        f"  healthy runs: n=5 min=1 median=3 max=5 mean=3 std={s:.6g}",
        f"  not computed on {tmp_path / 'n.json'}: {why}",
        f"  recommended upper bound at false-alarm rate 0.01: {bound:.6g} (mean + {k:.3f} * std)",
        f"  current bound 4.5: healthy runs that fail it: {paths[4]}",
        f"  broken {tmp_path / 'b20.json'}: 20 FAILS (caught) the recommended bound; beyond it by {20 - bound:+.6g} "
        f"({(20 - bound) / s:+.2f} std)",
        f"  broken {tmp_path / 'b6.json'}: 6 passes (NOT caught) the recommended bound; beyond it by {6 - bound:+.6g} "
        f"({(6 - bound) / s:+.2f} std)",
        f"  broken {tmp_path / 'bn.json'}: not computed ({why}): fails any bound",
    ]


def test_the_report_of_a_lower_log_scale_bound_counts_margins_in_the_logs_spread(tmp_path) -> None:
    logs = [1.0, 2.0, 3.0, 4.0, 5.0]
    healthy = calibrate.load_runs([run_file(tmp_path, f"r{i}", math.exp(v)) for i, v in enumerate(logs)])
    low, high = math.exp(-5), 30.0
    broken = calibrate.load_runs([run_file(tmp_path, "low", low), run_file(tmp_path, "high", high),
                                  run_file(tmp_path, "zero", 0.0)])
    cal = calibrate.calibrate_rule('min(data["m"]) > 0.01', healthy, broken, 0.01, log_scale=True)
    k, s = calibrate.prediction_factor(5, 0.01), math.sqrt(2.5)
    bound = math.exp(3 - k * s)
    d = cal.distribution
    assert d is not None
    assert [row["margin_in_std"] for row in cal.broken] == pytest.approx(
        [(math.log(bound) + 5) / s, (math.log(bound) - math.log(high)) / s, math.inf])
    assert calibrate.render(cal, 0.01).splitlines() == [
        'rule: min(data["m"]) > 0.01',
        "  quantity: min(data['m']) > bound",
        f"  healthy runs: n=5 min={math.e:.6g} median={math.exp(3):.6g} max={math.exp(5):.6g} mean={d.mean:.6g} "
        f"std={d.std:.6g}",
        f"  recommended lower bound at false-alarm rate 0.01: {bound:.6g} (exp(mean(log) - {k:.3f} * std(log)))",
        "  current bound 0.01: healthy runs that fail it: none",
        f"  broken {tmp_path / 'low.json'}: {low:.6g} FAILS (caught) the recommended bound; beyond it by "
        f"{bound - low:+.6g} ({(math.log(bound) + 5) / s:+.2f} std of the log)",
        f"  broken {tmp_path / 'high.json'}: 30 passes (NOT caught) the recommended bound; beyond it by "
        f"{bound - high:+.6g} ({(math.log(bound) - math.log(high)) / s:+.2f} std of the log)",
        f"  broken {tmp_path / 'zero.json'}: 0 FAILS (caught) the recommended bound; beyond it by {bound:+.6g} "
        "(+inf std of the log)",
    ]


def test_the_report_without_a_spread_or_a_numeric_current_bound(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, "a", 1.0), run_file(tmp_path, "b", 1.0)])
    broken = calibrate.load_runs([run_file(tmp_path, "c", 3.0)])
    cal = calibrate.calibrate_rule('max(data["m"]) <= 2', healthy, broken, 0.01)
    assert calibrate.render(cal, 0.01).splitlines()[3:] == [
        "  recommended bound: none (no spread: every healthy run gave 1)",
        "  current bound 2: healthy runs that fail it: none",
        f"  broken {tmp_path / 'c.json'}: 3 (no recommended bound to test)",
    ]
    cal.current_bound = None  # a bound the engine computed to no finite number
    assert "  current bound: not a number (not checked)" in calibrate.render(cal, 0.01).splitlines()


def test_the_report_of_a_rule_that_cannot_be_calibrated_is_its_reason(tmp_path) -> None:
    healthy = calibrate.load_runs([run_file(tmp_path, "a", 1.0)])
    for rule, reason in [('all_finite(data["m"])', calibrate.quantity_of('all_finite(data["m"])')),
                         ('max(data["m"]) < 2', "computed on 1 healthy run(s); 2 or more are needed")]:
        assert calibrate.render(calibrate.calibrate_rule(rule, healthy, {}, 0.01), 0.01) == (
            f"rule: {rule}\n  not calibrated: {reason}")


# --- the command line ---

def test_a_pack_calibrates_its_checks_that_the_first_run_logs(capsys) -> None:
    def rules(runs: list[str]) -> list[str]:
        assert calibrate.main([*runs, "--pack", "grpo"]) == 0
        lines = capsys.readouterr().out.splitlines()
        return [line.removeprefix("rule: ") for line in lines if line.startswith("rule:")]

    logged = rules(HEALTHY)  # the first run logs token_mult_prob_error; neither logs train/kl
    assert logged == ['all_finite(data["train/loss"])', 'all_finite(data["train/grad_norm"])',
                      'min(data["train/grad_norm"]) > 0.0', 'min(data["train/fraction_groups_kept"]) > 0.0',
                      'min(data["train/entropy"]) > 0.05', 'max(data["train/token_mult_prob_error"]) < 1.05',
                      'std(data["train/loss"]) > 0', 'std(data["train/grad_norm"]) > 0',
                      'std(data["train/entropy"]) > 0', 'std(data["train/reward_mean"]) > 0']
    assert rules(HEALTHY[::-1]) == [r for r in logged if "token_mult_prob_error" not in r]


def test_the_report_separates_rules_by_a_blank_line_and_every_broken_run_is_tested(tmp_path, capsys) -> None:
    runs = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0])]
    args = [*runs, "--rule", 'max(data["m"]) < 10', "--rule", 'min(data["m"]) > 0', "--false-alarm-rate", "0.05",
            "--broken", run_file(tmp_path, "b1", 50.0), "--broken", run_file(tmp_path, "b2", 60.0)]
    assert calibrate.main(args) == 0
    blocks = capsys.readouterr().out.rstrip("\n").split("\n\n")
    assert [b.splitlines()[0] for b in blocks] == ['rule: max(data["m"]) < 10', 'rule: min(data["m"]) > 0']
    k = calibrate.prediction_factor(3, 0.05)
    assert f"at false-alarm rate 0.05: {2 + k:.6g} (mean + {k:.3f} * std)" in blocks[0]  # std 1
    assert [line.split(":")[0] for line in blocks[0].splitlines() if "broken" in line] == [
        f"  broken {tmp_path / 'b1.json'}", f"  broken {tmp_path / 'b2.json'}"]


@pytest.mark.parametrize("log_scale", [False, True])
def test_the_json_output_is_the_whole_calibration_indented(tmp_path, log_scale) -> None:
    runs = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0, 3.0])]
    broken = run_file(tmp_path, "b", 9.0)
    out = tmp_path / "cal.json"
    args = [*runs, "--rule", 'max(data["m"]) < 10', "--broken", broken, "--output-json", str(out)]
    assert calibrate.main(args + (["--log-scale"] if log_scale else [])) == 0
    text = out.read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2) + "\n"
    method = "normal prediction bound: mean +- t(1 - alpha; n - 1) * std * sqrt(1 + 1/n)"
    assert {k: v for k, v in doc.items() if k != "rules"} == {
        "false_alarm_rate": 0.01, "method": method + (", of the logs, exponentiated" if log_scale else ""),
        "healthy_runs": runs, "broken_runs": [broken]}
    assert [r["rule"] for r in doc["rules"]] == ['max(data["m"]) < 10'] and doc["rules"][0]["log_scale"] is log_scale


def test_an_output_that_cannot_be_written_is_one_line_naming_it(tmp_path, capsys) -> None:
    runs = [run_file(tmp_path, f"r{i}", v) for i, v in enumerate([1.0, 2.0])]
    assert calibrate.main([*runs, "--rule", 'max(data["m"]) < 10', "--output-json", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"check-metrics calibrate: error: cannot write {tmp_path}: ") and err.count("\n") == 1


@pytest.mark.parametrize(("write", "message"), [
    (None, "cannot read rules file {path}: "),
    ("[1, 2]", "{path}: not a check_report.json (a list of rows with 'rule'): "),
])
def test_an_unreadable_rules_file_is_one_line_naming_it(tmp_path, capsys, write, message) -> None:
    path = tmp_path / "rules.txt"
    if write is not None:
        path.write_text(write)
    assert calibrate.main([*HEALTHY, "--rules", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("check-metrics calibrate: error: " + message.format(path=path)) and err.count("\n") == 1


def test_a_check_report_after_blank_lines_is_still_a_check_report(tmp_path, capsys) -> None:
    report = tmp_path / "check_report.json"
    report.write_text('\n  [{"rule": "max(data[\\"m\\"]) < 10", "status": "PASS"}]')
    assert calibrate.read_rules(str(report)) == ['max(data["m"]) < 10']


def test_no_rules_is_one_line_naming_the_three_ways_to_give_them(capsys) -> None:
    assert calibrate.main(HEALTHY) == 2
    assert capsys.readouterr().err == ("check-metrics calibrate: error: no rules given (--rules FILE, --rule or "
                                       "--pack)\n")


@pytest.mark.parametrize(("args", "message"), [
    (["--false-alarm-rate", "0"], "argument --false-alarm-rate: must be in (0, 0.5), got 0"),
    (["--false-alarm-rate", "0.5"], "argument --false-alarm-rate: must be in (0, 0.5), got 0.5"),
    (["--pack", "ppo"], "argument --pack: invalid choice: 'ppo' (choose from "),  # the rest's quoting: Python's
])
def test_a_bad_option_is_a_usage_error_naming_it(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as exited:
        calibrate.main([*HEALTHY, "--rule", 'max(data["m"]) < 1', *args])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"check-metrics calibrate: error: {message}")


HELP = """usage: check-metrics calibrate [-h] [--rules FILE] [--rule RULE] [--pack {grpo,sft}]
[--false-alarm-rate ALPHA] [--broken RUN [RUN ...]] [--log-scale] [--output-json PATH] RUN [RUN ...]
Calibrate rule bounds from healthy runs: ``check-metrics calibrate RUN... --rules FILE``.
positional arguments:
RUN metrics.json of a healthy run (2 or more)
options:
-h, --help show this help message and exit
--rules FILE one rule per line (# comments), or a check_report.json
--rule RULE a rule (repeatable)
--pack {grpo,sft} add a rule pack
--false-alarm-rate ALPHA chance a healthy run fails the recommended bound (default 0.01)
--broken RUN [RUN ...] metrics.json of a run the rules must fail
--log-scale take each quantity's logarithm as normal (positive, right-skewed quantities such as a max over steps);
the bound is exp(mean(log) +- k * std(log))
--output-json PATH write the calibration as JSON
Method: see the module docstring of posttrain/testing/calibrate.py and docs/testing.md ("Calibrating bounds")."""


def test_the_help_names_each_option_what_it_does_and_where_the_method_is(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        calibrate.main(["--help"])
    assert exited.value.code == 0
    assert "".join(capsys.readouterr().out.split()) == "".join(HELP.split())  # however argparse wraps it
