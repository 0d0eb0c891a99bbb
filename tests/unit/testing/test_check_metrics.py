"""Tests for posttrain/testing/rules/interpreter.py (the rule engine) and check_metrics.py (its CLI)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.testing import check_metrics as check_metrics
from posttrain.testing.rules import interpreter as metric_rules
from posttrain.testing.rules.interpreter import (
    MetricsFileError,
    RuleError,
    RuleEvalError,
    compile_rule,
    evaluate_rule,
    evaluate_rules,
    load_metrics,
    mean,
    median,
    ratio_above,
)

TESTS_DIR = Path(__file__).resolve().parents[2]


CLI = TESTS_DIR / "check_metrics.py"
ONE_TO_TEN = {str(i): float(i) for i in range(1, 11)}
DATA = {
    "train/loss": {"1": 0.93, "2": 0.81, "3": 0.70},
    "train/kl": {"1": 0.1, "2": 0.6, "3": float("nan")},
    "val/accuracy": {"0": 0.3, "50": 0.5},
    "val/final_score": 0.7,
}


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run check_metrics.py as a subprocess, the way CI scripts do."""
    return subprocess.run(
        [sys.executable, str(CLI), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def metrics_file(tmp_path: Path) -> Path:
    """DATA written as a metrics JSON file (NaN written as the NaN token)."""
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(DATA))
    return path


# ------------------------------------------------------------------------------ helpers


class TestMinMaxMedian:
    def test_over_step_dict_list_and_numbers(self):
        d = {"1": 5.0, "2": 2.0, "3": 8.0, "4": 1.0}
        assert metric_rules.metric_min(d) == 1.0
        assert metric_rules.metric_max(d) == 8.0
        assert metric_rules.metric_min([3.0, -1.0]) == -1.0
        assert metric_rules.metric_max(3, 7.5, 2) == 7.5
        assert metric_rules.metric_max(4.25) == 4.25

    def test_median_odd_and_even(self):
        assert median({"1": 9.0, "2": 1.0, "3": 5.0}) == 5.0
        assert median({"1": 4.0, "2": 1.0, "3": 2.0, "4": 10.0}) == 3.0

    def test_median_takes_means_step_range(self):
        # NeMo-RL's form: median(data["timing/train/total_step_time"], 2) reads steps 2.. only
        d = {"0": 100.0, "1": 50.0, "2": 1.0, "3": 2.0, "4": 3.0, "5": 40.0}
        assert median(d) == 3.0  # steps 1..5: step 0 (the eval before training) left out, as mean does
        assert median(d, 0) == 21.5  # steps 0..5: (3 + 40) / 2
        assert median(d, 2) == 2.5  # steps 2..5
        assert median(d, 2, 5) == 2.0  # steps 2, 3, 4
        assert median(d, -2) == 21.5  # the last two steps: 4, 5
        assert median(d, 1, -1) == 2.5  # through the second-to-last step: 1..4
        assert metric_rules.evaluate_rule({"t": d}, 'median(data["t"], 2) < 10').status == "PASS"

    def test_empty_raises(self):
        with pytest.raises(ValueError):
            metric_rules.metric_min({})
        with pytest.raises(ValueError):
            median({})
        with pytest.raises(ValueError, match=r"no steps in \[7, 9\)"):
            median({"1": 1.0, "2": 2.0}, 7, 9)

    @pytest.mark.parametrize("helper", [metric_rules.metric_min, metric_rules.metric_max, median])
    def test_nan_inside_is_an_error_not_skipped(self, helper):
        # builtin min() silently skips a NaN in the middle; a NaN must never pass.
        with pytest.raises(RuleEvalError, match=r"step '2' is nan"):
            helper({"1": 1.0, "2": float("nan"), "3": 0.5})


class TestRatioAbove:
    def test_counts_values_at_or_above_threshold(self):
        # NeMo-RL semantics: inclusive (>=). 3, 4, 5 of 1..5 -> 0.6
        assert ratio_above({"1": 1.0, "2": 2.0, "3": 3.0, "4": 4.0, "5": 5.0}, 3.0) == 0.6
        assert ratio_above({"1": 1.0, "2": 2.0, "3": 2.0, "4": 3.0}, 2.0) == 0.75

    def test_none_and_all(self):
        assert ratio_above({"1": 1.0, "2": 2.0}, 10.0) == 0.0
        assert ratio_above({"1": 5.0, "2": 6.0}, 4.0) == 1.0

    def test_empty_does_not_silently_pass(self):
        with pytest.raises(ValueError, match="no values"):
            ratio_above({}, 1.0)

    def test_inf_is_an_error(self):
        with pytest.raises(RuleEvalError, match="inf"):
            ratio_above({"1": 0.1, "2": float("inf")}, 0.5)


class TestMean:
    def test_whole_run(self):
        assert mean({"1": 1.0, "2": 2.0, "3": 3.0, "4": 4.0, "5": 5.0}) == 3.0

    def test_range_start_and_exclusive_range_end(self):
        assert mean(ONE_TO_TEN, 3, 7) == 4.5  # steps 3, 4, 5, 6

    def test_negative_range_start_counts_from_the_end(self):
        assert mean(ONE_TO_TEN, -3) == 9.0  # steps 8, 9, 10
        assert mean(ONE_TO_TEN, range_start=-10) == 5.5

    def test_negative_range_end(self):
        assert mean(ONE_TO_TEN, 1, -2) == 4.5  # steps 1..8 (end = -2 + 10 + 1 = 9, exclusive)

    def test_resumed_run_starting_late(self):
        assert mean({"101": 1.0, "102": 2.0, "103": 3.0, "104": 4.0, "105": 5.0}) == 3.0

    def test_missing_steps_after_resume_are_skipped_by_step_number(self):
        # steps 6 and 7 were lost (crash after the step-5 checkpoint, resumed at 8)
        resumed = {
            "1": 1.0,
            "2": 2.0,
            "3": 3.0,
            "4": 4.0,
            "5": 5.0,
            "8": 8.0,
            "9": 9.0,
            "10": 10.0,
        }
        assert mean(resumed, -3) == 9.0  # steps 8, 9, 10
        assert mean(resumed, -5) == 9.0  # steps 6..10: only 8, 9, 10 were logged
        assert mean(resumed, 1, 6) == 3.0  # steps 1..5
        assert mean(resumed, 4, 9) == pytest.approx((4 + 5 + 8) / 3)

    def test_steps_are_ordered_numerically_not_as_strings(self):
        data = {"10": 100.0, "9": 9.0, "2": 2.0, "1": 1.0}
        assert mean(data, -1) == 100.0  # the last step is 10, not "9"

    def test_step_zero_is_outside_the_default_range(self):
        val = {"0": 0.1, "50": 0.5, "100": 0.9}
        assert mean(val) == pytest.approx(0.7)
        assert mean(val, 0) == pytest.approx(0.5)

    def test_empty_range_raises(self):
        with pytest.raises(ValueError, match="no steps in"):
            mean(ONE_TO_TEN, 20, 30)

    @pytest.mark.parametrize(
        ("data", "p", "expected"),
        [
            ({"1": 1.0, "2": 2.0, "3": 3.0, "4": 4.0, "5": 100.0}, 0.0, 22.0),
            ({"1": 1.0, "2": 2.0, "3": 3.0, "4": 4.0, "5": 100.0}, 0.2, 2.5),
            (ONE_TO_TEN, 0.2, 4.5),  # drops 9 and 10
            ({**{str(i): float(i) for i in range(1, 20)}, "20": 1000.0}, 0.05, 10.0),
            ({"1": 42.0}, 0.5, 42.0),  # keeps at least one value
            ({"1": 1.0, "2": 10.0}, 0.5, 1.0),
            ({"1": 10.0, "2": 1.0}, 0.5, 1.0),  # drops the largest, not the last step
        ],
    )
    def test_ignore_top_p_drops_the_largest_values(self, data, p, expected):
        assert mean(data, ignore_top_p=p) == expected

    def test_ignore_top_p_applies_after_the_range(self):
        assert mean(ONE_TO_TEN, 3, 7, ignore_top_p=0.25) == 4.0  # 3, 4, 5 (6 dropped)

    @pytest.mark.parametrize("p", [-0.1, 1.5])
    def test_ignore_top_p_out_of_bounds(self, p):
        with pytest.raises(ValueError, match="ignore_top_p must be between"):
            mean(ONE_TO_TEN, ignore_top_p=p)


class TestAConstantMetricDoesNotMove:
    """``std(x) > 0`` ("x moves") and ``slope(x) < 0`` ("x falls") must fail on a frozen metric,
    whatever its value: the mean they subtract must be exactly the constant, not an ulp off."""

    # 0.1 x 3 steps and 0.058 x 20 steps: sum / n is an ulp off the value (std was ~1e-17)
    @pytest.mark.parametrize(("value", "steps"), [(0.1, 3), (0.058, 20), (7.9, 304)])
    def test_std_of_a_constant_is_exactly_zero(self, value, steps):
        frozen = {str(s): value for s in range(1, steps + 1)}
        assert not evaluate_rules({"train/kl": frozen}, ['std(data["train/kl"]) > 0'])[0].passed

    def test_slope_of_a_constant_over_a_resumed_run_is_exactly_zero(self):
        # steps with gaps (a resumed run): the naive slope of this constant was -1.2e-35
        frozen = {str(s): 0.115 for s in (69, 132, 178, 267, 331, 334, 335, 419, 442)}
        assert not evaluate_rules({"train/loss": frozen}, ['slope(data["train/loss"]) < 0'])[0].passed


# --------------------------------------------------------------------------- evaluation


class TestEvaluateRule:
    def test_pass_reports_left_hand_side(self):
        result = evaluate_rule(DATA, 'mean(data["train/loss"]) < 0.9')
        assert result.passed
        assert result.value == pytest.approx(0.8133333)
        assert result.message == ""

    def test_fail_reports_value_and_the_false_comparison(self):
        result = evaluate_rule(DATA, 'data["train/loss"]["1"] < 0.5')
        assert not result.passed
        assert result.value == 0.93
        assert "0.93 < 0.5" in result.message

    def test_chained_comparison(self):
        assert evaluate_rule(DATA, '0.5 < data["train/loss"]["3"] < 0.8').passed
        assert not evaluate_rule(DATA, '0.75 < data["train/loss"]["3"] < 0.8').passed

    def test_mean_comparison_between_windows(self):
        rule = 'mean(data["train/loss"], -1) < mean(data["train/loss"], 1, 2)'
        result = evaluate_rule(DATA, rule)
        assert result.passed and result.value == 0.70

    def test_plain_number_metric(self):
        assert evaluate_rule(DATA, 'data["val/final_score"] > 0.5').passed
        assert evaluate_rule(DATA, "max(data['val/final_score']) == 0.7").passed

    def test_missing_metric_fails_naming_it(self):
        result = evaluate_rule(DATA, 'data["train/los"]["1"] < 1.5')
        assert not result.passed
        assert "'train/los' not found" in result.message
        assert "train/loss" in result.message  # the close match is suggested

    def test_missing_metric_inside_a_helper_fails(self):
        result = evaluate_rule(DATA, 'ratio_above(data["train/nope"], 0.5) < 0.1')
        assert not result.passed and "'train/nope'" in result.message

    def test_missing_step_fails_naming_step_and_metric(self):
        result = evaluate_rule(DATA, 'data["train/loss"]["7"] < 1.5')
        assert not result.passed
        assert "'7'" in result.message and "train/loss" in result.message

    def test_int_step_key_gets_a_hint(self):
        result = evaluate_rule(DATA, 'data["train/loss"][1] < 1.5')
        assert not result.passed and "strings" in result.message

    @pytest.mark.parametrize(
        "rule",
        [
            'data["train/kl"]["3"] < 1',
            'data["train/kl"]["3"] != 1',  # NaN != 1 is True in Python
            'not data["train/kl"]["3"] > 1',  # not (NaN > 1) is True in Python
            'data["train/kl"]["3"] and 1 < 2',  # NaN is truthy
            'max(data["train/kl"]) < 10',
            'ratio_above(data["train/kl"], 0.5) < 0.9',
            "data['train/loss']['1'] * 1e308 * 10 > 0",  # arithmetic overflow to inf
        ],
    )
    def test_nan_and_inf_never_pass(self, rule):
        result = evaluate_rule(DATA, rule)
        assert not result.passed
        assert "nan" in result.message or "inf" in result.message

    def test_nan_fail_names_the_metric(self):
        result = evaluate_rule(DATA, 'max(data["train/kl"]) < 10')
        assert "train/kl" in result.message and "'3'" in result.message

    def test_non_bool_result_fails(self):
        result = evaluate_rule(DATA, 'data["train/loss"]["1"]')
        assert not result.passed and "not True/False" in result.message

    def test_membership_and_bool_ops(self):
        assert evaluate_rule(DATA, '"3" in data["train/loss"] and "4" not in data["train/loss"]').passed
        assert evaluate_rule(DATA, 'len(data["train/loss"]) == 3 or 1 > 2').passed
        assert evaluate_rule(DATA, 'abs(-data["train/loss"]["1"]) == 0.93').passed
        assert evaluate_rule(DATA, 'round(data["train/loss"]["2"] * 10) == 8').passed

    def test_arithmetic(self):
        assert evaluate_rule(DATA, "(7 // 2) * 2 + 7 % 2 - 2 ** 3 / 4 == 5").passed

    def test_power_is_float_so_huge_exponents_fail_fast(self):
        # int ** would build a 5000-bit int here, and `10 ** 10 ** 10` would hang
        result = evaluate_rule(DATA, "2 ** 5000 > 1")
        assert not result.passed and "2 ** 5000" in result.message

    def test_exception_in_one_rule_does_not_stop_the_others(self):
        results = evaluate_rules(DATA, ["1 / 0 > 1", 'mean(data["train/loss"], 50) > 0', "1 < 2"])
        assert [r.passed for r in results] == [False, False, True]
        assert "division by zero" in results[0].message
        assert "no steps in" in results[1].message

    def test_json_row(self):
        # issue 3: rows also carry the bound and the relative margin ((0.5 - 0.93) / 0.5)
        row = evaluate_rule(DATA, 'data["train/loss"]["1"] < 0.5').to_json()
        assert row == {
            "rule": 'data["train/loss"]["1"] < 0.5',
            "status": "FAIL",
            "value": 0.93,
            "bound": 0.5,
            "margin": pytest.approx(-0.86),
            "message": row["message"],
        }
        inf_row = evaluate_rule(DATA, "data['train/loss']['1'] * 1e308 * 10 > 0").to_json()
        assert inf_row["status"] == "FAIL" and inf_row["value"] == "inf"
        json.dumps(inf_row, allow_nan=False)  # a report must stay valid JSON


class TestCompileRule:
    @pytest.mark.parametrize(
        ("rule", "construct"),
        [
            ("__import__('os')", "__import__"),
            ("data.keys()", "attribute access"),
            ("data['train/loss'].__class__", "attribute access"),
            ("[x for x in data]", "comprehension"),
            ("lambda: 1", "lambda"),
            ("open('f')", "open"),
            ("data['__class__']", "dunder"),
            ("f'{data}' == 'x'", "f-string"),
            ("min(*data)", "starred"),
            ("mean(**data)", "**kwargs"),
            ("x > 1", "name 'x'"),
            ("min > 1", "name 'min'"),
            ("(y := 1) > 0", "assignment"),
            ("1 if data else 2", "conditional"),
            ("data['train/loss']['1':'3']", "slice"),
            ("{1: 2} == 1", "Dict"),
            ("mean(data['train/loss'], ignore_top=0.1) > 1", "ignore_top"),
            ("data['train/loss'] >", "syntax"),
            ("import os", "syntax"),
        ],
    )
    def test_disallowed_construct_is_a_rule_error_naming_it(self, rule, construct):
        with pytest.raises(RuleError) as info:
            compile_rule(rule)
        assert construct in str(info.value)
        assert repr(rule) in str(info.value)

    def test_nothing_runs_when_one_rule_is_bad(self, monkeypatch):
        calls = []
        monkeypatch.setattr(metric_rules, "evaluate_rule", lambda *a: calls.append(a))
        with pytest.raises(RuleError):
            evaluate_rules(DATA, ["1 < 2", "open('f')"])
        assert calls == []


# ------------------------------------------------------------------------------ loading


class TestLoadMetrics:
    def test_round_trip_with_nan(self, metrics_file):
        data = load_metrics(metrics_file)
        assert data["train/loss"]["2"] == 0.81 and math.isnan(data["train/kl"]["3"])

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("{not json", "not valid JSON"),
            ("[1, 2]", "top level"),
            ('{"train/loss": "high"}', "train/loss"),
            ('{"train/loss": {"one": 0.5}}', "'one'"),
            ('{"train/loss": {"1": null}}', "None"),
        ],
    )
    def test_malformed_file_names_path_and_problem(self, tmp_path, text, problem):
        path = tmp_path / "bad.json"
        path.write_text(text)
        with pytest.raises(MetricsFileError) as info:
            load_metrics(path)
        assert str(path) in str(info.value) and problem in str(info.value)

    def test_missing_file(self, tmp_path):
        with pytest.raises(MetricsFileError, match="cannot read"):
            load_metrics(tmp_path / "absent.json")


