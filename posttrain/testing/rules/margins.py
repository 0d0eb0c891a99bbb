"""Margins of comparison rules: how far a value is from its bound, relative to the bound.

``max(data["train/clip_fraction"]) < 0.3`` with a value of 0.27 passes with a margin of
(0.3 - 0.27) / 0.3 = 10%; a threshold that passes by 1% will flake, and ``--min-margin``
shows such a rule as WARN. Pure functions over the links of a rule's top-level comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from posttrain.testing.rules import comparisons
from posttrain.testing.rules.series import is_number


@dataclass(frozen=True)
class Link:
    """One link ``left OP right`` of a top-level comparison (``a < b < c`` has two).

    ``bound_on_left``: the left side is the bound (it reads no metric while the right
    side does, as in ``0.05 < min(data["x"])``); otherwise the right side is.
    """

    left: Any
    op: str
    right: Any
    bound_on_left: bool = False


@dataclass(frozen=True)
class Margin:
    """The value, its bound, and the relative margin (> 0 passing, < 0 failing, 0 at the bound: passing
    only a comparison that is not strict; None: no scale)."""

    value: Any
    bound: Any
    margin: float | None


def link_margin(link: Link) -> Margin | None:
    """The margin of one link; None for ``==``, ``!=``, ``in``, ``not in`` or non-numbers.

    Returns:
        ``Margin(value, bound, m)`` with ``m = slack / |bound|``, the slack the operator's
        :class:`~.comparisons.Comparison` gives (``<``: right - left): > 0 passing, < 0 failing,
        0 at the bound (passing only ``<=`` and ``>=``); ``m`` is None when the bound is 0 (a
        relative margin has no scale there) or a side is not finite.
    """
    comparison = comparisons.of(link.op)
    if not comparison.is_order or not (is_number(link.left) and is_number(link.right)):
        return None
    value, bound = (link.right, link.left) if link.bound_on_left else (link.left, link.right)
    if not (math.isfinite(value) and math.isfinite(bound)):
        return None
    gap = comparison.slack(link.left, link.right)
    return Margin(value, bound, None if bound == 0 else gap / abs(bound))


def binding_margin(links: list[Link]) -> Margin | None:
    """The margin of the tightest link (the one closest to failing), or None if no link has one.

    Args:
        links: the evaluated links of a top-level comparison, in order; a chain that
            stopped at a failing link holds only the links up to it.
    """
    margins = [m for m in map(link_margin, links) if m is not None]
    if not margins:
        return None
    scaled = [m for m in margins if m.margin is not None]
    return min(scaled, key=lambda m: m.margin if m.margin is not None else math.inf) if scaled else margins[0]


def is_thin(margin: Margin | None, min_margin: float) -> bool:
    """True when a pass is closer to its bound than ``min_margin`` (a fraction, 0.05 = 5%)."""
    return margin is not None and margin.margin is not None and 0 <= margin.margin < min_margin
