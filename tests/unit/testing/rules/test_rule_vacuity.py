"""Tests for posttrain/testing/rules/vacuity.py: rules that cannot fail are caught, sound rules are not."""

from __future__ import annotations

import math

import pytest

from posttrain.testing.rules.checker import normalize
from posttrain.testing.rules.interpreter import Evaluation, compile_rule, evaluate
from posttrain.testing.rules.series import Series
from posttrain.testing.rules.vacuity import StandIn, Vacuity, caught, check_vacuity, domain, stand_ins

# A 20-step run in which the loss falls, reward rises and accuracy improves.
DATA = normalize(
    {
        "train/loss": {str(s): 2.0 - 0.05 * s for s in range(1, 21)},
        "train/reward_mean": {str(s): 0.2 + 0.01 * s + (0.02 if s % 3 else -0.02) for s in range(1, 21)},
        "train/accuracy": {str(s): 0.1 + 0.02 * s for s in range(1, 21)},
        "train/clip_fraction": {str(s): 0.01 * (s % 4) for s in range(1, 21)},
        "train/grad_norm": {str(s): 1.0 + 0.1 * s for s in range(1, 21)},
        "val/accuracy": {"0": 0.3, "10": 0.4, "20": 0.5},
        "eval/score": 0.7,
    }
)
# A run resumed after a crash: steps 6 and 7 were never logged.
RESUMED = normalize({"train/loss": {str(s): 2.0 - 0.05 * s for s in (1, 2, 3, 4, 5, 8, 9, 10)}})


def vacuity(rule: str, data=DATA):
    tree = compile_rule(rule)
    evaluation = evaluate(data, tree)
    assert evaluation.passed, f"{rule} must pass on the real data first: {evaluation.message}"
    return check_vacuity(data, tree, evaluation.reads)


@pytest.mark.parametrize(
    "rule",
    [
        'min(data["train/loss"]) >= min(data["train/loss"])',  # true of any series
        'max(data["train/loss"]) >= min(data["train/loss"])',
        'mean(data["train/loss"]) == mean(data["train/loss"])',
        'abs(mean(data["train/loss"])) >= 0',
        'len(data["train/loss"]) >= 1',  # an empty metric fails every rule anyway
        'min(data["train/clip_fraction"]) >= 0',  # a clip fraction is never negative
        'max(data["val/accuracy"]) <= 1',  # an accuracy is never above 1
        'ratio_above(data["train/grad_norm"], 0) == 1',  # a norm is never negative
        'data["eval/score"] >= 0 or data["eval/score"] < 0',
        "1 < 2",  # reads no metric
        "len(data) > 0",
        # bounds no plausible run reaches: the loss is of order 1, the stand-ins go to ~2e3
        'min(data["train/loss"]) >= -1e9',
        'max(data["train/loss"]) < 1e29',
        'abs(slope(data["train/loss"])) < 1e29',
        'max(data["train/grad_norm"]) < 1e6',
    ],
)
def test_vacuous_rule_is_caught(rule):
    result = vacuity(rule)
    assert result.vacuous, result.reason
    assert "cannot" in result.reason or "reads no metric" in result.reason


@pytest.mark.parametrize(
    ("rule", "caught_by"),
    [
        ('mean(data["train/loss"], -5) < 0.8 * mean(data["train/loss"], 1, 6)', "zeros"),
        ('mean(data["train/reward_mean"], -5) > mean(data["train/reward_mean"], 1, 6)', "zeros"),
        ('mean(data["val/accuracy"], -1) - data["val/accuracy"]["0"] >= 0.15', "zeros"),
        ('max(data["train/grad_norm"]) < 100', "constant huge"),
        ('min(data["train/grad_norm"]) > 0', "zeros"),
        ('max(data["train/loss"]) - min(data["train/loss"]) > 0', "zeros"),
        ('mean(data["train/clip_fraction"]) < 0.05', "constant huge"),
        ('std(data["train/reward_mean"]) < 1', "alternating"),
        ('slope(data["train/loss"]) < 0', "zeros"),
        ('first(data["train/accuracy"]) < last(data["train/accuracy"])', "zeros"),
        # each metric's stand-in is scaled to that metric: replaced together they differ too
        ('abs(mean(data["train/loss"]) - mean(data["train/reward_mean"])) < 2', "constant huge"),
        ('data["eval/score"] > 0.5', "zeros"),
        ('all_finite(data["train/loss"])', "NaN"),
        ('len(data["train/loss"]) == 20', "last step missing"),
        ('len(data["train/loss"]) >= 15', "first half only"),
        ('last_step(data["train/loss"]) == 20', "last step missing"),
        ('len(data["train/loss"]) >= 2', "first step only"),
        ('"train/loss" in data', "train/loss absent"),
    ],
)
def test_sound_rule_is_not_flagged(rule, caught_by):
    result = vacuity(rule)
    assert not result.vacuous, result.reason
    assert caught_by in result.reason


