"""What the plot of one rule shows, worked out from the rule engine alone (no plotting library).

For each checked rule (a :class:`~posttrain.testing.rules.interpreter.CheckResult`):

* the series of every metric the rule names: the ``data["..."]`` subscripts (and ``"m" in data``)
  of the tree ``compile_rule`` parses, values kept as logged, NaN and infinities included;
* the levels to draw in a metric's own units: a bound that reads no metric as a line across the
  run, with the side where the rule fails; an aggregate that reads one metric
  (``mean(data["m"], -20)``, ``median``, ``min``, ``max``, ``first``, ``last``, ``data["m"]["5"]``)
  at its value over the steps it reads;
* the steps that make a per-point rule fail: every step beyond the bound for ``max(m) < b`` and
  ``min(m) > b`` (the rule fails when any one is), the one step of ``first``, ``last`` and
  ``data["m"]["5"]``;
* the top-level comparison's links, value on the left (``value < bound``), for the gauge that shows
  the bound of any comparison, also one not in a metric's units (``std(m) > 0``, ``slope``,
  arithmetic such as ``max(m) - 1 < 1e-4``).

The links are the engine's own (``evaluate`` on the same data, the same tree), so the drawn value,
bound and margin are those of the Metric Checks table. Rules that combine comparisons with
``and``/``or`` get their series and no gauge: the engine records links of the top-level comparison
only.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.testing.rules.comparisons import Comparison as Operator
from posttrain.testing.rules.comparisons import of_node, seen_from_the_value
from posttrain.testing.rules.compiler import compile_rule
from posttrain.testing.rules.helpers import step_window
from posttrain.testing.rules.interpreter import CheckResult, evaluate
from posttrain.testing.rules.series import Series, is_number

# Helpers whose value is a value of the metric itself (or a mean of some), so its bound is in the
# metric's units and can be drawn over the series.
IN_UNITS = ("min", "max", "mean", "median", "first", "last")


def non_finite_name(value: float) -> str:
    """``NaN``, ``+inf`` or ``-inf``, as the report labels a value that has no place on an axis."""
    return "NaN" if math.isnan(value) else ("+inf" if value > 0 else "-inf")


@dataclass(frozen=True)
class Trace:
    """One metric as logged: ``steps`` and ``values`` (NaN/inf kept); a plain-number metric has
    ``scalar`` and no steps; ``missing``: the rule names it but the metrics do not have it."""

    metric: str
    steps: tuple[int, ...] = ()
    values: tuple[float, ...] = ()
    scalar: float | None = None
    missing: bool = False

    def non_finite(self) -> list[tuple[int, float]]:
        """``(step, value)`` of every NaN and infinity, in step order."""
        return [(s, v) for s, v in zip(self.steps, self.values, strict=True) if not math.isfinite(v)]


@dataclass(frozen=True)
class Level:
    """A horizontal line in ``metric``'s units.

    ``role``: ``bound`` (what the value is compared with) or ``value`` (an aggregate of the metric).
    ``steps``: the first and last step it covers (None: the whole run, a bound that reads no metric).
    ``op``: for a bound that reads no metric, the comparison ``value op bound`` (the checker's own,
    :mod:`posttrain.testing.rules.comparisons`): which side fails, and whether the bound itself does.
    ``holds``: whether the comparison it belongs to held.
    """

    metric: str
    y: float
    label: str
    role: Literal["bound", "value"]
    steps: tuple[int, int] | None = None
    op: Operator | None = None
    holds: bool = True

    @property
    def fails(self) -> Literal["above", "below"] | None:
        """For a bound with an ``op``, the side where the value fails (``above``: the rule asks for less)."""
        return self.op.fails if self.op is not None else None


@dataclass(frozen=True)
class Comparison:
    """One link of the top-level comparison, value on the left: ``value op bound``."""

    value_text: str
    value: Any
    op: str
    bound_text: str
    bound: Any
    holds: bool

    @property
    def numeric(self) -> bool:
        """Both sides finite numbers (what a gauge can place)."""
        return _finite_number(self.value) and _finite_number(self.bound)


@dataclass(frozen=True)
class RulePlot:
    """Everything the plot of one rule shows; ``result`` is its row of the Metric Checks table."""

    index: int
    result: CheckResult
    traces: tuple[Trace, ...]
    levels: tuple[Level, ...]
    failing: tuple[tuple[str, int], ...]  # (metric, step) beyond the bound
    comparisons: tuple[Comparison, ...]


@dataclass(frozen=True)
class _Read:
    """A link side that reads one metric and gives a value in its units, and the steps it reads."""

    helper: str  # a name of IN_UNITS, "step" (data["m"]["5"]) or "number" (a plain-number metric)
    metric: str
    steps: tuple[int, ...]


def _metric_key(node: ast.AST) -> str | None:
    """``"m"`` for the node ``data["m"]``, else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant):
        return node.slice.value if isinstance(node.slice.value, str) else None
    return None


