"""The rule engine at its edges, as properties over generated runs (hypothesis), not hand cases only.

- Completeness (``--expect-steps N``): a rule passes when the run and every metric it reads reach
  step N, and fails, naming where it stopped, when the run or any one of them stops at N - 1.
- Non-finite values: a NaN, +inf or -inf at the first, a middle or the last step (step 0, the
  evaluation before training, included) makes every helper's rule FAIL in both directions
  (``r`` and ``not (r)``), naming the metric and the step, also when the value lies outside the
  steps the helper averages over.
- Vacuity: a rule true of every possible series (``std(x) >= 0``, ``max(x) >= min(x)``, ...) is
  VACUOUS whatever the run, short runs included; the per-metric domains are in test_rule_domains.py.
"""

from __future__ import annotations

import math

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from posttrain.testing.rules.checker import CheckOptions, RuleSpec, run_checks
from posttrain.testing.rules.helpers import HELPERS
from posttrain.testing.rules.interpreter import compile_rule, evaluate

VALUES = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
NON_FINITE = (math.nan, math.inf, -math.inf)


def status(data: dict, rule: str, **options) -> tuple[str, str]:
    result = run_checks(data, [RuleSpec(rule)], CheckOptions(**options))[0]
    return result.status, result.message


# ---------------------------------------------------------------------------- completeness

# Ways a rule reads a metric; each passes on the generated values (0.5 at every step).
READS = (
    'min(data["{m}"]) > 0',
    'data["{m}"]["1"] > 0',
    'last_step(data["{m}"]) >= 1',
    '"1" in data["{m}"]',
    'mean(data["{m}"], -2) > 0',
)


@settings(max_examples=150)
@given(expect=st.integers(3, 40),
       metrics=st.lists(st.tuples(st.integers(-2, 2), st.booleans()), min_size=1, max_size=4),
       form=st.sampled_from(READS), gaps=st.booleans())
# the metric read second (in sorted order) stops one step short of a run that reached N
@example(expect=10, metrics=[(0, True), (-1, True)], form=READS[0], gaps=False)
@example(expect=10, metrics=[(1, True), (-1, True), (0, True)], form=READS[3], gaps=True)
@example(expect=10, metrics=[(0, True), (0, True)], form=READS[0], gaps=False)  # every metric at exactly N
@example(expect=10, metrics=[(-1, True)], form=READS[2], gaps=False)  # the run stops at N - 1
@example(expect=10, metrics=[(0, False), (-1, True)], form=READS[1], gaps=True)
def test_a_rule_passes_at_step_n_and_fails_when_the_run_or_a_metric_it_reads_stops_at_n_minus_1(
        expect, metrics, form, gaps):
    assume(any(read for _, read in metrics))
    lasts = {f"train/m{i}": expect + offset for i, (offset, _) in enumerate(metrics)}
    # with gaps (a resumed run): steps lost in the middle, never the first or the last
    data = {m: {str(s): 0.5 for s in range(1, last + 1) if not gaps or s in (1, last) or s % 3}
            for m, last in lasts.items()}
    read = [f"train/m{i}" for i, (_, is_read) in enumerate(metrics) if is_read]
    rule = " and ".join(form.format(m=m) for m in read)

    got, message = status(data, rule, expect_steps=expect, vacuity_check=False)

    run_last = max(lasts.values())
    short = [m for m in read if lasts[m] < expect]
    if run_last < expect:
        assert (got, message) == ("FAIL", f"run stopped at step {run_last} of {expect}"), rule
    elif short:
        assert got == "FAIL", (rule, lasts)
        assert any(message == f"{m!r} stopped at step {lasts[m]} of {expect}" for m in short), (message, lasts)
    else:
        assert (got, message) == ("PASS", ""), (rule, lasts)


# ----------------------------------------------------------------------- NaN and infinity

# Every helper's call on metric x; `{s}` is the step that holds the non-finite value.
HELPER_CALLS = (
    'min(data["x"])', 'max(data["x"])', 'max(data["x"]["{s}"], -1e9)',
    'mean(data["x"])', 'mean(data["x"], -2)', 'mean(data["x"], 2)', 'mean(data["x"], 1, 3)',
    'mean(data["x"], 0, 0, 0.5)',
    'median(data["x"])', 'median(data["x"], -2)', 'ratio_above(data["x"], 0)',
    'std(data["x"])', 'std(data["x"], -2)', 'slope(data["x"])', 'slope(data["x"], -3)',
    'first(data["x"])', 'last(data["x"])', 'last_step(data["x"])', 'all_finite(data["x"])',
    'abs(data["x"]["{s}"])', 'round(data["x"]["{s}"], 2)',
)


def test_the_non_finite_property_calls_every_helper_that_reads_values():
    called = {name for call in HELPER_CALLS for name in HELPERS if call.startswith(f"{name}(")}
    assert called == set(HELPERS) - {"len"}  # len counts steps and reads no value


def rule_pair(call: str, bound: float) -> tuple[str, str]:
    """A rule over ``call`` and its negation: on finite data exactly one of them passes."""
    rule = call if call.startswith("all_finite") else f"{call} < {bound!r}"
    return rule, f"not ({rule})"


