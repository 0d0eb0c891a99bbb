"""Every tool reads a rule's comparison as the checker decides it (``rules/comparisons.py``).

The checker (``check_rules``) is the oracle; each tool that reads a rule's ``<``, ``<=``, ``>`` or
``>=`` afterwards must agree with it, on every operator, with the bound written on either side,
and above all at the bound itself, where ``<`` and ``<=`` differ:

- calibration: the healthy runs that fail the current bound are those the checker fails; the bound
  it recommends passes every healthy run it was calibrated on, and a broken run is reported caught
  exactly when the checker fails it with that bound (one planted far beyond it, one on it, and one
  a float step either side of it); the margin it reports for a broken run has the verdict's sign;
- margins: a margin > 0 passes, < 0 fails, 0 is the bound itself;
- the report's plot: the shaded side is where the checker fails a run, its legend says whether the
  bound itself fails, the ringed steps are those the checker fails, the gauge's colour is the verdict;
- vacuity: a rule is VACUOUS exactly when no value in its metric's range makes the checker fail it.

The checker itself is held to Python's own operators.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from posttrain.testing import calibrate
from posttrain.testing.report.plot_spec import plot_spec
from posttrain.testing.rules import check_rules, comparisons
from posttrain.testing.rules.checker import normalize

ORDER = ("<", "<=", ">", ">=")
BOUNDS = (-2.5, 0.0, 0.1, 7.0)
M, N = 'max(data["m"])', 'max(data["n"])'


def run(**metrics: float | list[float]) -> dict:
    """A metrics dict: each metric's values at steps 1, 2, ... (a number: one step)."""
    return {m: {str(s): v for s, v in enumerate(vs if isinstance(vs, list) else [vs], start=1)}
            for m, vs in metrics.items()}


def passes(data: dict, rule: str) -> bool:
    """The checker's verdict (vacuity aside: the truth of the rule on this run)."""
    return check_rules(data, [rule], vacuity_check=False)[0].passed


def written(value: str, op: str, bound: float, bound_on_left: bool) -> str:
    return f"{bound!r} {op} {value}" if bound_on_left else f"{value} {op} {bound!r}"


# ------------------------------------------------------------------------------------ the checker

EDGES = (-1.0, -0.0, 0.0, 0.1, 1, 1.0, 2.5, 1e-300, 5e-324)


@pytest.mark.parametrize("op", [*ORDER, "==", "!="])
def test_the_checker_decides_each_operator_as_python_does_at_and_around_the_bound(op) -> None:
    for value in EDGES:
        for bound in EDGES:
            expected = eval(f"{value!r} {op} {bound!r}")  # Python's own operator: the independent oracle
            assert passes({"m": value}, f'data["m"] {op} {bound!r}') is expected, (value, op, bound)
            assert passes({"m": value}, f'{bound!r} {op} data["m"]') is eval(f"{bound!r} {op} {value!r}")


# ------------------------------------------------------------------------------------ calibration


def _recommended(rule_of, healthy: dict, op: str, broken_at) -> calibrate.Calibration:
    """Calibrate ``rule_of(bound)`` on ``healthy``, then again with broken runs at the recommended bound
    and around it (``broken_at(value)`` builds a run whose quantity is ``value``)."""
    cal = calibrate.calibrate_rule(rule_of(None), healthy, {}, 0.01)
    assert cal.recommended_bound is not None, cal.reason
    rec, spread = cal.recommended_bound, cal.distribution.std
    planted = {"on": rec, "above": math.nextafter(rec, math.inf), "below": math.nextafter(rec, -math.inf),
               "far above": rec + 50 * spread, "far below": rec - 50 * spread}
    again = calibrate.calibrate_rule(rule_of(None), healthy, {k: normalize(broken_at(v)) for k, v in planted.items()},
                                     0.01)
    assert again.recommended_bound == rec
    return again


def _check_against_the_checker(cal: calibrate.Calibration, rule_of, healthy: dict, broken_at) -> None:
    rec = cal.recommended_bound
    recommended = rule_of(rec)
    # current bound: the false alarms are the healthy runs the checker fails
    assert cal.current_false_alarms == [name for name, data in healthy.items() if not passes(data, rule_of(None))]
    # the recommended bound is on the healthy side of every healthy run it was calibrated on
    assert all(passes(data, recommended) for data in healthy.values()), (recommended, cal.values)
    rows = {row["run"]: row for row in cal.broken}
    for name, row in rows.items():
        caught = not passes(broken_at(row["value"]), recommended)
        assert row["fails_recommended"] is caught, (name, recommended, row)
        # "beyond it by": > 0 for a caught run, < 0 for one that passes, 0 on the bound (caught or not:
        # the checker's strictness decides)
        assert (row["margin"] == 0) if row["value"] == rec else ((row["margin"] > 0) is caught), (name, row)
    assert rows["far above"]["fails_recommended"] is not rows["far below"]["fails_recommended"]
    side = "upper" if rows["far above"]["fails_recommended"] else "lower"
    assert f"recommended {side} bound" in calibrate.render(cal, 0.01)


