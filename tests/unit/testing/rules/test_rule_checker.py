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


def test_evaluate_rule_judges_the_compiled_tree_it_is_given_and_reports_the_rules_text():
    # evaluate_rules compiles every rule first, then hands each tree over with the text it came from
    result = metric_rules.evaluate_rule(DATA, "my label", metric_rules.compile_rule('data["eval/score"] > 0.5'))
    assert (result.rule, result.status, result.value) == ("my label", "PASS", 0.7)


@pytest.mark.parametrize("rule", ["'a' + 1 > 0", "1 + 'a' > 0", "-'a' > 0"])
def test_arithmetic_on_a_value_that_is_not_a_number_fails_naming_it(rule):
    result = metric_rules.evaluate_rule({}, rule)
    assert (result.status, result.message) == ("FAIL", "TypeError: `'a'` is 'a' (str), not a number")


def test_evaluate_rules_judges_each_rule_in_order_after_compiling_them_all(monkeypatch):
    results = metric_rules.evaluate_rules(DATA, ["1 < 2", 'max(data["train/loss"]) < 1'])
    assert [(r.rule, r.status) for r in results] == [("1 < 2", "PASS"), ('max(data["train/loss"]) < 1', "FAIL")]
    assert results[1].message == "1.9 < 1 is False"
    calls = []
    monkeypatch.setattr(metric_rules, "evaluate", lambda *a: calls.append(a))
    with pytest.raises(RuleError, match="attribute access"):
        metric_rules.evaluate_rules(DATA, ["1 < 2", "data.keys()"])
    assert calls == []


# ------------------------------------------------------ the interpreter's FAIL messages and values

NAN_RUN = normalize(
    {"x": {"1": 1.0, "2": float("nan")}, "y": {"1": 1.0}, "z": {str(s): float(s) for s in range(1, 11)}}
)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        # a NaN a helper found names the metric it read, else the argument's text
        ('all_finite(data["x"])', "metric 'x': step '2' is nan"),
        ('all_finite(data["x"] or data["y"])', "data['x'] or data['y']: step '2' is nan"),
        ('all_finite(values=data["x"])', "all_finite(values=data['x']): step '2' is nan"),
        ("max(1, 'a') > 0", "`max(1, 'a')`: argument 2 is 'a', not a number"),
        ("min('a', 1) > 0", "`min('a', 1)`: argument 1 is 'a', not a number"),
    ],
)
def test_a_helper_failure_names_what_the_helper_read(rule, message):
    result = metric_rules.evaluate_rule(NAN_RUN, rule)
    assert (result.status, result.message) == ("FAIL", message)


def test_a_failed_comparison_shows_each_side_cut_to_60_characters():
    sixty, sixty_one = "a" * 60, "b" * 61
    assert metric_rules.evaluate_rule({}, f"'{sixty}' == 'c'").message == f"{sixty} == c is False"
    assert metric_rules.evaluate_rule({}, f"'{sixty_one}' == 'c'").message == f"{'b' * 57}... == c is False"


def test_keyword_arguments_reach_the_helper():
    assert metric_rules.evaluate_rule(NAN_RUN, 'mean(data["z"], range_start=9) == 9.5').status == "PASS"
    assert metric_rules.evaluate_rule(NAN_RUN, 'mean(data["z"], 1, ignore_top_p=0.5) == 3').status == "PASS"


def test_the_value_of_a_comparison_without_a_margin_is_its_left_side():
    result = metric_rules.evaluate_rule(NAN_RUN, 'len(data["z"]) == 10')
    assert (result.status, result.value, result.bound) == ("PASS", 10, None)


@pytest.mark.parametrize("rule", ['"3" in data["z"]', '"3" not in data["z"]'])
def test_a_membership_test_records_the_step_it_names(rule):
    # the vacuity check tries that step missing: what makes `"3" not in data["z"]` sound
    assert metric_rules.evaluate(NAN_RUN, metric_rules.compile_rule(rule)).reads == {"z": frozenset({"3"})}