@pytest.mark.parametrize(
    ("rule", "caught_by"),
    [
        ('"3" in data["train/loss"]', "first step only"),
        # step 1 survives every shorter run: only the named-step stand-in removes it
        ('"1" in data["train/loss"]', "step 1 missing"),
        ('data["train/loss"]["1"] < 1e40', "step 1 missing"),
    ],
)
def test_membership_of_a_named_step_is_sound(rule, caught_by):
    result = vacuity(rule)
    assert not result.vacuous and caught_by in result.reason, result.reason


def test_named_step_missing_is_what_catches_a_middle_step():
    names = [s.name for s in stand_ins(DATA, {"train/loss": frozenset({"12"})})]
    assert "train/loss: step 12 missing" in names


def test_resumed_run_rules_are_judged_on_their_real_steps():
    assert not vacuity('mean(data["train/loss"], -3) < mean(data["train/loss"], 1, 4)', RESUMED).vacuous
    assert vacuity('mean(data["train/loss"], -3) <= max(data["train/loss"])', RESUMED).vacuous


@pytest.mark.parametrize(("values", "expected"), [
    ([0.5, 1.5, -0.2], 1e3 * 1.7),  # the range, 1.7, is the largest
    ([100.0, 101.0], 1e3 * 101.0),  # the largest |value|
    ([1e-6, 2e-6], 1e3),  # never below 1e3: a 1e-4 bound on a metric of order 1e-6 stays sound
    ([0.0, 0.0], 1e3),
])
def test_huge_is_a_thousand_times_the_observed_scale(values, expected):
    from posttrain.testing.rules.vacuity import huge

    assert huge(Series(list(range(1, len(values) + 1)), values)) == pytest.approx(expected)
    assert huge(values[0]) == pytest.approx(1e3 * max(1.0, abs(values[0])))


def test_a_tight_bound_on_a_tiny_metric_is_sound():
    data = normalize({"train/refit_logprob_error": {str(s): 1e-6 * s for s in range(1, 11)}})
    assert not vacuity('max(data["train/refit_logprob_error"]) < 1e-4', data).vacuous


class TestStandIns:
    def test_never_empty_and_values_stay_on_the_real_steps(self):
        for stand_in in stand_ins(DATA, {"train/loss": frozenset({"1", "20"})}):
            for series in stand_in.replace.values():
                assert series is None or not isinstance(series, Series) or len(series) >= 1
            if "missing" not in stand_in.name and "only" not in stand_in.name and "absent" not in stand_in.name:
                assert list(stand_in.replace["train/loss"].steps) == list(range(1, 21))

    def test_values_are_clipped_to_the_metric_domain(self):
        assert domain("train/clip_fraction") == (0.0, 1.0) and domain("timing/train") == (0.0, math.inf)
        assert domain("train/reward_mean") == (-math.inf, math.inf)
        by_name = {s.name: s for s in stand_ins(DATA, {"train/clip_fraction": frozenset()})}
        assert set(by_name["constant -huge (train/clip_fraction)"].replace["train/clip_fraction"].step_values) == {0.0}
        assert set(by_name["constant huge (train/clip_fraction)"].replace["train/clip_fraction"].step_values) == {1.0}

    def test_several_metrics_are_replaced_together_then_alone(self):
        names = [s.name for s in stand_ins(DATA, {"train/loss": frozenset(), "train/accuracy": frozenset()})]
        assert "zeros (train/accuracy, train/loss)" in names
        assert "zeros (train/accuracy)" in names and "zeros (train/loss)" in names

    def test_plain_number_gets_value_stand_ins_only(self):
        names = [s.name for s in stand_ins(DATA, {"eval/score": frozenset()})]
        assert names == [
            "zeros (eval/score)",
            "constant huge (eval/score)",
            "constant -huge (eval/score)",
            "NaN (eval/score)",
            "eval/score absent",
        ]

    def test_nan_and_absent_are_universal(self):
        universal = {s.name for s in stand_ins(DATA, {"train/loss": frozenset()}) if s.universal}
        assert universal == {"NaN (train/loss)", "train/loss absent", "train/loss: first step only"}


class TestCaught:
    def test_universal_stand_in_counts_only_the_rules_own_verdict(self):
        nan = StandIn("NaN (x)", {}, universal=True)
        assert not caught(Evaluation(False, None, "step '10' is nan", judged=False), nan)
        assert caught(Evaluation(False, None, "step '10' is nan", judged=True), nan)

    def test_any_failure_counts_for_other_stand_ins(self):
        zeros = StandIn("zeros (x)", {})
        assert caught(Evaluation(False, None, "metric 'x' has no values"), zeros)
        assert not caught(Evaluation(True, True, ""), zeros)


def structure(series: Series, named: frozenset[str] = frozenset()) -> list[tuple[str, list[int], bool]]:
    """The structure stand-ins of metric ``x``: (name, steps left, universal)."""
    return [
        (s.name, list(s.replace["x"].steps), s.universal)
        for s in stand_ins({"x": series}, {"x": named})
        if s.name.startswith("x: ")
    ]


