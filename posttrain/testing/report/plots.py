"""The report's figures, drawn with matplotlib: one per rule, and one summary of every verdict.

Built with matplotlib's object API (``Figure``, saved through its Agg and SVG canvases), never
``pyplot``: no global figure state, no display, nothing that a test or a CI machine without a screen
must configure. Every artist the report's promises rest on has a ``gid`` (``rule-3-bound-0``,
``rule-3-nonfinite-0``, ``rule-3-failing``, ``rule-3-vacuous``), which becomes its ``id`` in the SVG
the HTML page inlines, so tests find them in the figure and on the page.

Per rule: one panel per metric the rule names (its series over steps; NaN and infinities, which
have no place on the value axis, as markers on the panel's top or bottom edge at their step, with
a label), the bound as a dashed line with the side where the rule fails shaded, an aggregate
(``mean`` of some steps) as a segment over those steps, the steps beyond the bound ringed; and a
gauge beside them with each comparison's value against its bound, which also shows a bound that is
not in the metric's units (``std(m) > 0``). A bound far beyond the series is not drawn to scale
(it would flatten the series to a line): an arrow at the panel's edge names it.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Sequence
from typing import Literal

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from posttrain.testing.report.plot_spec import Level, RulePlot, Trace, non_finite_name
from posttrain.testing.rules.interpreter import CheckResult
from posttrain.testing.rules.report import format_margin, format_number, format_value_cell, summary_line

STATUS_COLOURS = {"PASS": "#2e7d32", "WARN": "#b8860b", "FAIL": "#c62828", "VACUOUS": "#8e24aa", "SKIP": "#757575"}
SERIES_COLOUR = "#1f77b4"
BOUND_COLOUR = "#e65100"
BAD_COLOUR = "#d50000"  # failing steps and non-finite values
# A level further from the series than this many times its range or its largest |value| is not drawn
# to scale: max(loss) < 1e29 would flatten a loss of order 1 into a line at 0.
SCALE_REACH = 4.0
MAX_NON_FINITE_LABELS = 5  # labelled markers per panel; the rest are counted in one label
# No date (a report of the same run is the same file) and no RDF block, whose vocabulary URLs would be
# the page's only "http" text besides the SVG namespaces.
SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}
HEADING = "heading"  # the gid of a rule figure's title lines
VACUOUS_TEXT = "VACUOUS: it passes on every adversarial stand-in, so it cannot catch a broken run"


def _finite_range(trace: Trace) -> tuple[float, float] | None:
    values = [v for v in trace.values if math.isfinite(v)]
    if trace.scalar is not None and math.isfinite(trace.scalar):
        values.append(trace.scalar)
    return (min(values), max(values)) if values else None


def _on_scale(y: float, low: float, high: float) -> bool:
    """Whether a level at ``y`` may set the panel's limits without flattening the series."""
    reach = SCALE_REACH * max(high - low, abs(low), abs(high), 1e-12)
    return low - reach <= y <= high + reach


def _draw_series(ax: Axes, trace: Trace, gid: str) -> None:
    """The series with non-finite values left out of the line (a gap), marked by :func:`_draw_non_finite`."""
    shown = [v if math.isfinite(v) else math.nan for v in trace.values]
    few = len(shown) <= 60
    ax.plot(trace.steps, shown, color=SERIES_COLOUR, lw=1.4, marker="o" if few else None, ms=3.5, label=trace.metric,
            gid=gid)


def _draw_non_finite(ax: Axes, trace: Trace, gid: str) -> None:
    """NaN and +inf as markers on the top edge, -inf on the bottom edge, at their steps, labelled."""
    bad = trace.non_finite()
    if not bad:
        return
    edge = ax.get_xaxis_transform()  # x in steps, y in the panel's height (0 bottom, 1 top)
    ys = [0.04 if v == -math.inf else 0.96 for _, v in bad]
    ax.plot([s for s, _ in bad], ys, transform=edge, ls="none", marker="X", ms=9, color=BAD_COLOUR, clip_on=False,
            label=f"non-finite ({len(bad)})", gid=gid, zorder=5)
    for step, _ in bad:
        ax.axvline(step, color=BAD_COLOUR, lw=0.8, ls=":", alpha=0.7)
    for (step, value), y in list(zip(bad, ys, strict=True))[:MAX_NON_FINITE_LABELS]:
        # along the step's dotted line, so that labels of neighbouring steps do not overlap
        top = y > 0.5
        ax.annotate(f"{non_finite_name(value)} at step {step}", (step, y), xycoords=edge, xytext=(2, -9 if top else 9),
                    textcoords="offset points", rotation=90, color=BAD_COLOUR, fontsize=8, ha="left",
                    va="top" if top else "bottom")
    if len(bad) > MAX_NON_FINITE_LABELS:
        ax.annotate(f"+{len(bad) - MAX_NON_FINITE_LABELS} more non-finite", (0.99, 0.88), xycoords="axes fraction",
                    ha="right", color=BAD_COLOUR, fontsize=8)