# ---------------------------------------------------------------------------------- CLI


class TestCLI:
    def test_all_pass_exits_0_and_prints_the_table(self, metrics_file):
        proc = run_cli(
            str(metrics_file),
            'data["train/loss"]["1"] < 1.5',
            'mean(data["train/loss"], -2) < mean(data["train/loss"], 1, 2)',
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Metric Checks" in proc.stdout
        for column in ("Status", "Check", "Value", "Message"):
            assert column in proc.stdout
        assert proc.stdout.count("│ PASS") == 2 and "FAIL" not in proc.stdout
        assert "2 checks: 2 PASS" in proc.stdout

    def test_missing_metric_exits_1_with_a_fail_row(self, metrics_file, tmp_path):
        report = tmp_path / "report.json"
        # issue 3: "1 < 2" would now be VACUOUS (it reads no metric), so the passing rule
        # reads one; rows carry bound and margin
        proc = run_cli(
            str(metrics_file),
            'data["train/loss"]["3"] < 1.4',
            'data["train/missing"]["1"] < 1.5',
            "--json-report",
            str(report),
        )
        assert proc.returncode == 1
        assert "FAIL" in proc.stdout and "train/missing" in proc.stdout
        assert "Traceback" not in proc.stderr
        rows = json.loads(report.read_text())
        assert [r["status"] for r in rows] == ["PASS", "FAIL"]
        assert rows[0] == {
            "rule": 'data["train/loss"]["3"] < 1.4',
            "status": "PASS",
            "value": 0.7,
            "bound": 1.4,
            "margin": 0.5,
            "message": "",
        }
        assert "train/missing" in rows[1]["message"] and rows[1]["value"] is None

    def test_disallowed_construct_exits_2_before_anything_runs(self, tmp_path):
        # The metrics file does not even exist: the rule is rejected before it is read.
        proc = run_cli(str(tmp_path / "absent.json"), "1 < 2", "__import__('os')")
        assert proc.returncode == 2
        assert "__import__" in proc.stderr and "Traceback" not in proc.stderr
        assert "Metric Checks" not in proc.stdout
        assert len(proc.stderr.strip().splitlines()) == 1

    def test_malformed_json_exits_2_naming_the_path(self, tmp_path):
        path = tmp_path / "broken.json"
        path.write_text('{"train/loss": {"1": 0.5')
        proc = run_cli(str(path), "1 < 2")
        assert proc.returncode == 2
        assert str(path) in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1

    def test_bad_flags_exit_2(self, metrics_file):
        assert run_cli(str(metrics_file)).returncode == 2  # no rule
        assert run_cli(str(metrics_file), "1 < 2", "--no-such-flag").returncode == 2

    @pytest.mark.parametrize("rule", ["data.keys()", "[x for x in data]", "lambda: 1", "open('f')"])
    def test_main_rejects_disallowed_rules(self, metrics_file, capsys, rule):
        assert check_metrics.main([str(metrics_file), rule]) == 2
        assert repr(rule) in capsys.readouterr().err

    def test_main_nan_fails(self, metrics_file, capsys):
        assert check_metrics.main([str(metrics_file), 'data["train/kl"]["3"] != 0']) == 1
        out = capsys.readouterr().out
        assert "FAIL" in out and "nan" in out

    def test_main_rule_text_is_not_read_as_rich_markup(self, metrics_file, capsys):
        rule = 'len(data) > 0 or "[bold]x" in data'  # Value column shows True, not lhs
        # issue 3: it reads no metric, so the vacuity check would (rightly) call it VACUOUS
        assert check_metrics.main([str(metrics_file), rule, "--no-vacuity-check"]) == 0
        assert rule in capsys.readouterr().out
