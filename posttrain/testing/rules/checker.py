"""The policy that turns rule evaluations into statuses: PASS, WARN, FAIL, VACUOUS, SKIP.

For each rule, in this order of precedence:

1. SKIP: an optional pack check whose metric was not logged.
2. FAIL: ``--expect-steps N`` and the run (or a metric the rule reads) stops before N
   ("run stopped at step K of N"), or the rule is False / cannot be computed.
3. VACUOUS: it passes, but also passes on every adversarial stand-in (``vacuity``).
4. WARN: it passes closer to its bound than ``--min-margin`` (``margins``).
5. PASS.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from posttrain.testing.rules.completeness import check_completeness, run_progress
from posttrain.testing.rules.interpreter import CheckResult, Evaluation, compile_rule, evaluate, result_of
from posttrain.testing.rules.margins import Margin, is_thin
from posttrain.testing.rules.series import Series, as_series
from posttrain.testing.rules.vacuity import check_vacuity


@dataclass(frozen=True)
class RuleSpec:
    """A rule to check: its text, and a reason to skip it (non-empty only for an optional
    pack check whose metric was not logged)."""

    text: str
    skip_reason: str = ""


@dataclass(frozen=True)
class CheckOptions:
    """Policy knobs: ``expect_steps`` (None: no completeness check), ``vacuity_check``,
    ``min_margin`` (a fraction; 0 disables WARN)."""

    expect_steps: int | None = None
    vacuity_check: bool = True
    min_margin: float = 0.0


def normalize(data: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics with every step dict as a Series (already-loaded Series pass through).

    Raises:
        TypeError / ValueError: a step dict with a non-number value or a non-integer step.
    """
    return {k: as_series(v) if isinstance(v, Mapping) and not isinstance(v, Series) else v for k, v in data.items()}


def decide(
    data: Mapping[str, Any],
    spec: RuleSpec,
    tree: ast.Expression,
    evaluation: Evaluation,
    options: CheckOptions,
    run_last: int | None = None,
) -> CheckResult:
    """Decide one rule's status (see the module docstring).

    Args:
        data: metric -> Series / number (see :func:`normalize`).
        spec: the rule.
        tree: the rule compiled by ``compile_rule``.
        evaluation: the rule evaluated on ``data``.
        options: the policy.
        run_last: the run's last logged step (``completeness.run_progress``); used
            only with ``options.expect_steps``.

    Returns:
        The rule's CheckResult.
    """
    result = result_of(spec.text, evaluation)
    if options.expect_steps is not None:
        completeness = check_completeness(data, evaluation.reads, options.expect_steps, run_last)
        if not completeness.complete:
            message = "; ".join(m for m in (completeness.message, result.message) if m)
            return replace(result, status="FAIL", message=message)
    if not evaluation.passed:
        return result
    if options.vacuity_check:
        vacuity = check_vacuity(data, tree, evaluation.reads)
        if vacuity.vacuous:
            return replace(result, status="VACUOUS", message=vacuity.reason)
    if is_thin(Margin(result.value, result.bound, result.margin), options.min_margin):
        text = f"passes with only {result.margin:.1%} margin (--min-margin {options.min_margin:.0%})"
        return replace(result, status="WARN", message=text)
    return result


def run_checks(data: Mapping[str, Any], specs: list[RuleSpec], options: CheckOptions) -> list[CheckResult]:
    """Compile every rule, evaluate each, then decide each one's status.

    Args:
        data: metric -> Series / step dict / number.
        specs: the rules, explicit ones and pack ones (SKIP ones are not evaluated).
        options: the policy.

    Returns:
        One CheckResult per spec, in order.

    Raises:
        RuleError: a rule does not compile; then no rule has been evaluated.
    """
    trees = [compile_rule(spec.text) for spec in specs]
    metrics = normalize(data)
    evaluations = [None if s.skip_reason else evaluate(metrics, t) for s, t in zip(specs, trees, strict=True)]
    run_last = None
    if options.expect_steps is not None:
        read = {m for e in evaluations if e is not None for m in e.reads}
        run_last = run_progress(metrics, read, options.expect_steps)
    results = []
    for spec, tree, evaluation in zip(specs, trees, evaluations, strict=True):
        if evaluation is None:
            results.append(CheckResult(spec.text, "SKIP", None, spec.skip_reason))
        else:
            results.append(decide(metrics, spec, tree, evaluation, options, run_last))
    return results


def check_rules(data: Mapping[str, Any], rules: list[str], *, expect_steps: int | None = None,
                vacuity_check: bool = True, min_margin: float = 0.0) -> list[CheckResult]:
    """Check ``rules`` against a run's metrics with the policy of the ``check-metrics`` command:
    the same statuses (PASS, WARN, FAIL, VACUOUS) for the same rules and options, so a rule that
    cannot fail is refused here as it is there (its ``passed`` is False).

    Args:
        data: metric -> step dict (``{"1": 0.5, ...}``), Series or number (``load_metrics``).
        rules: rule texts (docs/testing.md, "Rules").
        expect_steps: ``--expect-steps``: every metric a rule reads must reach this step.
        vacuity_check: False is ``--no-vacuity-check``.
        min_margin: ``--min-margin``, a fraction (0: no WARN).

    Returns:
        One CheckResult per rule, in order.

    Raises:
        RuleError: a rule does not compile; then no rule has been evaluated.
    """
    return run_checks(data, [RuleSpec(rule) for rule in rules], CheckOptions(expect_steps, vacuity_check, min_margin))