def _draw_levels(ax: Axes, levels: Sequence[tuple[int, Level]], index: int, scale: tuple[float, float]) -> None:
    """Bounds (dashed, the failing side shaded) and aggregates (a segment over their steps)."""
    low, high = scale
    near = [level for _, level in levels if _on_scale(level.y, low, high)]
    if near:  # the panel's limits cover the series and every level drawn to scale
        ys = [low, high, *(level.y for level in near)]
        pad = 0.08 * max(max(ys) - min(ys), 1e-12)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)
    bottom, top = ax.get_ylim()
    for k, level in levels:
        gid = f"rule-{index}-{level.role}-{k}"
        # an aggregate in the verdict's colour, so that it stands out of a noisy series drawn in blue
        colour = BOUND_COLOUR if level.role == "bound" else STATUS_COLOURS["PASS" if level.holds else "FAIL"]
        if not _on_scale(level.y, low, high):
            above = level.y > high
            ax.annotate(f"{level.label} ({'far above' if above else 'far below'}: not to scale)",
                        (0.5, 0.99 if above else 0.01), xycoords="axes fraction", ha="center",
                        va="top" if above else "bottom", color=colour, fontsize=8,
                        arrowprops=None, gid=gid)
            ax.annotate("", (0.02, 1.0 if above else 0.0), (0.02, 0.85 if above else 0.15), xycoords="axes fraction",
                        arrowprops={"arrowstyle": "->", "color": colour})
            continue
        style: Literal["--", "-"] = "--" if level.role == "bound" else "-"
        width = 1.6 if level.role == "bound" else 3.2
        if level.steps is None:
            ax.axhline(level.y, color=colour, ls=style, lw=width, label=level.label, gid=gid, zorder=4)
        else:
            ax.hlines(level.y, level.steps[0], level.steps[1], colors=colour, linestyles=style, lw=width,
                      label=level.label, gid=gid, zorder=4, alpha=0.9)
        if level.op is not None:  # the side where the value fails, up to the panel's edge
            edge = top if level.op.fails == "above" else bottom
            # the legend says whether the bound itself fails, which a shaded area cannot show
            ax.axhspan(min(level.y, edge), max(level.y, edge), color=BAD_COLOUR, alpha=0.07, lw=0,
                       gid=f"{gid}-failing-side", label=f"fails {level.op.negated.symbol} {format_number(level.y)}")
    ax.set_ylim(bottom, top)


