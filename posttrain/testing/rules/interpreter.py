"""Metric rule engine: check rules such as ``max(data["train/grad_norm"]) < 10``.

Metrics map metric -> step (string of an int; training from 1, the eval before training
at 0) -> value, or metric -> plain number. Rules are never ``eval``'d: each is parsed and
checked against a whitelist (``compiler.compile_rule``, re-exported here) and walked
by a small interpreter (:func:`evaluate`), which also records what the rule read
(for the vacuity and completeness checks) and the links of its top-level comparison (for
margins). Helper semantics follow NeMo-RL's ``tests/check_metrics.py`` (``helpers``).
"""

from __future__ import annotations

import ast
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.testing.rules import comparisons
from posttrain.testing.rules.compiler import BIN_OPS, compile_rule
from posttrain.testing.rules.errors import (
    FinitenessCheckFailed,
    MetricsFileError,
    NonFiniteError,
    RuleError,
    RuleEvalError,
)
from posttrain.testing.rules.helpers import HELPERS, mean, median, metric_max, metric_min, ratio_above  # noqa: F401
from posttrain.testing.rules.loading import load_metrics, load_tb_dir  # noqa: F401
from posttrain.testing.rules.margins import Link, binding_margin
from posttrain.testing.rules.series import Series, as_series, is_number

__all__ = [
    "HELPERS", "CheckResult", "Evaluation", "MetricsFileError", "RuleError", "RuleEvalError",
    "compile_rule", "evaluate", "evaluate_rule", "evaluate_rules", "format_value", "load_metrics",
    "load_tb_dir", "mean", "median", "metric_max", "metric_min", "ratio_above",
]  # fmt: skip

# --------------------------------------------------------------------------- results

Status = Literal["PASS", "WARN", "FAIL", "VACUOUS", "SKIP"]
PASSING: frozenset[str] = frozenset({"PASS", "WARN", "SKIP"})


@dataclass(frozen=True)
class CheckResult:
    """One rule's outcome.

    ``value``: for a comparison, the value side of its tightest link (the left-hand side
    of ``x < bound``), else the rule's result (None when it could not be computed);
    ``bound``/``margin``: the other side and the relative margin (None when not a
    numeric order comparison); ``message`` says why it did not plainly PASS.
    """

    rule: str
    status: Status
    value: Any
    message: str
    bound: Any = None
    margin: float | None = None

    @property
    def passed(self) -> bool:
        """True for PASS, WARN (passed close to its bound) and SKIP (optional check not applicable)."""
        return self.status in PASSING

    def to_json(self) -> dict[str, Any]:
        """The ``--output-json`` row; non-finite or non-scalar values become text."""
        return {
            "rule": self.rule,
            "status": self.status,
            "value": _json_scalar(self.value),
            "bound": _json_scalar(self.bound),
            "margin": _json_scalar(self.margin),
            "message": self.message,
        }