def named_metrics(tree: ast.Expression) -> list[str]:
    """The metrics a compiled rule names, in the order they appear in its text, each once.

    ``data["m"]`` anywhere, and ``"m" in data`` / ``"m" not in data``.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        key = _metric_key(node)
        if key is not None and isinstance(node, ast.expr):
            found.append((node.col_offset, key))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:], strict=False):
                if (isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, ast.Name)
                        and isinstance(left, ast.Constant) and isinstance(left.value, str)):
                    found.append((left.col_offset, left.value))
    return list(dict.fromkeys(key for _, key in sorted(found, key=lambda pair: pair[0])))


def trace_of(metric: str, data: Mapping[str, Any]) -> Trace:
    """The Trace of ``metric`` in ``data`` (metric -> Series or number, as ``checker.normalize`` gives)."""
    value = data.get(metric)
    if isinstance(value, Series):
        return Trace(metric, tuple(value.steps), tuple(value.step_values))
    if isinstance(value, (int, float)):
        return Trace(metric, scalar=float(value))
    return Trace(metric, missing=True)


def _argument(node: ast.expr, data: Mapping[str, Any]) -> Any:
    """The value of an argument node (``-20``, ``10 * 2``) computed by the engine itself (None on an error)."""
    return evaluate(data, ast.Expression(body=node)).value


def _read_of(node: ast.AST, data: Mapping[str, Any]) -> _Read | None:
    """What a link side reads, when its value is in one metric's units; else None."""
    key = _metric_key(node)
    if key is not None and is_number(data.get(key)):
        return _Read("number", key, ())
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        inner = _metric_key(node.value)
        step = str(node.slice.value)
        if inner is not None and isinstance(data.get(inner), Series):
            return _Read("step", inner, (int(step),)) if step in data[inner] else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IN_UNITS):
        return None
    key = _metric_key(node.args[0]) if node.args else None
    series = data.get(key) if key is not None else None
    if not isinstance(series, Series) or not series.steps or key is None:
        return None
    helper = node.func.id
    if helper in ("min", "max"):
        return _Read(helper, key, tuple(series.steps)) if len(node.args) == 1 else None
    if helper in ("first", "last"):
        return _Read(helper, key, (series.steps[0] if helper == "first" else series.steps[-1],))
    # mean / median: the step range, its bounds evaluated by the engine, taken as the helper takes it
    params = ("range_start", "range_end")
    given = dict(zip(params, node.args[1:3], strict=False)) | {k.arg: k.value for k in node.keywords if k.arg}
    bounds = {"range_start": 1, "range_end": 0} | {p: _argument(n, data) for p, n in given.items() if p in params}
    if not all(is_number(b) for b in bounds.values()):
        return None
    try:
        steps, _ = step_window(series, bounds["range_start"], bounds["range_end"])
    except ValueError:  # no step in the range: the rule failed, nothing to place
        return None
    return _Read(helper, key, tuple(steps))


def _span(read: _Read) -> str:
    """``steps 181..200`` / ``step 5`` / ``all steps``: what a read covers, for a label."""
    if read.helper in ("min", "max"):
        return "all steps"
    if len(read.steps) == 1:
        return f"step {read.steps[0]}"
    return f"steps {read.steps[0]}..{read.steps[-1]}" if read.steps else ""


def _label(read: _Read, value: float) -> str:
    """``mean of steps 181..200 = 0.43``: an aggregate's level, for the legend."""
    if read.helper == "number":
        return f"{read.metric} = {value:.4g}"
    what = "value at" if read.helper in ("step", "first", "last") else f"{read.helper} of"
    return f"{what} {_span(read)} = {value:.4g}"