def _draw_panel(ax: Axes, plot: RulePlot, k: int, trace: Trace) -> None:
    """One metric's panel: series, non-finite markers, levels on it, failing steps."""
    index = plot.index
    if trace.missing:
        ax.text(0.5, 0.5, f"{trace.metric!r} is not in the metrics", ha="center", va="center",
                transform=ax.transAxes, color=BAD_COLOUR, gid=f"rule-{index}-missing-{k}")
        ax.set_yticks([])
        return
    if trace.scalar is not None:
        ax.axhline(trace.scalar, color=SERIES_COLOUR, lw=1.4, label=f"{trace.metric} (one number, no steps)",
                   gid=f"rule-{index}-series-{k}")
        ax.set_xticks([])
    else:
        _draw_series(ax, trace, f"rule-{index}-series-{k}")
        _draw_non_finite(ax, trace, f"rule-{index}-nonfinite-{k}")
    levels = [(j, level) for j, level in enumerate(plot.levels) if level.metric == trace.metric]
    # every value non-finite: the levels alone set the scale, so the bound is still drawn
    scale = _finite_range(trace)
    if scale is None and levels:
        scale = (min(level.y for _, level in levels), max(level.y for _, level in levels))
    if scale is not None:
        _draw_levels(ax, levels, index, scale)
    failing = [step for metric, step in plot.failing if metric == trace.metric]
    if failing:
        values = dict(zip(trace.steps, trace.values, strict=True))
        ax.plot(failing, [values[s] for s in failing], ls="none", marker="o", ms=10 if len(failing) <= 40 else 5,
                mfc="none", mew=1.8 if len(failing) <= 40 else 1.0,
                color=BAD_COLOUR, label=f"beyond the bound ({len(failing)} step{'s' * (len(failing) != 1)})",
                gid=f"rule-{index}-failing-{k}", zorder=6)
    ax.set_ylabel(trace.metric, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best", framealpha=0.85)


def _draw_gauge(ax: Axes, plot: RulePlot) -> None:
    """Each comparison's value (a dot: green holds, red fails) against its bound (an orange bar)."""
    shown = [(k, c) for k, c in enumerate(plot.comparisons) if c.numeric]
    for row, (k, comparison) in enumerate(shown):
        colour = STATUS_COLOURS["PASS"] if comparison.holds else BAD_COLOUR
        ax.plot([comparison.bound] * 2, [row - 0.3, row + 0.3], color=BOUND_COLOUR, lw=3,
                gid=f"rule-{plot.index}-gauge-bound-{k}")
        ax.plot([comparison.value, comparison.bound], [row, row], color="#9e9e9e", lw=1, ls=":")
        ax.plot([comparison.value], [row], "o", color=colour, ms=9, gid=f"rule-{plot.index}-gauge-value-{k}")
        ax.annotate(f"{format_number(comparison.value)} {comparison.op} {format_number(comparison.bound)}",
                    (0.5, row + 0.42), xycoords=("axes fraction", "data"), ha="center", fontsize=8)
    xs = [x for _, c in shown for x in (c.value, c.bound)]
    # a value on its bound of 0 (min(grad_norm) > 0 on a run of zeros) still gets a readable axis
    pad = 0.15 * max(max(xs) - min(xs), 0.1 * max(abs(x) for x in xs)) or 1.0
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(len(shown) - 0.4, -0.6)
    ax.set_yticks([])
    ax.tick_params(axis="x", labelsize=7, labelrotation=30)
    margin = format_margin(plot.result.margin)
    ax.set_title(f"value vs bound{f' (margin {margin})' if margin else ''}", fontsize=9)


def rule_figure(plot: RulePlot) -> Figure:
    """The figure of one rule (see the module docstring).

    Args:
        plot: what to show (``plot_spec.plot_spec``).

    Returns:
        A matplotlib Figure, not yet saved.
    """
    result, index = plot.result, plot.index
    gauge = any(c.numeric for c in plot.comparisons)
    rows = max(1, len(plot.traces))
    fig = Figure(figsize=(11, 1.6 + 2.3 * rows), layout="constrained")
    grid = fig.add_gridspec(rows, 2 if gauge else 1, width_ratios=[4, 1] if gauge else [1])
    axes = [fig.add_subplot(grid[r, 0]) for r in range(rows)]
    rule_text = "\n".join(textwrap.wrap(result.rule, 100, break_on_hyphens=False))
    fig.suptitle(f"{result.status}  rule {index}\n{rule_text}", x=0.01, ha="left", fontsize=11,
                 color=STATUS_COLOURS[result.status], fontfamily="monospace", gid=HEADING)
    verdict = format_value_cell(result) + (f": {result.message}" if result.message else "")
    axes[0].set_title("\n".join(textwrap.wrap(verdict, 130)), loc="left", fontsize=9, gid=HEADING)
    if not plot.traces:
        axes[0].text(0.5, 0.5, "the rule reads no metric", ha="center", va="center", transform=axes[0].transAxes)
        axes[0].set_xticks([])
        axes[0].set_yticks([])
    for k, (ax, trace) in enumerate(zip(axes, plot.traces, strict=False)):
        _draw_panel(ax, plot, k, trace)
    axes[-1].set_xlabel("step")
    if gauge:
        _draw_gauge(fig.add_subplot(grid[:, 1]), plot)
    if result.status == "VACUOUS":
        axes[0].text(0.5, 0.5, VACUOUS_TEXT, transform=axes[0].transAxes, ha="center", va="center", fontsize=10,
                     color="white", wrap=True, gid=f"rule-{index}-vacuous", zorder=10,
                     bbox={"boxstyle": "round", "facecolor": STATUS_COLOURS["VACUOUS"], "alpha": 0.85})
    return fig


def drop_headings(fig: Figure) -> Figure:
    """``fig`` without its status, rule and verdict lines, for the page, which has them as text
    above the plot; the PNG, read alone, keeps them."""
    for text in fig.findobj(lambda artist: artist.get_gid() == HEADING):
        text.set_visible(False)
        text.set_in_layout(False)
    return fig


def summary_figure(results: Sequence[CheckResult]) -> Figure:
    """Every rule's verdict on one image: a coloured status, the rule, its value and bound."""
    rows = len(results)
    fig = Figure(figsize=(11, 0.8 + 0.32 * max(rows, 1)))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    ax.set_ylim(rows + 1.6, -0.2)
    ax.text(0.01, 0.6, f"Metric Checks ({summary_line(list(results))})", fontsize=13, fontweight="bold",
            va="center")
    for row, result in enumerate(results):
        y = row + 1.8
        colour = STATUS_COLOURS[result.status]
        ax.add_patch(Rectangle((0.01, y - 0.4), 0.08, 0.8, color=colour, gid=f"summary-{row + 1}-{result.status}"))
        ax.text(0.05, y, result.status, color="white", fontsize=9, fontweight="bold", ha="center", va="center")
        rule = result.rule if len(result.rule) <= 84 else result.rule[:83] + "…"
        ax.text(0.10, y, rule, fontsize=9, fontfamily="monospace", va="center")
        # a rule with no value (a NaN read, a missing metric) shows why instead
        cell = format_value_cell(result) if result.value is not None or not result.message else result.message
        ax.text(0.99, y, cell if len(cell) <= 44 else cell[:43] + "…", fontsize=9, va="center", ha="right",
                color=colour)
    return fig


def figure_bytes(fig: Figure, fmt: str, salt: str = "") -> bytes:
    """``fig`` saved as ``png`` or ``svg``. In an SVG, text stays text (searchable, and found by the
    tests), and ``salt`` keeps the ids of several SVGs on one page apart."""
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt or None}):
        fig.savefig(buffer, format=fmt, dpi=100, metadata=SVG_METADATA if fmt == "svg" else None)
    return buffer.getvalue()