def _json_scalar(value: Any) -> Any:
    """``value`` if JSON can hold it exactly (finite float, int, bool, str, None), else ``str(value)``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return value if value is None or isinstance(value, (bool, int, str)) else str(value)


def format_value(value: Any, limit: int = 60) -> str:
    """``str(value)`` cut to ``limit`` characters."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation of a rule gave, and what it read.

    ``reads``: metric -> the step keys the rule named (``data[m]["3"]``, ``"3" in
    data[m]``); a metric tested with ``"m" in data`` is there too. ``judged``: the rule
    itself said no (returned False, or ``all_finite`` found a NaN), as opposed to the
    engine refusing a missing key or a NaN it read.
    """

    passed: bool
    value: Any
    message: str
    links: tuple[Link, ...] = ()
    reads: Mapping[str, frozenset[str]] = field(default_factory=dict)
    judged: bool = False


# --------------------------------------------------------------------------- evaluation


def _finite(x: Any, where: str) -> float:
    """``x`` as a number; TypeError if it is not one, NonFiniteError if NaN/inf."""
    if not is_number(x):
        raise TypeError(f"{where} is {x!r} ({type(x).__name__}), not a number")
    if not math.isfinite(x):
        raise NonFiniteError(f"{where} is {x}; non-finite values never pass")
    return x


def _where(call: ast.Call) -> str:
    """What a helper call read, for messages: ``metric 'train/loss'`` for ``f(data["train/loss"])``."""
    arg = call.args[0] if call.args else call
    if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name) and isinstance(arg.slice, ast.Constant):
        return f"metric {arg.slice.value!r}"
    return ast.unparse(arg)


def _reads_data(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


class _Evaluator:
    """Walks a whitelisted rule AST over ``data``; records reads and the top-level comparison."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data
        self.lhs: Any = None
        self.failed_link = ""
        self.links: list[Link] = []
        self.reads: dict[str, set[str]] = {}
        self._names: dict[int, str] = {}  # id(series read) -> its metric
        self._series: dict[str, Any] = {}  # metric -> what data[metric] gave (converted once)

    def eval(self, node: ast.AST, top: bool = False) -> Any:
        """Evaluate ``node`` (``top``: it is the rule's outermost expression)."""
        if isinstance(node, ast.Expression):
            return self.eval(node.body, top=True)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):  # compile_rule lets only `data` through
            return self.data
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.eval(e) for e in node.elts]
        if isinstance(node, ast.Subscript):
            return self._subscript(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare):
            return self._compare(node, top)
        if isinstance(node, ast.BoolOp):  # short-circuits and returns an operand
            for value_node in node.values:
                result = self.eval(value_node)
                if bool(result) == isinstance(node.op, ast.Or):
                    return result
            return result
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            number = _finite(operand, f"`{ast.unparse(node.operand)}`")
            return -number if isinstance(node.op, ast.USub) else number
        assert isinstance(node, ast.BinOp), type(node)  # compile_rule allows no other
        left = _finite(self.eval(node.left), f"`{ast.unparse(node.left)}`")
        right = _finite(self.eval(node.right), f"`{ast.unparse(node.right)}`")
        try:
            return BIN_OPS[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as e:
            raise RuleEvalError(f"`{ast.unparse(node)}`: {e}") from None

    def _record(self, container: Any, key: Any) -> None:
        """Note a read of metric ``key`` of ``data``, or of step ``key`` of a metric read before."""
        if container is self.data:
            self.reads.setdefault(str(key), set())
        elif id(container) in self._names:
            self.reads[self._names[id(container)]].add(str(key))

    def _metric(self, key: Any) -> Any:
        """``data[key]``: a Series (converted once) or a plain number; missing/empty/NaN fail."""
        if key in self._series:
            return self._series[key]
        if key not in self.data:
            close = difflib.get_close_matches(str(key), list(map(str, self.data)), n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise RuleEvalError(f"metric {key!r} not found in the metrics file{hint}")
        value = self.data[key]
        if isinstance(value, Mapping):
            value = as_series(value)
            if not value:
                raise RuleEvalError(f"metric {key!r} has no values")
            self._names[id(value)] = str(key)
        elif is_number(value) and not math.isfinite(value):
            raise NonFiniteError(f"metric {key!r} is {value}; never passes")
        self._series[key] = value
        return value

    def _subscript(self, node: ast.Subscript) -> Any:
        container, key = self.eval(node.value), self.eval(node.slice)
        self._record(container, key)
        if container is self.data:
            return self._metric(key)
        if isinstance(container, Series) and key not in container:
            steps = container.steps
            logged = f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
            hint = " (step keys are strings)" if str(key) in container else ""
            raise RuleEvalError(f"step {key!r} not in {ast.unparse(node.value)}{hint}; logged: {logged}")
        try:
            value = container[key]
        except (LookupError, TypeError) as e:
            raise RuleEvalError(f"`{ast.unparse(node)}`: {e!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFiniteError(f"{ast.unparse(node)} is {value}; never passes")
        return value

    def _call(self, node: ast.Call) -> Any:
        assert isinstance(node.func, ast.Name)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg}
        # A threshold or a step bound of `1e999` (or `1e308 * 10`) is inf: ratio_above(x, 1e999) would
        # be 0 and mean(x, 1, 1e999) the whole run, whatever the run. Metrics are checked by the helpers.
        for arg_node, arg in zip([*node.args, *(k.value for k in node.keywords if k.arg)], [*args, *kwargs.values()],
                                 strict=True):
            if is_number(arg) and not math.isfinite(arg):
                raise NonFiniteError(f"`{ast.unparse(arg_node)}` is {arg}; never passes")
        try:
            return HELPERS[node.func.id](*args, **kwargs)
        except RuleEvalError as e:  # NaN/inf inside a metric: name the metric, keep the kind
            raise type(e)(f"{_where(node)}: {e}") from None
        except (ArithmeticError, ValueError, TypeError, LookupError) as e:
            raise RuleEvalError(f"`{ast.unparse(node)}`: {e}") from None

    def _compare(self, node: ast.Compare, top: bool) -> bool:
        left, left_node = self.eval(node.left), node.left
        if top:
            self.lhs = left
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.eval(right_node)
            for operand, operand_node in ((left, left_node), (right, right_node)):
                if isinstance(operand, float) and not math.isfinite(operand):
                    raise NonFiniteError(f"`{ast.unparse(operand_node)}` is {operand}; never passes")
            comparison = comparisons.of_node(op)
            symbol = comparison.symbol
            if symbol in ("in", "not in"):
                self._record(right, left)
            if top:
                bound_on_left = not _reads_data(left_node) and _reads_data(right_node)
                self.links.append(Link(left, symbol, right, bound_on_left))
            if not comparison.holds(left, right):
                if top:
                    shown = f"{format_value(left)} {symbol} {format_value(right)}"
                    self.failed_link = f"{shown} is False"
                return False
            left, left_node = right, right_node
        return True


def evaluate(data: Mapping[str, Any], tree: ast.Expression) -> Evaluation:
    """Evaluate a compiled rule; problems inside the rule or the data become a failed Evaluation.

    Args:
        data: metric -> Series / step dict / plain number (see :func:`load_metrics`).
        tree: the rule compiled by :func:`compile_rule`.

    Returns:
        An Evaluation that passed only when the rule gave ``True``. A missing metric or
        step, an empty metric, a NaN/inf read or computed, an error inside a helper, or
        a result that is not a bool fails with a message naming the cause.
    """
    ev = _Evaluator(data)
    judged = False
    try:
        result = ev.eval(tree)
    except FinitenessCheckFailed as e:
        message, result, judged = str(e), None, True
    except RuleEvalError as e:
        message, result = str(e), None
    except Exception as e:  # any other error fails this rule only; the rest still run
        message, result = f"{type(e).__name__}: {e}", None
    else:
        message = "" if result is True else ev.failed_link or "rule is False"
        judged = result is False
        if not isinstance(result, bool):
            message = f"rule gave {format_value(result)} ({type(result).__name__}), not True/False"
    value = ev.lhs if isinstance(tree.body, ast.Compare) else result
    reads = {metric: frozenset(steps) for metric, steps in ev.reads.items()}
    return Evaluation(result is True, value, message, tuple(ev.links), reads, judged)


def result_of(rule: str, evaluation: Evaluation) -> CheckResult:
    """The PASS/FAIL CheckResult of an evaluation, with the tightest link's value, bound and margin."""
    status: Status = "PASS" if evaluation.passed else "FAIL"
    margin = binding_margin(list(evaluation.links))
    if margin is None:
        return CheckResult(rule, status, evaluation.value, evaluation.message)
    return CheckResult(rule, status, margin.value, evaluation.message, margin.bound, margin.margin)


def evaluate_rule(data: Mapping[str, Any], rule: str, tree: ast.Expression | None = None) -> CheckResult:
    """Evaluate one rule to PASS or FAIL (no vacuity, completeness or margin policy: see checker.py).

    Args:
        data: metric -> Series / step dict / plain number.
        rule: the rule's text.
        tree: the rule compiled by :func:`compile_rule` (compiled here when None).

    Returns:
        A CheckResult that passes only when the rule evaluates to ``True``.

    Raises:
        RuleError: only when ``tree`` is None and the rule does not compile.
    """
    tree = tree if tree is not None else compile_rule(rule)
    return result_of(rule, evaluate(data, tree))


def evaluate_rules(data: Mapping[str, Any], rules: list[str]) -> list[CheckResult]:
    """Compile every rule first, then evaluate each to PASS or FAIL: the rules' truth alone, with
    no vacuity or completeness policy (``posttrain.testing.rules.check_rules`` applies it).

    Raises:
        RuleError: a rule does not compile; then no rule has been evaluated.
    """
    trees = [compile_rule(rule) for rule in rules]
    return [evaluate_rule(data, rule, tree) for rule, tree in zip(rules, trees, strict=True)]