@settings(max_examples=40)
@given(op=st.sampled_from(ORDER), bound_on_left=st.booleans(), bound=st.sampled_from(BOUNDS),
       offsets=st.lists(st.integers(-3, 3), min_size=3, max_size=6), scale=st.sampled_from([1e-3, 1.0, 250.0]))
@example(op="<", bound_on_left=False, bound=0.1, offsets=[0, -1, -2], scale=1.0)  # a healthy run on the bound
@example(op="<=", bound_on_left=False, bound=0.1, offsets=[0, -1, -2], scale=1.0)
@example(op=">", bound_on_left=True, bound=7.0, offsets=[0, 1, 2], scale=1.0)
@example(op=">=", bound_on_left=True, bound=7.0, offsets=[0, 1, 2], scale=1.0)
def test_calibration_reads_each_operator_as_the_checker_does(op, bound_on_left, bound, offsets, scale) -> None:
    """Healthy runs at ``bound + offset * scale`` (offset 0: exactly on the current bound)."""
    assume(len(set(offsets)) > 1)  # a spread: a recommendation
    healthy = {f"h{i}": run(m=bound + o * scale) for i, o in enumerate(offsets)}

    def rule_of(b: float | None) -> str:
        return written(M, op, bound if b is None else b, bound_on_left)

    cal = _recommended(rule_of, healthy, op, lambda v: run(m=v))
    _check_against_the_checker(cal, rule_of, healthy, lambda v: run(m=v))


@settings(max_examples=25)
@given(op=st.sampled_from(ORDER), offsets=st.lists(st.integers(-3, 3), min_size=3, max_size=6),
       base=st.sampled_from([0.0, 0.5, 40.0]))
@example(op="<", offsets=[0, -1, -2], base=0.5)  # a healthy run where the two sides are equal
@example(op=">=", offsets=[0, 1, 2], base=0.5)
def test_a_rule_whose_bound_reads_the_metrics_is_calibrated_on_the_side_the_checker_fails(op, offsets, base) -> None:
    """``max(m) OP max(n)``: calibrated on ``max(m) - max(n)`` against 0; the recommendation is checked
    as the rule ``max(m) - max(n) OP recommended``."""
    assume(len(set(offsets)) > 1)
    healthy = {f"h{i}": run(m=base + o * 0.25, n=base) for i, o in enumerate(offsets)}

    def rule_of(b: float | None) -> str:
        return f"{M} {op} {N}" if b is None else f"{M} - {N} {op} {b!r}"

    cal = _recommended(rule_of, healthy, op, lambda v: run(m=v, n=0.0))
    assert cal.current_bound == 0.0
    _check_against_the_checker(cal, rule_of, healthy, lambda v: run(m=v, n=0.0))


# ------------------------------------------------------------------------------------ margins


@settings(max_examples=120)
@given(op=st.sampled_from(ORDER), bound_on_left=st.booleans(), bound=st.sampled_from(BOUNDS),
       step=st.sampled_from([-1e3, -1.0, -1e-9, 0.0, 1e-9, 1.0, 1e3]))
@example(op="<", bound_on_left=True, bound=0.1, step=0.0)
@example(op="<=", bound_on_left=True, bound=0.1, step=0.0)
def test_a_margins_sign_is_the_verdicts_and_zero_is_the_bound_itself(op, bound_on_left, bound, step) -> None:
    value = bound + step
    rule = written(M, op, bound, bound_on_left)
    (result,) = check_rules(run(m=value), [rule], vacuity_check=False, min_margin=0.05)
    assert (result.value, result.bound) == (value, bound)
    if bound == 0:
        assert result.margin is None  # no scale for a relative margin
        return
    assert result.margin is not None
    assert result.margin != 0 or value == bound
    if result.margin > 0:
        assert result.status in ("PASS", "WARN"), (rule, value, result)
    elif result.margin < 0:
        assert result.status == "FAIL", (rule, value, result)
    else:  # on the bound: the checker decides (Python's operator), and a pass there is as thin as can be
        assert result.status == ("WARN" if eval(rule.replace(M, repr(value))) else "FAIL"), (rule, result)


# ------------------------------------------------------------------------------------ the report's plot

