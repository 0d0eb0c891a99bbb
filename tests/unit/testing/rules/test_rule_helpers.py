"""Tests for posttrain/testing/rules/helpers.py (the helpers issue 3 added) and posttrain/testing/rules/series.py."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from posttrain.testing.rules.errors import FinitenessCheckFailed, NonFiniteError
from posttrain.testing.rules.helpers import (
    all_finite,
    exact_mean,
    first,
    last,
    last_step,
    mean,
    median,
    metric_max,
    metric_min,
    round_,
    slope,
    std,
)
from posttrain.testing.rules.interpreter import evaluate_rule
from posttrain.testing.rules.series import Series, as_series

ONE_TO_TEN = {str(i): float(i) for i in range(1, 11)}
# steps 6 and 7 lost (crash after the step-5 checkpoint, resumed at 8)
RESUMED = {str(s): float(s) for s in (1, 2, 3, 4, 5, 8, 9, 10)}
UNSORTED = {"10": 100.0, "9": 9.0, "2": 2.0}  # numeric order: 2, 9, 10


# ------------------------------------------------------------------------------- Series


class TestSeries:
    def test_from_mapping_sorts_steps_numerically(self):
        series = Series.from_mapping(UNSORTED)
        assert list(series.steps) == [2, 9, 10]
        assert list(series.step_values) == [2.0, 9.0, 100.0]
        assert list(series) == ["2", "9", "10"]

    def test_mapping_protocol_uses_string_steps(self):
        series = Series.from_mapping(UNSORTED)
        assert series["9"] == 9.0 and len(series) == 3
        assert "10" in series and 10 not in series and "11" not in series
        assert series == {"2": 2.0, "9": 9.0, "10": 100.0}

    def test_from_validated_parses_steps_lazily_in_numeric_order(self):
        raw = {"1": 1.0, "10": 10.0, "2": 2.0}  # the logger's json.dumps(sort_keys=True) order
        series = Series.from_validated(raw)
        assert series["10"] == 10.0 and len(series) == 3
        assert list(series.steps) == [1, 2, 10] and list(series.step_values) == [1.0, 2.0, 10.0]

    def test_window_is_end_exclusive(self):
        steps, values = as_series(RESUMED).window(4, 9)
        assert list(steps) == [4, 5, 8] and list(values) == [4.0, 5.0, 8.0]

    def test_first_non_finite_names_the_step(self):
        assert as_series({"1": 1.0, "2": math.inf, "3": math.nan}).first_non_finite() == (2, math.inf)
        assert as_series(ONE_TO_TEN).first_non_finite() is None

    def test_as_series_of_list_number_and_bad_input(self):
        assert list(as_series([5.0, 6.0]).steps) == [1, 2]
        assert list(as_series(0.7).step_values) == [0.7]
        with pytest.raises(TypeError, match="step '2'"):
            as_series({"1": 1.0, "2": "high"})
        with pytest.raises(TypeError):
            as_series("train/loss")

    def test_repr_is_short_for_long_series(self):
        assert repr(as_series({str(s): 0.0 for s in range(1, 10_001)})) == "Series(10000 steps, 1..10000)"
        assert repr(Series([], [])) == "Series(no steps)"

    def test_a_plain_number_is_one_value_at_step_1(self):
        series = as_series(0.7)
        assert (list(series.steps), list(series.step_values)) == ([1], [0.7])

    def test_what_is_not_a_metric_a_list_or_a_number_is_named_with_its_type(self):
        with pytest.raises(TypeError) as e:
            as_series("train/loss")
        assert str(e.value) == "'train/loss' (str) is not a metric, a list or a number"

    def test_a_value_that_is_not_a_number_is_named_with_its_step_and_type(self):
        with pytest.raises(TypeError) as e:
            as_series({"1": 1.0, "2": "high"})
        assert str(e.value) == "step '2' is 'high' (str), not a number"


# ---------------------------------------------------------------------------- exact mean


class TestExactMean:
    def test_rounds_like_statistics_mean_where_fsum_over_n_does_not(self):
        vals = [0.1, 0.2, 0.3]
        assert math.fsum(vals) / 3 != statistics.mean(vals)  # the case a plain fmean gets wrong
        assert exact_mean(vals) == statistics.mean(vals) == 0.2

    def test_matches_statistics_mean_on_random_data(self):
        rng = random.Random(0)
        for _ in range(300):
            n = rng.randint(1, 50)
            scale = 10.0 ** rng.randint(-8, 8)
            vals = [rng.uniform(-1, 1) * scale for _ in range(n)]
            assert exact_mean(vals) == statistics.mean(vals), vals

    def test_empty(self):
        with pytest.raises(ValueError, match="no values"):
            exact_mean([])

    def test_empty_says_exactly_no_values(self):
        with pytest.raises(ValueError) as e:
            exact_mean([])
        assert str(e.value) == "no values"


# ------------------------------------------------------------------- first, last, last_step


class TestFirstLastLastStep:
    def test_by_step_number_not_key_order(self):
        assert first(UNSORTED) == 2.0
        assert last(UNSORTED) == 100.0
        assert last_step(UNSORTED) == 10

    def test_resumed_run(self):
        assert last_step(RESUMED) == 10 and last(RESUMED) == 10.0 and first(RESUMED) == 1.0

    def test_plain_number_is_one_value(self):
        assert first(0.7) == last(0.7) == 0.7

    @pytest.mark.parametrize("helper", [first, last, last_step])
    def test_empty_and_nan(self, helper):
        with pytest.raises(ValueError, match="no values"):
            helper({})
        with pytest.raises(NonFiniteError, match="step '2' is nan"):
            helper({"1": 1.0, "2": math.nan})


# ------------------------------------------------------------------------------ all_finite


class TestAllFinite:
    def test_true_when_every_value_is_finite(self):
        assert all_finite(ONE_TO_TEN) is True
        assert all_finite(0.5) is True

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
    def test_names_the_first_bad_step(self, bad):
        with pytest.raises(FinitenessCheckFailed, match=f"step '3' is {bad}"):
            all_finite({"1": 1.0, "2": 2.0, "3": bad, "4": math.nan})

    def test_empty_is_not_finite_evidence(self):
        with pytest.raises(ValueError, match="no values"):
            all_finite({})

    def test_in_a_rule_the_fail_names_metric_and_step(self):
        result = evaluate_rule({"train/loss": {"1": 1.0, "2": math.nan}}, 'all_finite(data["train/loss"])')
        assert not result.passed
        assert result.message == "metric 'train/loss': step '2' is nan"


# ------------------------------------------------------------------------------ std, slope


class TestStd:
    def test_population_standard_deviation(self):
        data = dict(zip(map(str, range(1, 9)), [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0], strict=True))
        assert std(data) == pytest.approx(2.0)
        assert std(data) == pytest.approx(statistics.pstdev(data.values()))

    def test_single_value_and_constant(self):
        assert std({"1": 3.0}) == 0.0
        assert std({"1": 3.0, "2": 3.0, "3": 3.0}) == 0.0

    def test_range_like_mean(self):
        assert std(ONE_TO_TEN, -2) == pytest.approx(0.5)  # steps 9, 10
        assert std(ONE_TO_TEN, 1, 3) == pytest.approx(0.5)  # steps 1, 2

    def test_empty_range_and_nan(self):
        with pytest.raises(ValueError, match="no steps in"):
            std(ONE_TO_TEN, 20)
        with pytest.raises(NonFiniteError):
            std({"1": 1.0, "2": math.inf})


class TestSlope:
    def test_exact_line(self):
        assert slope({str(s): 3.0 * s + 1.0 for s in range(1, 11)}) == pytest.approx(3.0)

    def test_uses_step_numbers_across_resume_gaps(self):
        line = {str(s): 2.0 * s for s in (1, 2, 3, 10, 11)}  # positions would give a wrong slope
        assert slope(line) == pytest.approx(2.0)

    def test_decreasing_noisy_and_constant(self):
        assert slope({str(s): 10.0 - s + (0.5 if s % 2 else -0.5) for s in range(1, 21)}) < 0
        assert slope({"1": 4.0, "2": 4.0, "3": 4.0}) == 0.0

    def test_range_like_mean(self):
        v_shape = {str(s): float(abs(s - 10)) for s in range(1, 20)}
        assert slope(v_shape, 1, 11) == pytest.approx(-1.0)  # steps 1..10
        assert slope(v_shape, -9) == pytest.approx(1.0)  # steps 11..19

    def test_needs_two_steps(self):
        with pytest.raises(ValueError, match="at least two steps"):
            slope({"1": 1.0})
        with pytest.raises(ValueError, match="at least two steps"):
            slope(ONE_TO_TEN, -1)


# ------------------------------------------------------------------------- mean ranges


class TestMeanRanges:
    """Range edge cases of ``mean`` beyond those in test_check_metrics.py."""

    def test_range_end_past_the_last_step(self):
        assert mean(ONE_TO_TEN, 9, 100) == 9.5

    def test_negative_start_longer_than_the_run(self):
        assert mean(ONE_TO_TEN, -50) == 5.5

    def test_start_equal_end_is_empty(self):
        with pytest.raises(ValueError, match=r"no steps in \[5, 5\)"):
            mean(ONE_TO_TEN, 5, 5)

    def test_range_inside_a_resume_gap_is_empty(self):
        with pytest.raises(ValueError, match=r"no steps in \[6, 8\)"):
            mean(RESUMED, 6, 8)

    def test_negative_end_with_gap(self):
        assert mean(RESUMED, 1, -2) == pytest.approx(23 / 6)  # end = 9: steps 1..5, 8

    def test_plain_number(self):
        assert mean(0.25) == 0.25

    def test_range_end_1_is_step_0_only(self):
        # range_end <= 0 counts back from the last step; 1 is a step number like any other
        assert mean({"0": 5.0, "1": 1.0, "2": 2.0}, 0, 1) == 5.0

    def test_an_empty_range_fails_the_rule_naming_the_range_and_the_logged_steps(self):
        result = evaluate_rule({"x": RESUMED}, 'mean(data["x"], 6, 8) > 0')
        assert result.message == '`mean(data[\'x\'], 6, 8)`: no steps in [6, 8) (logged: 1..10)'


# --------------------------------------------------------------------- helpers in rules


class TestHelpersInRules:
    @pytest.mark.parametrize(
        "rule",
        [
            'slope(data["x"]) > 0.9',
            'std(data["x"], -2) == 0.5',
            'first(data["x"]) == 1 and last(data["x"]) == 10',
            'last_step(data["x"]) == 10',
            'all_finite(data["x"])',
        ],
    )
    def test_callable_from_a_rule(self, rule):
        assert evaluate_rule({"x": ONE_TO_TEN}, rule).passed


class TestRound:
    def test_like_builtin_round(self):
        assert round_(0.81 * 10) == 8 and round_(2.675, 2) == round(2.675, 2) and round_(7) == 7

    @pytest.mark.timeout(5)
    def test_huge_ndigits_on_an_int_returns_at_once(self):
        # builtin round(5, -10**18) builds 10**10**18 and never returns
        assert round_(5, -(10**18)) == 0.0
        assert evaluate_rule({}, "round(5, -1000000000000000000) == 0").passed

    def test_bad_arguments(self):
        with pytest.raises(TypeError):
            round_("5")
        with pytest.raises(TypeError):
            round_(5.0, 1.5)


# ------------------------------------------------- exact messages and defaults (mutation testing)


class TestHelperFailMessages:
    """A helper's error is the rule's one-line FAIL message: ``<the call>: <the helper's words>``."""

    @pytest.mark.parametrize(
        ("rule", "message"),
        [
            ("first([]) > 0", "`first([])`: no values"),
            ("last([]) > 0", "`last([])`: no values"),
            ("last_step([]) > 0", "`last_step([])`: no values"),
            ("ratio_above([], 1) > 0", "`ratio_above([], 1)`: no values to compare with the threshold"),
            ("mean([]) > 0", "`mean([])`: no values"),
            ("all_finite([])", "`all_finite([])`: no values"),
            ("mean([1], ignore_top_p=1.5) > 0",
             "`mean([1], ignore_top_p=1.5)`: ignore_top_p must be between 0.0 and 1.0, got 1.5"),
            ("round('5') == 5", "`round('5')`: round() of '5', not a number"),
            ("round(5.5, 1.5) == 5", "`round(5.5, 1.5)`: round() ndigits must be an int, got 1.5"),
            ("round(5.5, True) == 5", "`round(5.5, True)`: round() ndigits must be an int, got True"),
        ],
    )
    def test_a_helper_that_cannot_answer_fails_the_rule_with_its_exact_message(self, rule, message):
        result = evaluate_rule({}, rule)
        assert (result.status, result.message) == ("FAIL", message)