@settings(max_examples=300)
@given(values=st.lists(VALUES, min_size=4, max_size=30), from_step=st.sampled_from([0, 1]),
       where=st.sampled_from(["first", "middle", "last"]), bad=st.sampled_from(NON_FINITE),
       call=st.sampled_from(HELPER_CALLS), bound=VALUES)
@example(values=[1.0, 2.0, 3.0, 4.0, 5.0], from_step=1, where="first", bad=math.nan,
         call='mean(data["x"], -2)', bound=10.0)  # outside the averaged window
@example(values=[1.0, 2.0, 3.0, 4.0, 5.0], from_step=1, where="middle", bad=math.nan,
         call='ratio_above(data["x"], 0)', bound=0.5)
@example(values=[1.0, 2.0, 3.0, 4.0, 5.0], from_step=0, where="first", bad=math.inf,
         call='mean(data["x"])', bound=10.0)  # step 0: outside mean's default range
@example(values=[1.0, 2.0, 3.0, 4.0, 5.0], from_step=1, where="middle", bad=-math.inf,
         call='last(data["x"])', bound=10.0)
def test_a_non_finite_value_at_the_first_a_middle_or_the_last_step_fails_every_helper_naming_it(
        values, from_step, where, bad, call, bound):
    steps = list(range(from_step, from_step + len(values)))
    index = {"first": 0, "middle": len(values) // 2, "last": len(values) - 1}[where]
    clean = {"x": dict(zip(map(str, steps), values, strict=True))}
    poisoned = {"x": {**clean["x"], str(steps[index]): bad}}
    call = call.format(s=steps[index])
    rules = rule_pair(call, bound)
    # control: on the finite run the pair is well-formed, one passes and the other does not
    verdicts = [evaluate(clean, compile_rule(rule)) for rule in rules]
    assert sorted(v.passed for v in verdicts) == [False, True], [v.message for v in verdicts]

    for rule in rules:
        got, message = status(poisoned, rule, vacuity_check=False)
        assert got == "FAIL", (rule, poisoned)
        assert "'x'" in message and f"'{steps[index]}'" in message and str(bad) in message, (rule, message)


@settings(max_examples=40)
@given(bad=st.sampled_from(NON_FINITE), call=st.sampled_from(['data["score"] > 0', 'abs(data["score"]) >= 0',
                                                               'max(data["score"], 0) >= 0']))
def test_a_non_finite_plain_number_metric_fails_every_rule_that_reads_it(bad, call):
    for rule in (call, f"not ({call})"):
        got, message = status({"score": bad}, rule, vacuity_check=False)
        assert got == "FAIL" and "'score'" in message and str(bad) in message, (rule, message)


@settings(max_examples=60)
@given(values=st.lists(VALUES, min_size=2, max_size=20),
       call=st.sampled_from(['ratio_above(data["x"], {c})', 'mean(data["x"], 1, {c})', 'median(data["x"], {c})',
                             'max(data["x"]["1"], {c})', 'round(data["x"]["1"], 2) < {c}']),
       constant=st.sampled_from(["1e999", "-1e999", "1e308 * 10"]))
def test_an_infinite_number_written_in_a_rule_never_passes(values, call, constant):
    """``1e999`` parses as inf: as a threshold or a bound it would make ``ratio_above`` 0 or 1
    whatever the run, so a rule that holds one fails like a non-finite value read from a metric."""
    data = {"x": {str(s): v for s, v in enumerate(values, start=1)}}
    rule = call.format(c=constant)
    rule = rule if "<" in rule else f"{rule} >= 0"
    for text in (rule, f"not ({rule})"):
        got, message = status(data, text, vacuity_check=False)
        assert got == "FAIL" and "inf" in message, (text, message)


# --------------------------------------------------------------------------------- vacuity

# True of every series a run can log: each must be VACUOUS, whatever the run and however short.
TAUTOLOGIES = (
    'max(data["x"]) >= min(data["x"])',
    'mean(data["x"]) <= max(data["x"])',
    'median(data["x"]) >= min(data["x"])',
    'std(data["x"]) >= 0',
    'ratio_above(data["x"], 0) <= 1',
    'first(data["x"]) <= max(data["x"])',
    'abs(last(data["x"])) >= 0',
    'abs(slope(data["x"])) >= 0',
    'std(data["x"], -3) >= 0',
    'len(data["x"]) >= 1',
)


@settings(max_examples=120)
@given(values=st.lists(VALUES, min_size=1, max_size=40), rule=st.sampled_from(TAUTOLOGIES),
       named=st.sampled_from(["train/loss", "train/reward_mean", "eval/x"]))
@example(values=[0.5, 0.25], rule='abs(slope(data["x"])) >= 0', named="train/loss")  # two steps
@example(values=[0.5, 0.25, 0.75], rule='abs(slope(data["x"])) >= 0', named="train/loss")
def test_a_rule_true_of_every_series_is_vacuous_on_any_run(values, rule, named):
    rule = rule.replace('"x"', f'"{named}"')
    data = {named: {str(s): v for s, v in enumerate(values, start=1)}}
    assume(evaluate(data, compile_rule(rule)).passed)  # slope needs two steps
    got, message = status(data, rule)
    assert got == "VACUOUS", (rule, values, message)
