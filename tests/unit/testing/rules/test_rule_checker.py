"""Tests for posttrain/testing/rules/checker.py: how evaluations become PASS, WARN, FAIL, VACUOUS, SKIP."""

from __future__ import annotations

import pytest

from posttrain.testing.rules import interpreter as metric_rules
from posttrain.testing.rules.checker import CheckOptions, RuleSpec, normalize, run_checks
from posttrain.testing.rules.interpreter import RuleError
from posttrain.testing.rules.series import Series

DATA = {
    "train/loss": {str(s): 2.0 - 0.1 * s for s in range(1, 11)},
    "train/clip_fraction": {str(s): 0.0 if s % 2 else 0.29 for s in range(1, 11)},
    "eval/score": 0.7,
}
STOPPED = {"train/loss": {str(s): 2.0 - 0.1 * s for s in range(1, 7)}}


def check(rule: str, data=DATA, **options) -> metric_rules.CheckResult:
    return run_checks(data, [RuleSpec(rule)], CheckOptions(**options))[0]


def test_pass():
    result = check('mean(data["train/loss"], -3) < mean(data["train/loss"], 1, 4)')
    assert result.status == "PASS" and result.message == ""


def test_fail_keeps_value_and_message():
    result = check('max(data["train/loss"]) < 1')
    assert result.status == "FAIL" and result.value == pytest.approx(1.9) and "is False" in result.message


def test_vacuous_is_a_failure_unless_the_check_is_off():
    rule = 'min(data["train/clip_fraction"]) >= 0'
    result = check(rule)
    assert result.status == "VACUOUS" and not result.passed and "stand-ins" in result.message
    assert check(rule, vacuity_check=False).status == "PASS"


def test_thin_margin_warns_but_passes():
    rule = 'max(data["train/clip_fraction"]) < 0.3'  # 0.29 vs 0.3: 3.3%
    result = check(rule, min_margin=0.05)
    assert result.status == "WARN" and result.passed
    assert "3.3% margin" in result.message
    assert check(rule, min_margin=0.03).status == "PASS"
    assert check(rule).status == "PASS"  # WARN is off by default


def test_a_vacuous_rule_is_vacuous_before_it_is_thin():
    assert check('max(data["train/clip_fraction"]) <= 1', min_margin=0.05).status == "VACUOUS"


@pytest.mark.parametrize(
    "rule",
    ['max(data["train/loss"]) < 10', 'data["train/loss"]["1"] > 0', "all_finite(data['train/loss'])"],
)
def test_run_that_stopped_early_fails_every_rule(rule):
    result = check(rule, data=STOPPED, expect_steps=10)
    assert result.status == "FAIL" and result.message == "run stopped at step 6 of 10"


def test_stopped_early_and_false_says_both():
    result = check('max(data["train/loss"]) < 1', data=STOPPED, expect_steps=10)
    assert result.message.startswith("run stopped at step 6 of 10; ") and "is False" in result.message


def test_complete_run_passes_with_expect_steps():
    assert check('max(data["train/loss"]) < 10', expect_steps=10).status == "PASS"


def test_plain_number_rule_in_a_stopped_run_fails_too():
    data = {**STOPPED, "eval/score": 0.7}
    assert check('data["eval/score"] > 0.5', data=data, expect_steps=10).status == "FAIL"
    assert check('data["eval/score"] > 0.5', data=data, expect_steps=6).status == "PASS"


PLAIN_NUMBER_RULES = ['data["eval/score"] and 1 < 2', 'data["eval/score"] > 0.5', 'max(data["eval/score"]) > 0']


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("rule", PLAIN_NUMBER_RULES)
def test_plain_number_nan_or_inf_never_passes(bad, rule):
    result = check(rule, data={"eval/score": bad})
    assert result.status == "FAIL" and "eval/score" in result.message


def test_skip_is_not_evaluated():
    result = run_checks(DATA, [RuleSpec('data["nope"]["1"] > 0', "nope not logged")], CheckOptions())[0]
    assert result.status == "SKIP" and result.passed and result.message == "nope not logged"


def test_bad_rule_stops_everything_before_evaluation(monkeypatch):
    calls = []
    monkeypatch.setattr("posttrain.testing.rules.checker.evaluate", lambda *a: calls.append(a))
    with pytest.raises(RuleError, match="attribute access"):
        run_checks(DATA, [RuleSpec("1 < 2"), RuleSpec("data.keys()")], CheckOptions())
    assert calls == []


def test_normalize_turns_step_dicts_into_series_once():
    data = normalize(DATA)
    assert isinstance(data["train/loss"], Series) and data["eval/score"] == 0.7
    assert normalize(data)["train/loss"] is data["train/loss"]
