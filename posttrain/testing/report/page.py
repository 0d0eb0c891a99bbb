"""The report's HTML page: one self-contained file (no script, no stylesheet or image from elsewhere).

The verdict table first (each row links to its rule), then one ``<section class="rule">`` per rule
with its status, value, bound and margin as text and as ``data-`` attributes, a VACUOUS or
non-finite notice where there is one, and its figure as inline SVG (text kept as text). Everything
taken from the rules and the metrics file is escaped.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from posttrain.testing.report.plot_spec import RulePlot, non_finite_name
from posttrain.testing.report.plots import STATUS_COLOURS, VACUOUS_TEXT
from posttrain.testing.rules.report import format_margin, format_number, format_value_cell, summary_line

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 1.5em auto; max-width: 1150px;
       color: #212121; padding: 0 1em; }
h1 { margin-bottom: 0.2em; }
p.summary { font-size: 1.15em; margin-top: 0; }
table.verdicts { border-collapse: collapse; width: 100%; font-size: 0.9em; }
table.verdicts th, table.verdicts td { border-bottom: 1px solid #e0e0e0; padding: 0.3em 0.5em; text-align: left;
       vertical-align: top; }
table.verdicts td.check { width: 46%; }
table.verdicts td.value { width: 20%; }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; overflow-wrap: break-word; }
.status { display: inline-block; min-width: 5.5em; text-align: center; color: white; font-weight: bold;
          border-radius: 3px; padding: 0.1em 0.4em; }
section.rule { border: 1px solid #e0e0e0; border-left-width: 6px; border-radius: 4px; margin: 1.5em 0;
               padding: 0.5em 1em; }
section.rule h2 { font-size: 1.05em; }
.notice { padding: 0.4em 0.7em; border-radius: 3px; color: white; font-weight: bold; }
.non-finite { color: #d50000; }
figure { margin: 0.5em 0; }
figure svg { width: 100%; height: auto; }
"""


def _status(status: str) -> str:
    return f'<span class="status" style="background:{STATUS_COLOURS[status]}">{status}</span>'


def _attribute(value: object) -> str:
    """A ``data-`` attribute's text: a number as the table shows it, else its escaped text ("" for None)."""
    return html.escape(format_number(value) if value is not None else "", quote=True)


def _inline_svg(svg: str, index: int) -> str:
    """The ``<svg>`` element of a saved SVG file (its XML prolog and doctype dropped), labelled for a reader."""
    start = svg.index("<svg")
    element = svg[start:]
    return re.sub(r"^<svg\b", f'<svg role="img" aria-label="plot of rule {index}"', element, count=1)


def _non_finite(plot: RulePlot) -> str:
    """``<p class="non-finite">`` naming each metric's NaN/inf steps, or "" when there is none."""
    parts = []
    for trace in plot.traces:
        bad = trace.non_finite()
        if bad:
            listed = ", ".join(f"{non_finite_name(value)} at step {step}" for step, value in bad[:10])
            more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
            parts.append(f"<code>{html.escape(trace.metric)}</code>: {listed}{more}")
    if not parts:
        return ""
    return f'<p class="non-finite">non-finite values (marked on the plot\'s edge): {"; ".join(parts)}</p>'


def _section(plot: RulePlot, svg: str) -> str:
    result = plot.result
    colour = STATUS_COLOURS[result.status]
    bound = result.bound if result.bound is not None else None
    attributes = (f'id="rule-{plot.index}" class="rule status-{result.status.lower()}" '
                  f'data-status="{result.status}" data-value="{_attribute(result.value)}" '
                  f'data-bound="{_attribute(bound)}" data-margin="{html.escape(format_margin(result.margin))}" '
                  f'data-metrics="{html.escape(" ".join(t.metric for t in plot.traces), quote=True)}"')
    lines = [f'<section {attributes} style="border-left-color:{colour}">',
             f"<h2>{_status(result.status)} {plot.index}. <code>{html.escape(result.rule)}</code></h2>",
             f'<p class="value">{html.escape(format_value_cell(result))}</p>']
    if result.status == "VACUOUS":
        lines.append(f'<p class="notice vacuous" style="background:{colour}">{html.escape(VACUOUS_TEXT)}</p>')
    if result.message:
        lines.append(f'<p class="message">{html.escape(result.message)}</p>')
    lines.append(_non_finite(plot))
    lines.append(f"<figure>{_inline_svg(svg, plot.index)}</figure>")
    lines.append("</section>")
    return "\n".join(line for line in lines if line)


def render_page(plots: Sequence[RulePlot], svgs: Sequence[str], source: str) -> str:
    """The whole HTML page.

    Args:
        plots: every rule's RulePlot, in the table's order.
        svgs: each rule's figure as an SVG document (``plots.figure_bytes(..., "svg")``), same order.
        source: where the metrics came from (a path), for the heading.

    Returns:
        The page's text (UTF-8 when written).

    Raises:
        ValueError: ``plots`` and ``svgs`` differ in length, or an SVG has no ``<svg`` element.
    """
    if len(plots) != len(svgs):
        raise ValueError(f"{len(plots)} rules but {len(svgs)} figures")
    results = [plot.result for plot in plots]
    rows = "\n".join(
        f'<tr><td>{_status(p.result.status)}</td><td class="check"><a href="#rule-{p.index}"><code>'
        f'{html.escape(p.result.rule)}</code></a></td><td class="value">{html.escape(format_value_cell(p.result))}</td>'
        f"<td>{html.escape(p.result.message)}</td></tr>"
        for p in plots
    )
    sections = "\n".join(_section(plot, svg) for plot, svg in zip(plots, svgs, strict=True))
    summary = html.escape(summary_line(results))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Metric Checks: {summary}</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>Metric Checks</h1>
<p class="summary">{summary}</p>
<p>metrics: <code>{html.escape(source)}</code></p>
<table class="verdicts">
<thead><tr><th>Status</th><th>Check</th><th>Value</th><th>Message</th></tr></thead>
<tbody>
{rows}
</tbody>
</table>
{sections}
</body>
</html>
"""