class TestStructureStandIns:
    FOUR = Series([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])

    def test_a_rule_that_names_no_step_gets_shorter_runs_and_a_middle_step_missing(self):
        assert structure(self.FOUR) == [
            ("x: last step missing", [1, 2, 3], False),
            ("x: first half only", [1, 2], False),  # two steps: slope can still read it
            ("x: first step only", [1], True),  # one step: every two-point helper refuses it
            ("x: a middle step missing", [1, 2, 4], False),
        ]

    def test_each_named_step_goes_missing_alone_then_all_together(self):
        # "99" is not a logged step and "x" not a step: neither is tried
        assert structure(self.FOUR, frozenset({"3", "1", "99", "x"}))[3:] == [
            ("x: step 1 missing", [2, 3, 4], False),
            ("x: step 3 missing", [1, 2, 4], False),
            ("x: named steps missing", [2, 4], False),
        ]

    def test_one_named_step_is_tried_once_and_replaces_the_middle_step(self):
        assert structure(self.FOUR, frozenset({"2"}))[3:] == [("x: step 2 missing", [1, 3, 4], False)]
        assert structure(self.FOUR, frozenset({"99"}))[3:] == [("x: a middle step missing", [1, 2, 4], False)]

    def test_a_two_step_run_never_loses_every_step(self):
        two = Series([1, 2], [1.0, 2.0])
        assert structure(two, frozenset({"1", "2"})) == [
            ("x: last step missing", [1], True),
            ("x: first half only", [1], True),
            ("x: first step only", [1], True),
            ("x: step 1 missing", [2], False),
            ("x: step 2 missing", [1], False),
        ]

    def test_a_one_step_run_has_no_shorter_run(self):
        assert structure(Series([5], [1.0])) == []


def test_ramps_run_from_zero_to_huge_and_a_one_step_ramp_is_zero():
    by_name = {s.name: s.replace["x"] for s in stand_ins({"x": TestStructureStandIns.FOUR}, {"x": frozenset()})}
    up, down = list(by_name["ramp up (x)"].step_values), list(by_name["ramp down (x)"].step_values)
    assert up == pytest.approx([0.0, 4000 / 3, 8000 / 3, 4000.0]) and up[0] == 0.0 and up[-1] == 4000.0
    assert down == up[::-1]
    one = {s.name: s.replace["x"] for s in stand_ins({"x": Series([5], [2.0])}, {"x": frozenset()})}
    assert list(one["ramp up (x)"].step_values) == list(one["ramp down (x)"].step_values) == [0.0]


def test_the_nan_stand_in_poisons_the_middle_step():
    by_name = {s.name: s.replace["x"] for s in stand_ins({"x": TestStructureStandIns.FOUR}, {"x": frozenset()})}
    values = list(by_name["NaN (x)"].step_values)
    assert [math.isnan(v) for v in values] == [False, False, True, False] and values[:2] == [1.0, 2.0]


class TestVerdict:
    """The exact decision: vacuous or not, why (the VACUOUS message), and how many stand-ins it took."""

    def test_a_rule_that_reads_no_metric_is_vacuous_without_trying_a_stand_in(self):
        assert vacuity("1 < 2") == Vacuity(True, "reads no metric, so no run can make it fail", 0)

    def test_a_sound_rule_names_the_first_stand_in_that_fails_it_and_counts_the_tries(self):
        # zeros pass `< 100`; the second stand-in, constant huge, fails it
        assert vacuity('max(data["train/grad_norm"]) < 100') == Vacuity(
            False, "fails on stand-in: constant huge (train/grad_norm)", 2
        )
        assert vacuity('min(data["train/grad_norm"]) > 0') == Vacuity(
            False, "fails on stand-in: zeros (train/grad_norm)", 1
        )

    def test_a_vacuous_rule_says_how_many_stand_ins_it_passed(self):
        tried = len(list(stand_ins(DATA, {"train/loss": frozenset()})))
        assert vacuity('min(data["train/loss"]) >= -1e9') == Vacuity(
            True,
            f"passes on all {tried} stand-ins for train/loss (zeros, +-1000 x the observed scale, reversed, noise, "
            "ramps, NaN, missing steps, shorter runs): cannot catch a broken run",
            tried,
        )


def test_a_vacuous_rule_over_several_metrics_names_them_all():
    rule = 'min(data["train/loss"]) >= -1e9 and max(data["train/accuracy"]) <= 1'
    result = vacuity(rule)
    assert result.vacuous
    assert f"passes on all {result.tried} stand-ins for train/accuracy, train/loss (" in result.reason


def test_a_metric_with_no_finite_value_still_gets_stand_ins_of_scale_1e3():
    from posttrain.testing.rules.vacuity import huge

    assert huge(Series([1, 2], [math.nan, math.inf])) == 1e3 and huge(math.nan) == 1e3
    # `len(...)` passes on a run of NaNs: its stand-ins are still built, and a shorter run fails it
    data = normalize({"x": {"1": math.nan, "2": math.inf}})
    result = vacuity('len(data["x"]) == 2', data)
    assert not result.vacuous and result.reason == "fails on stand-in: x: last step missing"