def _beyond(read: _Read, op: Operator, bound: float, data: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Steps whose value fails ``value op bound`` in a rule that fails when any one step does.

    ``max(m) < b`` fails on every step >= b, ``min(m) > b`` on every step <= b; a one-step read
    (first, last, ``data["m"]["5"]``) on its step. Other pairings (``max(m) > b``: some step must
    exceed) have no single failing step. Non-finite values are not listed: they are marked as such.
    """
    one_step = read.helper in ("step", "first", "last")
    any_step = read.helper == ("max" if op.fails == "above" else "min")
    if not (one_step or any_step):
        return []
    series = data[read.metric]
    wanted = set(read.steps)
    return [(read.metric, s) for s, v in zip(series.steps, series.step_values, strict=True)
            if s in wanted and math.isfinite(v) and not op.holds(v, bound)]


def _link_nodes(tree: ast.Expression) -> list[tuple[ast.expr, ast.cmpop, ast.expr]]:
    """The (left, operator, right) nodes of each link of a top-level comparison, in order."""
    if not isinstance(tree.body, ast.Compare):
        return []
    nodes = [tree.body.left, *tree.body.comparators]
    return list(zip(nodes, tree.body.ops, nodes[1:], strict=False))


def _reads_data(node: ast.AST) -> bool:
    """Whether a node reads the metrics (``data`` is the one name a rule may use)."""
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


def _finite_number(x: Any) -> bool:
    return is_number(x) and math.isfinite(x)


def plot_spec(index: int, result: CheckResult, data: Mapping[str, Any]) -> RulePlot:
    """What the plot of ``result`` shows (see the module docstring).

    Args:
        index: the rule's position in the report (1-based; names its plot files and ids).
        result: the rule's row of the Metric Checks table.
        data: metric -> Series or number (``checker.normalize`` of the checked metrics).

    Returns:
        The RulePlot. A SKIP rule has its traces only (it was not evaluated).

    Raises:
        RuleError: the rule does not compile (never for a rule ``run_checks`` judged).
    """
    tree = compile_rule(result.rule)
    traces = tuple(trace_of(m, data) for m in named_metrics(tree))
    if result.status == "SKIP":
        return RulePlot(index, result, traces, (), (), ())
    evaluation = evaluate(data, tree)
    levels: list[Level] = []
    failing: list[tuple[str, int]] = []
    comparisons: list[Comparison] = []
    for k, (left, op_node, right) in enumerate(_link_nodes(tree)):
        written = of_node(op_node)
        if not (written.is_order or written.symmetric):  # `in` / `not in`: a membership, no value against a bound
            continue
        link = evaluation.links[k] if k < len(evaluation.links) else None
        bound_on_left = link.bound_on_left if link else not _reads_data(left) and _reads_data(right)
        value_node, bound_node = (right, left) if bound_on_left else (left, right)
        op = seen_from_the_value(written, bound_on_left)
        if link is not None:
            value, bound = (link.right, link.left) if bound_on_left else (link.left, link.right)
            holds = written.holds(link.left, link.right)
            comparisons.append(Comparison(ast.unparse(value_node), value, op.symbol, ast.unparse(bound_node), bound,
                                          holds))
        else:  # the engine stopped before this link (a NaN read, an earlier link false): its bound alone
            value, bound, holds = None, _argument(bound_node, data), False
        if not op.is_order or not _finite_number(bound):
            continue
        value_read, bound_read = _read_of(value_node, data), _read_of(bound_node, data)
        if value_read is not None and value_read.helper in ("mean", "median") and _finite_number(value):
            span = (value_read.steps[0], value_read.steps[-1])  # other reads are points of the series drawn
            levels.append(Level(value_read.metric, value, _label(value_read, value), "value", span, holds=holds))
        if value_read is not None and not _reads_data(bound_node):
            levels.append(Level(value_read.metric, bound, f"bound {bound:.4g}", "bound", None, op, holds))
            failing += _beyond(value_read, op, bound, data)
        elif bound_read is not None:
            covers = (bound_read.steps[0], bound_read.steps[-1]) if bound_read.steps else None
            label = f"bound: {_label(bound_read, bound)}"
            levels.append(Level(bound_read.metric, bound, label, "bound", covers, holds=holds))
    return RulePlot(index, result, traces, tuple(levels), tuple(dict.fromkeys(failing)), tuple(comparisons))


def plot_specs(results: Sequence[CheckResult], data: Mapping[str, Any]) -> list[RulePlot]:
    """:func:`plot_spec` of every result, numbered from 1."""
    return [plot_spec(i, result, data) for i, result in enumerate(results, start=1)]
