"""Outputs of the rule checker: the rich "Metric Checks" table, JSON rows, a GitHub summary.

The table reads without colour (the status is a word) and wraps to an 80-column terminal;
the JSON rows hold full-precision numbers; the markdown table goes to
``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from rich.table import Table
from rich.text import Text

from posttrain.testing.rules.interpreter import CheckResult, format_value

STATUS_STYLES = {"PASS": "green", "WARN": "yellow", "FAIL": "red", "VACUOUS": "magenta", "SKIP": "dim"}
COLUMNS = ("Status", "Check", "Value", "Message")


def format_number(value: Any) -> str:
    """A value for the table: 4 significant digits for floats, ``N/A`` for None, else its text."""
    if value is None:
        return "N/A"
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return format_value(value, limit=40)


def format_margin(margin: float | None) -> str:
    """A relative margin as a signed percentage (``+12%``, ``-3.5%``); empty when there is none."""
    if margin is None:
        return ""
    return f"{margin:+.1%}" if abs(margin) < 0.1 else f"{margin:+.0%}"


def format_value_cell(result: CheckResult) -> str:
    """The Value cell: the value, and for a comparison its bound and margin (``0.33 (bound 0.15, +121%)``)."""
    value = format_number(result.value)
    if result.bound is None:
        return value
    margin = format_margin(result.margin)
    return f"{value} (bound {format_number(result.bound)}{', ' + margin if margin else ''})"


def _cells(result: CheckResult) -> list[str]:
    return [result.status, result.rule, format_value_cell(result), result.message]


def build_table(results: list[CheckResult]) -> Table:
    """The "Metric Checks" table; every cell is plain text (rule text is never rich markup)."""
    table = Table(title="Metric Checks")
    for name, style, ratio in zip(COLUMNS, ("bold", "", "cyan", "italic"), (None, 3, 2, 2), strict=True):
        table.add_column(name, style=style, overflow="fold", ratio=ratio, no_wrap=ratio is None)
    for result in results:
        cells = _cells(result)
        table.add_row(Text(cells[0], style=STATUS_STYLES[result.status]), *map(Text, cells[1:]))
    return table


def summary_line(results: list[CheckResult]) -> str:
    """``"12 checks: 10 PASS, 1 WARN, 1 FAIL"`` (statuses in table order of severity)."""
    counts: Counter[str] = Counter(r.status for r in results)
    parts = [f"{counts[s]} {s}" for s in STATUS_STYLES if counts[s]]
    return f"{len(results)} checks: {', '.join(parts)}"


def _md(text: str) -> str:
    """A table cell for GitHub markdown: pipes escaped, no HTML, one line."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def markdown_summary(results: list[CheckResult], title: str = "Metric Checks") -> str:
    """A markdown table of the results (for ``$GITHUB_STEP_SUMMARY``), ending with a newline."""
    lines = [f"### {title}", "", summary_line(results), "", "| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for result in results:
        cells = _cells(result)
        cells[1] = f"`{cells[1].replace('|', chr(92) + '|')}`"  # rules contain no backticks
        lines.append("| " + " | ".join([_md(cells[0]), cells[1], *map(_md, cells[2:])]) + " |")
    return "\n".join(lines) + "\n"


def json_report(results: list[CheckResult]) -> list[dict[str, Any]]:
    """One row per rule: rule, status, value, bound, margin, message (valid JSON: no NaN)."""
    return [r.to_json() for r in results]