def test_median_reads_the_whole_run_from_step_1_by_default():
    # steps 1..3: the median of all three is 5; from step 2 on it would be 5.5
    assert median({"1": 1.0, "2": 5.0, "3": 6.0}) == 5.0
    assert median({"0": 100.0, "1": 1.0, "2": 5.0, "3": 6.0}) == 5.0  # step 0 only with range_start=0


def test_the_slope_of_a_line_far_from_zero_is_exact():
    # a count or timestamp near 1e16 rising by 2 a step: the centred sums keep it exact, where
    # sums of uncentred terms (x + x_mean, y + y_mean) lose the slope to rounding
    assert slope({str(s): 1e16 + 2.0 * s for s in range(1, 11)}) == 2.0


class TestMeanIgnoreTopP:
    def test_the_largest_values_are_dropped_as_outliers(self):
        assert mean([1.0, 100.0, 2.0, 3.0], ignore_top_p=0.25) == 2.0  # keeps int(4 * 0.75) = 3: 1, 2, 3
        assert mean([1.0, 100.0, 2.0, 3.0], ignore_top_p=0.5) == 1.5

    def test_dropping_everything_keeps_the_smallest_value(self):
        assert mean([3.0, 1.0, 2.0], ignore_top_p=1.0) == 1.0
        assert mean([3.0, 1.0, 2.0], ignore_top_p=0.9) == 1.0  # int(3 * 0.1) = 0

    @pytest.mark.parametrize("p", [-0.1, 1.01, 1.5])
    def test_a_fraction_outside_0_and_1_is_refused(self, p):
        with pytest.raises(ValueError) as e:
            mean([1.0, 2.0], ignore_top_p=p)
        assert str(e.value) == f"ignore_top_p must be between 0.0 and 1.0, got {p}"


class TestSeveralNumbers:
    """``min(a, b)`` / ``max(a, b)`` called from Python (a rule refuses inf arguments before the helper)."""

    def test_a_non_number_argument_is_named_by_position(self):
        with pytest.raises(TypeError) as e:
            metric_max(1.0, "a")
        assert str(e.value) == "argument 2 is 'a', not a number"

    def test_a_non_finite_argument_is_named_by_position(self):
        with pytest.raises(NonFiniteError) as e:
            metric_min(math.nan, 1.0)
        assert str(e.value) == "argument 1 is nan; non-finite values never pass"
