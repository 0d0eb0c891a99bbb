"""What each comparison operator of a rule means, defined once for the checker and every tool.

The checker (:mod:`.interpreter`) decides ``a OP b`` with :meth:`Comparison.holds`; the tools that
read a rule's comparison afterwards - margins (:mod:`.margins`), calibration
(``posttrain.testing.calibrate``), the report's plots (``posttrain.testing.report.plot_spec``) -
ask the same row which side of the bound fails and whether the bound itself does. No tool keeps a
table of its own, so none can read ``<`` as ``<=``, or shade the failing side of
``0.05 < min(m)`` above the bound while the checker fails it below.

An order comparison is two facts, and everything else is derived from them:

* ``upper``: the bound is an upper bound (``<``, ``<=``: the value fails above it), or a lower
  one (``>``, ``>=``: it fails below);
* ``strict``: the bound itself fails (``<``, ``>``).

From those: whether ``value OP bound`` holds; the comparison seen from the other side
(``0.05 < min(m)`` is ``min(m) > 0.05``: the other side, the same strictness); what fails it (its
negation: ``<`` fails at ``>=``); and by how much it holds (:meth:`Comparison.slack`).
``==``, ``!=``, ``in`` and ``not in`` compare no value with a bound: they hold by their relation
and have no side.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Comparison:
    """One comparison operator of the rule language.

    Attributes:
        symbol: as written in a rule (``"<="``).
        upper: True for ``<``/``<=`` (the value must stay below the bound), False for ``>``/``>=``,
            None for an operator that is not an order (``==``, ``!=``, ``in``, ``not in``).
        strict: an order comparison fails at the bound itself (``<``, ``>``).
        relation: how a non-order operator holds (None for the order ones: derived from the above).
        symmetric: ``a OP b`` is ``b OP a`` (``==``, ``!=``).
    """

    symbol: str
    upper: bool | None = None
    strict: bool = False
    relation: Callable[[Any, Any], bool] | None = None
    symmetric: bool = False

    @property
    def is_order(self) -> bool:
        """Compares a value with a bound (``<``, ``<=``, ``>``, ``>=``)."""
        return self.upper is not None

    def holds(self, left: Any, right: Any) -> bool:
        """Whether ``left OP right`` holds: for an order, strictly on the passing side of ``right``,
        or at it when not strict. A NaN on either side never holds an order."""
        if self.upper is None:
            assert self.relation is not None
            return bool(self.relation(left, right))
        inside = left < right if self.upper else left > right
        return bool(inside or (not self.strict and left == right))

    @property
    def fails(self) -> Literal["above", "below"]:
        """The side of the bound where the value fails (``<``: above).

        Raises:
            ValueError: not an order comparison.
        """
        return "above" if self._order_side() else "below"

    @property
    def flipped(self) -> Comparison:
        """The same comparison with its sides swapped: ``b < a`` is ``a > b``.

        Raises:
            ValueError: a membership test (``in``, ``not in``), which has no other side.
        """
        if self.symmetric:
            return self
        return order(not self._order_side(), self.strict)

    @property
    def negated(self) -> Comparison:
        """The order comparison that holds exactly where this one fails: ``<`` fails at ``>=``.

        Raises:
            ValueError: not an order comparison.
        """
        return order(not self._order_side(), not self.strict)

    def slack(self, left: float, right: float) -> float:
        """How far ``left OP right`` is inside its passing side, in the units of its sides:
        ``right - left`` for ``<``/``<=``, ``left - right`` for ``>``/``>=``. > 0 holds, < 0 fails;
        0 is the bound itself, which holds only when not strict.

        Raises:
            ValueError: not an order comparison.
        """
        return right - left if self._order_side() else left - right

    def _order_side(self) -> bool:
        if self.upper is None:
            raise ValueError(f"`{self.symbol}` compares no value with a bound")
        return self.upper


# fmt: off
_BY_NODE: dict[type[ast.cmpop], Comparison] = {
    ast.Lt: Comparison("<", upper=True, strict=True), ast.LtE: Comparison("<=", upper=True, strict=False),
    ast.Gt: Comparison(">", upper=False, strict=True), ast.GtE: Comparison(">=", upper=False, strict=False),
    ast.Eq: Comparison("==", relation=operator.eq, symmetric=True),
    ast.NotEq: Comparison("!=", relation=operator.ne, symmetric=True),
    ast.In: Comparison("in", relation=lambda a, b: a in b),
    ast.NotIn: Comparison("not in", relation=lambda a, b: a not in b),
}
# fmt: on
NODES: tuple[type[ast.cmpop], ...] = tuple(_BY_NODE)  # the operators a rule may use (the compiler's whitelist)
_BY_SYMBOL = {c.symbol: c for c in _BY_NODE.values()}
ORDER_SYMBOLS: tuple[str, ...] = tuple(c.symbol for c in _BY_NODE.values() if c.is_order)


def of_node(node: ast.cmpop) -> Comparison:
    """The comparison of a parsed operator node (``ast.Lt()`` -> ``<``).

    Raises:
        KeyError: an operator the rule language does not have (``is``; the compiler refuses it first).
    """
    return _BY_NODE[type(node)]


def of(symbol: str) -> Comparison:
    """The comparison written ``symbol`` (``"<="``).

    Raises:
        KeyError: not an operator of the rule language.
    """
    return _BY_SYMBOL[symbol]


def order(upper: bool, strict: bool) -> Comparison:
    """The order comparison with this side and strictness (``order(True, True)`` is ``<``)."""
    return next(c for c in _BY_NODE.values() if c.upper is upper and c.strict is strict)


def seen_from_the_value(comparison: Comparison, bound_on_left: bool) -> Comparison:
    """The comparison as ``value OP bound``: flipped when the rule writes the bound on the left
    (``0.05 < min(m)`` is ``min(m) > 0.05``).

    Raises:
        ValueError: ``bound_on_left`` for a membership test (it has no other side).
    """
    return comparison.flipped if bound_on_left else comparison