SERIES = [0.5, 2.0, 1.0, 3.0, 2.0, 1.5]  # steps 1..6; the bound 2.0 sits on steps 2 and 5


@pytest.mark.parametrize("bound_on_left", [False, True], ids=["bound-right", "bound-left"])
@pytest.mark.parametrize("op", ORDER)
def test_the_plot_shades_and_rings_where_the_checker_fails(op, bound_on_left) -> None:
    plots = pytest.importorskip("posttrain.testing.report.plots")  # matplotlib: the report extra (test group)
    bound = 2.0
    fails_above = not passes(run(m=bound + 100), written(M, op, bound, bound_on_left))
    assert fails_above is passes(run(m=bound - 100), written(M, op, bound, bound_on_left))
    fails_at_the_bound = not passes(run(m=bound), written(M, op, bound, bound_on_left))
    for helper in ("max", "min", "last"):
        rule = written(f'{helper}(data["m"])', op, bound, bound_on_left)
        data = normalize(run(m=SERIES))
        (result,) = check_rules(data, [rule], vacuity_check=False)
        plot = plot_spec(1, result, data)
        (level,) = [lv for lv in plot.levels if lv.role == "bound"]
        assert level.y == bound and level.fails == ("above" if fails_above else "below"), (rule, level)
        # a per-step rule (any one step beyond it fails it) rings exactly the steps the checker fails
        per_step = helper == "last" or helper == ("max" if fails_above else "min")
        steps = [6] if helper == "last" else range(1, 7)
        expected = [s for s in steps if not passes(run(m=SERIES[s - 1]), rule)] if per_step else []
        assert [s for _, s in plot.failing] == expected, rule
        (gauge,) = plot.comparisons
        assert gauge.holds is result.passed and (gauge.value, gauge.bound) == (result.value, bound), rule
    figure = plots.rule_figure(plot)  # the last rule's: last(m) OP 2 on a run that ends at 1.5
    (shade,) = [a for ax in figure.axes for a in ax.get_children() if a.get_gid() == "rule-1-bound-0-failing-side"]
    low, high = float(shade.get_y()), float(shade.get_y() + shade.get_height())  # in the metric's units
    assert (low if fails_above else high) == bound and (high > bound) is fails_above, (rule, low, high)
    # the legend states whether the bound itself fails: "fails >= 2" for `< 2`, "fails > 2" for `<= 2`
    relation = shade.get_label().removeprefix("fails ").rsplit(" ", 1)[0]
    assert eval(f"{bound} {relation} {bound}") is fails_at_the_bound, shade.get_label()


# ------------------------------------------------------------------------------------ vacuity

DOMAIN_METRIC = "train/clip_fraction"  # values in [0, 1] (vacuity.METRIC_DOMAINS)
IN_DOMAIN = (0.0, 5e-324, 0.25, 0.5, 0.75, math.nextafter(1.0, 0.0), 1.0)


@pytest.mark.parametrize("bound_on_left", [False, True], ids=["bound-right", "bound-left"])
@pytest.mark.parametrize("op", ORDER)
@pytest.mark.parametrize("helper", ["min", "max"])
def test_a_rule_is_vacuous_exactly_when_no_value_in_its_range_fails_the_checker(helper, op, bound_on_left) -> None:
    for bound in (0.0, 0.5, 1.0):
        rule = written(f'{helper}(data["{DOMAIN_METRIC}"])', op, bound, bound_on_left)
        healthy = [run(**{DOMAIN_METRIC: [v, w]}) for v in IN_DOMAIN for w in IN_DOMAIN]
        passing = [data for data in healthy if passes(data, rule)]
        if not passing:
            continue  # no run in the range passes: nothing for the vacuity check to judge
        can_fail = any(not passes(data, rule) for data in healthy)
        (result,) = check_rules(passing[0], [rule])
        assert (result.status == "VACUOUS") is not can_fail, (rule, result)


@pytest.mark.parametrize(("op", "at_bound"), [("<", False), ("<=", True), (">", False), (">=", True)])
def test_a_value_at_the_bound_holds_only_for_a_non_strict_comparison(op, at_bound) -> None:
    assert comparisons.of(op).holds(2.0, 2.0) is at_bound


@pytest.mark.parametrize("symbol", ["==", "!=", "in", "not in"])
def test_a_comparison_without_an_order_has_no_failing_side_slack_or_negation_and_says_so(symbol) -> None:
    comparison = comparisons.of(symbol)
    for use in (lambda: comparison.fails, lambda: comparison.negated, lambda: comparison.slack(1.0, 2.0)):
        with pytest.raises(ValueError, match=f"^`{symbol}` compares no value with a bound$"):
            use()
