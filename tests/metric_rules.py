"""Metric rule engine: check rules such as ``max(data["train/grad_norm"]) < 10``.

Metrics files map metric -> step (string of an int; training from 1, the eval before
training at 0) -> value, or metric -> plain number. Rules are never ``eval``'d: each is
parsed with ``ast.parse(rule, mode="eval")``, checked against a whitelist
(:func:`compile_rule`) and walked by a small interpreter (:func:`evaluate_rule`).
Helper semantics follow NeMo-RL's ``tests/check_metrics.py``.
"""

from __future__ import annotations

import ast
import builtins
import difflib
import inspect
import json
import math
import operator
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RuleError(ValueError):
    """A rule that cannot run: bad syntax or a construct outside the whitelist."""


class MetricsFileError(ValueError):
    """A metrics file that cannot be read or does not have the expected shape."""


class RuleEvalError(Exception):
    """A rule that ran but cannot pass: missing metric/step, NaN/inf, bad math."""


# ------------------------------------------------------------------------------ helpers


def _finite(x: Any, where: str) -> float:
    """``x`` as a float; TypeError if not a number, RuleEvalError if NaN/inf."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{where} is {x!r} ({type(x).__name__}), not a number")
    if not math.isfinite(x):
        raise RuleEvalError(f"{where} is {x}; non-finite values never pass")
    return float(x)


def _step_values(values: Any) -> dict[int, float]:
    """A step dict / list / plain number as ``{step: value}``, sorted by step.

    A list is numbered from step 1; a plain number is one value at step 1.
    """
    if isinstance(values, dict):
        items = [(int(step), v) for step, v in values.items()]
    elif isinstance(values, (list, tuple)):
        items = list(enumerate(values, start=1))
    else:
        items = [(1, values)]
    return {step: _finite(v, f"step '{step}'") for step, v in sorted(items)}


def _values(args: tuple[Any, ...]) -> list[float]:
    """Values of one step dict / list / number, or of several numbers."""
    if len(args) == 1:
        return list(_step_values(args[0]).values())
    return [_finite(a, f"argument {i + 1}") for i, a in enumerate(args)]


def min(*values: Any) -> float:
    """Smallest value of a step dict, a list, or several numbers.

    Raises:
        ValueError: no values.  RuleEvalError: a value is NaN/inf.
    """
    return builtins.min(_values(values))


def max(*values: Any) -> float:
    """Largest value of a step dict, a list, or several numbers.

    Raises:
        ValueError: no values.  RuleEvalError: a value is NaN/inf.
    """
    return builtins.max(_values(values))


def median(values: Any) -> float:
    """Median of a step dict's values (``statistics.median``).

    Raises:
        statistics.StatisticsError: no values.  RuleEvalError: a value is NaN/inf.
    """
    return statistics.median(_values((values,)))


def ratio_above(values: Any, threshold: float) -> float:
    """Fraction of values ``>= threshold`` (inclusive, as in NeMo-RL).

    Returns:
        A float in [0, 1].

    Raises:
        ValueError: no values (NeMo-RL returns 0.0 there; a rule on an empty metric
            must not pass silently).  RuleEvalError: a value is NaN/inf.
    """
    vals = _values((values,))
    if not vals:
        raise ValueError("no values to compare with the threshold")
    return sum(v >= threshold for v in vals) / len(vals)


def mean(values: Any, range_start: int = 1, range_end: int = 0, ignore_top_p: float = 0.0) -> float:
    """Mean over the steps in ``[range_start, range_end)``, computed as NeMo-RL does.

    Bounds are step numbers, 1-indexed, not positions. A negative bound counts back
    from the last logged step (``bound + last_step + 1``: -10 is the last 10 steps);
    ``range_end <= 0`` is taken the same way, so 0 means "through the last step".
    Steps missing after a resume simply contribute nothing. Step 0 (the eval before
    training) is outside the default range; pass ``range_start=0`` to include it.
    ``ignore_top_p`` sorts the values and keeps the first ``int(n * (1 - p))`` of them
    (at least one), so the largest ones are dropped as outliers.

    Returns:
        ``statistics.mean`` of the kept values.

    Raises:
        ValueError: ``ignore_top_p`` outside [0, 1], or no logged step in the range.
        RuleEvalError: a value is NaN/inf.
    """
    steps = _step_values(values)
    if not 0.0 <= ignore_top_p <= 1.0:
        raise ValueError(f"ignore_top_p must be between 0.0 and 1.0, got {ignore_top_p}")
    if not steps:
        raise ValueError("no values")
    last = builtins.max(steps)
    start = range_start + last + 1 if range_start < 0 else range_start
    end = range_end + last + 1 if range_end <= 0 else range_end
    vals = [v for step, v in steps.items() if start <= step < end]
    if not vals:
        first = builtins.min(steps)
        raise ValueError(f"no steps in [{start}, {end}) (logged: {first}..{last})")
    if ignore_top_p > 0.0:
        vals = sorted(vals)
        vals = vals[: int(len(vals) * (1.0 - ignore_top_p))] or vals[:1]
    return statistics.mean(vals)


# fmt: off
HELPERS: dict[str, Callable[..., Any]] = {
    "min": min, "max": max, "mean": mean, "median": median,
    "ratio_above": ratio_above, "abs": abs, "len": len, "round": round,
}

# ------------------------------------------------------------------- parse + whitelist

_BIN_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: lambda a, b: float(a) ** float(b),  # float: no 10**10**10 big-int DoS
}
_CMP_OPS: dict[type, tuple[str, Callable[[Any, Any], bool]]] = {
    ast.Eq: ("==", operator.eq), ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt), ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt), ast.GtE: (">=", operator.ge),
    ast.In: ("in", lambda a, b: a in b), ast.NotIn: ("not in", lambda a, b: a not in b),
}
_ALLOWED = (
    ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Subscript, ast.BinOp,
    ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare, ast.BoolOp, ast.And,
    ast.Or, ast.Call, ast.keyword, ast.List, ast.Tuple, *_BIN_OPS, *_CMP_OPS,
)
_NAMES = {  # what a disallowed node is called in the error message
    ast.Attribute: "attribute access", ast.Lambda: "lambda", ast.ListComp: "comprehension",
    ast.SetComp: "comprehension", ast.DictComp: "comprehension",
    ast.GeneratorExp: "generator expression", ast.JoinedStr: "f-string",
    ast.Starred: "starred argument", ast.NamedExpr: "assignment expression (:=)",
    ast.IfExp: "conditional expression", ast.Slice: "slice", ast.Await: "await",
}
# fmt: on


def _disallowed(node: ast.AST) -> str | None:
    """Why ``node`` is outside the whitelist, or None if it is allowed."""
    helpers = ", ".join(HELPERS)
    if not isinstance(node, _ALLOWED):
        what = _NAMES.get(type(node), f"{type(node).__name__} expression")
        if isinstance(node, ast.expr):
            what = f"{what} `{ast.unparse(node)}`"
        return f"{what} is not allowed"
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (int, float, str, type(None))):
            return f"constant {node.value!r} is not allowed"
        if isinstance(node.value, str) and "__" in node.value:
            return f"dunder string {node.value!r} is not allowed"
    if isinstance(node, ast.Name) and node.id != "data":
        return f"name '{node.id}' is not allowed (only `data` and calls of {helpers})"
    if isinstance(node, ast.Call):
        if any(k.arg is None for k in node.keywords):
            return "**kwargs is not allowed"
        if not isinstance(node.func, ast.Name):
            callee = ast.unparse(node.func)
            return _disallowed(node.func) or f"call of `{callee}` is not allowed"
        if node.func.id not in HELPERS:
            return f"call of `{node.func.id}` is not allowed (helpers: {helpers})"
        try:  # wrong arity or keyword names are caught here, before anything runs
            kwargs = {k.arg: k.value for k in node.keywords if k.arg}
            inspect.signature(HELPERS[node.func.id]).bind(*node.args, **kwargs)
        except TypeError as e:
            return f"`{ast.unparse(node)}`: {e}"
    return None


def _check_tree(node: ast.AST, rule: str) -> None:
    """Raise RuleError for the first disallowed node (a Call's ``func`` is checked by
    :func:`_disallowed`, not visited: helper names are allowed only as callees)."""
    reason = _disallowed(node)
    if reason:
        raise RuleError(f"rule {rule!r}: {reason}")
    is_call = isinstance(node, ast.Call)
    children = [*node.args, *node.keywords] if is_call else ast.iter_child_nodes(node)
    for child in children:
        _check_tree(child, rule)


def compile_rule(rule: str) -> ast.Expression:
    """Parse a rule and check every node against the whitelist.

    Args:
        rule: a Python-syntax expression over ``data``.

    Returns:
        The parsed ``ast.Expression``, for :func:`evaluate_rule`.

    Raises:
        RuleError: a syntax error or a disallowed construct (attribute access, names
            other than ``data``/helpers, lambdas, comprehensions, f-strings, starred
            arguments, dunder strings, unknown helper keywords, ...).
    """
    try:
        tree = ast.parse(rule, mode="eval")
        _check_tree(tree, rule)
    except SyntaxError as e:
        raise RuleError(f"rule {rule!r}: invalid syntax ({e.msg})") from None
    except RecursionError:
        raise RuleError(f"rule {rule!r}: nested too deeply") from None
    return tree


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class CheckResult:
    """One rule's outcome.

    ``value`` is the left-hand side of a top-level comparison, else the rule's result
    (None when it could not be computed); ``message`` says why it failed ("" on PASS).
    """

    rule: str
    passed: bool
    value: Any
    message: str

    def to_json(self) -> dict[str, Any]:
        """The ``--json-report`` row; non-finite or non-scalar values become text."""
        value = self.value
        finite = isinstance(value, float) and math.isfinite(value)
        if not (finite or value is None or isinstance(value, (bool, int, str))):
            value = str(value)
        status = "PASS" if self.passed else "FAIL"
        row = {"rule": self.rule, "status": status, "value": value}
        return {**row, "message": self.message}


def format_value(value: Any, limit: int = 60) -> str:
    """``str(value)`` cut to ``limit`` characters."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Evaluator:
    """Walks a whitelisted rule AST over ``data``; records the top-level comparison."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.lhs: Any = None
        self.failed_link = ""

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
            return _BIN_OPS[type(node.op)](left, right)
        except (ArithmeticError, ValueError) as e:
            raise RuleEvalError(f"`{ast.unparse(node)}`: {e}") from None

    def _subscript(self, node: ast.Subscript) -> Any:
        container, key = self.eval(node.value), self.eval(node.slice)
        if container is self.data and key not in container:
            close = difflib.get_close_matches(str(key), list(map(str, container)), n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise RuleEvalError(f"metric {key!r} not found in the metrics file{hint}")
        if isinstance(container, dict) and key not in container:
            steps = sorted(container, key=lambda s: int(s) if str(s).isdigit() else -1)
            logged = f"{steps[0]}..{steps[-1]} ({len(steps)} steps)" if steps else "none"
            hint = " (step keys are strings)" if str(key) in container else ""
            where = ast.unparse(node.value)
            raise RuleEvalError(f"step {key!r} not in {where}{hint}; logged: {logged}")
        try:
            value = container[key]
        except (LookupError, TypeError) as e:
            raise RuleEvalError(f"`{ast.unparse(node)}`: {e!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise RuleEvalError(f"{ast.unparse(node)} is {value}; never passes")
        return value

    def _call(self, node: ast.Call) -> Any:
        assert isinstance(node.func, ast.Name)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg}
        try:
            return HELPERS[node.func.id](*args, **kwargs)
        except RuleEvalError as e:  # NaN/inf inside a metric: name the metric
            where = ast.unparse(node.args[0]) if node.args else ast.unparse(node)
            raise RuleEvalError(f"{where}: {e}") from None
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
                    raise RuleEvalError(f"`{ast.unparse(operand_node)}` is {operand}; never passes")
            symbol, compare = _CMP_OPS[type(op)]
            if not compare(left, right):
                if top:
                    shown = f"{format_value(left)} {symbol} {format_value(right)}"
                    self.failed_link = f"{shown} is False"
                return False
            left, left_node = right, right_node
        return True


def evaluate_rule(data: dict[str, Any], rule: str, tree: ast.Expression | None = None) -> CheckResult:
    """Evaluate one rule; problems inside the rule or the data become a FAIL.

    Args:
        data: metric -> {step: value} (or a plain number), from :func:`load_metrics`.
        rule: the rule's text.
        tree: the rule compiled by :func:`compile_rule` (compiled here when None).

    Returns:
        A CheckResult that passes only when the rule evaluates to ``True``. A missing
        metric or step, a NaN/inf value, an error inside a helper, or a result that is
        not a bool gives a FAIL whose message names the cause.

    Raises:
        RuleError: only when ``tree`` is None and the rule does not compile.
    """
    tree = tree if tree is not None else compile_rule(rule)
    evaluator = _Evaluator(data)
    is_compare = isinstance(tree.body, ast.Compare)
    try:
        result = evaluator.eval(tree)
    except RuleEvalError as e:
        return CheckResult(rule, False, evaluator.lhs, str(e))
    except Exception as e:  # any other error fails this rule only; the rest still run
        return CheckResult(rule, False, evaluator.lhs, f"{type(e).__name__}: {e}")
    value = evaluator.lhs if is_compare else result
    if not isinstance(result, bool):
        kind = type(result).__name__
        message = f"rule gave {format_value(result)} ({kind}), not True/False"
        return CheckResult(rule, False, value, message)
    message = "" if result else (evaluator.failed_link or "rule is False")
    return CheckResult(rule, result, value, message)


def check_rules(data: dict[str, Any], rules: list[str]) -> list[CheckResult]:
    """Compile every rule first, then evaluate each.

    Raises:
        RuleError: a rule does not compile; then no rule has been evaluated.
    """
    trees = [compile_rule(rule) for rule in rules]
    return [evaluate_rule(data, rule, tree) for rule, tree in zip(rules, trees, strict=True)]


# ------------------------------------------------------------------------------ loading


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def load_metrics(path: str | Path) -> dict[str, Any]:
    """Read and validate a metrics JSON file.

    Args:
        path: a file of ``{metric: {step: value}}`` (steps: strings of ints >= 0;
            values: numbers, NaN/Infinity accepted here and failed by the rules that
            read them) where a metric may instead be a plain number.

    Returns:
        The parsed dict.

    Raises:
        MetricsFileError: unreadable file, invalid JSON, or a wrong shape; the message
            names the path and the offending metric/step.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsFileError(f"cannot read metrics file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise MetricsFileError(f"metrics file {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise MetricsFileError(f"metrics file {path}: top level must be an object")
    for name, series in data.items():
        if _is_number(series):
            continue
        if not isinstance(series, dict):
            raise MetricsFileError(f"metrics file {path}: metric {name!r} is not {{step: value}} or a number")
        for step, value in series.items():
            if not step.isdigit() or not _is_number(value):
                raise MetricsFileError(
                    f"metrics file {path}: metric {name!r} step {step!r}: "
                    f"expected an integer step and a number, got {value!r}"
                )
    return data