LOOKUP_RUN = normalize(
    {"z": {str(s): float(s) for s in range(1, 11)}, "s": 0.5, **{f"train/loss_{c}": {"1": 1.0} for c in "abcde"}}
)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        # the one-line FAIL messages of the interpreter, word for word
        ("1 > 2 or 2 > 3", "rule is False"),  # no top-level comparison to show
        ('mean(data["z"])', "rule gave 5.5 (float), not True/False"),
        ('data["zz"] > 0', "metric 'zz' not found in the metrics file (did you mean 'z'?)"),
        ('data["train/loss_"] > 0',  # at most three suggestions, the closest first
         "metric 'train/loss_' not found in the metrics file (did you mean 'train/loss_e', 'train/loss_d', "
         "'train/loss_c'?)"),
        ('data["qqq"] > 0', "metric 'qqq' not found in the metrics file"),
        ('data["z"]["11"] > 0', "step '11' not in data['z']; logged: 1..10 (10 steps)"),
        ('data["z"][3] > 0', "step 3 not in data['z'] (step keys are strings); logged: 1..10 (10 steps)"),
        ("[1, 2][5] > 0", "`[1, 2][5]`: IndexError('list index out of range')"),
        ('data["s"]["1"] > 0', "`data['s']['1']`: TypeError(\"'float' object is not subscriptable\")"),
        ("1 / 0 > 1", "`1 / 0`: division by zero"),
    ],
)
def test_the_interpreter_names_why_a_rule_failed(rule, message):
    result = metric_rules.evaluate_rule(LOOKUP_RUN, rule)
    assert (result.status, result.message) == ("FAIL", message)


@pytest.mark.parametrize("rule", ["+2 == 2", "-2 == 0 - 2", "mean([1, 2, 3]) == 2", "max([1, 5, 2]) == 5"])
def test_unary_signs_and_list_literals_evaluate_like_python(rule):
    assert metric_rules.evaluate_rule({}, rule).status == "PASS"


def test_a_rule_that_failed_before_its_comparison_has_no_value_and_was_not_judged():
    evaluation = metric_rules.evaluate(LOOKUP_RUN, metric_rules.compile_rule('data["zz"] > 0'))
    assert evaluation == metric_rules.Evaluation(
        False, None, "metric 'zz' not found in the metrics file (did you mean 'z'?)", (), {"zz": frozenset()}, False
    )
    assert metric_rules.evaluate_rule(LOOKUP_RUN, 'data["zz"] > 0').value is None


# The public API (posttrain.testing.rules.check_rules) and the check-metrics command judge alike.
API_RUN = {"train/loss": {str(s): 1.0 / s for s in range(1, 11)}, "train/kl": {str(s): 0.01 * s for s in range(1, 9)}}
API_RULES = [
    'std(data["train/loss"]) >= 0',  # true of every run: VACUOUS
    'max(data["train/loss"]) >= min(data["train/loss"])',  # also
    'mean(data["train/loss"], -3) < 0.2',  # a real check that passes
    'slope(data["train/loss"]) > 0',  # one that fails
    'max(data["train/kl"]) < 0.5',  # passes, but kl stops at step 8
]


@pytest.mark.parametrize("flags", [[], ["--no-vacuity-check"], ["--expect-steps", "10"], ["--min-margin", "0.9"]],
                         ids=["defaults", "no_vacuity_check", "expect_steps", "min_margin"])
def test_the_public_api_judges_every_rule_as_the_check_metrics_command_does(tmp_path, flags):
    import json

    from posttrain.testing import check_metrics
    from posttrain.testing.rules import check_rules

    metrics_file, report = tmp_path / "metrics.json", tmp_path / "report.json"
    metrics_file.write_text(json.dumps(API_RUN))
    check_metrics.main([str(metrics_file), *API_RULES, *flags, "--output-json", str(report)])
    cli = [(row["status"], row["message"]) for row in json.loads(report.read_text())]
    options = {"--no-vacuity-check": {"vacuity_check": False}, "--expect-steps": {"expect_steps": 10},
               "--min-margin": {"min_margin": 0.9}}.get(flags[0], {}) if flags else {}
    api = [(r.status, r.message) for r in check_rules(API_RUN, API_RULES, **options)]
    assert api == cli
    if not flags:  # the API refuses a rule that cannot fail, as the command does
        assert [s for s, _ in api][:2] == ["VACUOUS", "VACUOUS"]
        assert not any(r.passed for r in check_rules(API_RUN, API_RULES[:2]))
