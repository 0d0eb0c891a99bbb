"""Tests for posttrain/testing/rules/report.py: the table, the JSON rows and the GitHub markdown summary."""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from posttrain.testing.rules.interpreter import CheckResult
from posttrain.testing.rules.report import (
    build_table,
    format_margin,
    format_number,
    format_value_cell,
    json_report,
    markdown_summary,
    summary_line,
)

RESULTS = [
    CheckResult('max(data["train/grad_norm"]) < 100', "PASS", 3.1674, "", 100, 0.968),
    CheckResult('max(data["train/clip_fraction"]) < 0.3', "WARN", 0.29, "passes with only 3.3% margin", 0.3, 0.0333),
    CheckResult('mean(data["val/accuracy"], -1) >= 0.5', "FAIL", 0.42, "0.42 >= 0.5 is False", 0.5, -0.16),
    CheckResult('min(data["train/clip_fraction"]) >= 0', "VACUOUS", 0.0, "passes on all 13 stand-ins", 0, None),
    CheckResult('max(data["x"]) < 1.05', "SKIP", None, "x not logged (optional check)"),
    CheckResult('data["a|b"]["1"] < 1 or "[bold]x" in data', "FAIL", math.inf, "`x` is inf; never | passes"),
]


def render(width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(build_table(RESULTS))
    return out.getvalue()


class TestFormatting:
    @pytest.mark.parametrize(
        ("value", "text"),
        [(None, "N/A"), (0.123456, "0.1235"), (1e-7, "1e-07"), (3, "3"), (True, "True"), (math.nan, "nan")],
    )
    def test_format_number(self, value, text):
        assert format_number(value) == text

    @pytest.mark.parametrize(
        ("margin", "text"),
        [(None, ""), (1.2133, "+121%"), (-0.86, "-86%"), (0.048, "+4.8%"), (0.1, "+10%"), (-0.1, "-10%")],
    )
    def test_format_margin(self, margin, text):
        assert format_margin(margin) == text

    def test_a_long_value_is_cut_to_40_characters(self):
        assert format_number("a" * 40) == "a" * 40
        assert format_number("a" * 41) == "a" * 37 + "..."

    def test_value_cell_shows_bound_and_margin(self):
        assert format_value_cell(RESULTS[0]) == "3.167 (bound 100, +97%)"
        assert format_value_cell(RESULTS[3]) == "0 (bound 0)"
        assert format_value_cell(RESULTS[4]) == "N/A"

    def test_summary_line(self):
        assert summary_line(RESULTS) == "6 checks: 1 PASS, 1 WARN, 2 FAIL, 1 VACUOUS, 1 SKIP"


class TestTable:
    @pytest.mark.parametrize("width", [80, 160])
    def test_fits_the_width_without_colour_and_keeps_every_status(self, width):
        text = render(width)
        assert "Metric Checks" in text and "\x1b[" not in text
        assert max(len(line) for line in text.splitlines()) <= width
        for status in ("PASS", "WARN", "FAIL", "VACUOUS", "SKIP"):
            assert status in text

    def test_rule_text_is_not_markup_and_wide_table_keeps_it_on_one_line(self):
        text = render(200)
        assert 'data["a|b"]["1"] < 1 or "[bold]x" in data' in text
        assert "3.167 (bound 100, +97%)" in text


class TestJsonAndMarkdown:
    def test_json_rows_are_valid_json_with_every_field(self):
        rows = json_report(RESULTS)
        assert set(rows[0]) == {"rule", "status", "value", "bound", "margin", "message"}
        assert rows[0]["value"] == 3.1674 and rows[0]["bound"] == 100 and rows[0]["margin"] == 0.968
        assert rows[5]["value"] == "inf"
        json.dumps(rows, allow_nan=False)

    def test_markdown_table_escapes_pipes_and_html(self):
        md = markdown_summary(RESULTS)
        lines = md.splitlines()
        assert lines[0] == "### Metric Checks" and lines[2] == summary_line(RESULTS)
        header, rule_row = lines[4], lines[-1]
        assert header == "| Status | Check | Value | Message |"
        assert rule_row.count(" | ") == 3  # the pipes inside the rule and the message are escaped
        assert rule_row.endswith("never \\| passes |")
        assert '`data["a\\|b"]["1"] < 1 or "[bold]x" in data`' in rule_row
        assert "0.42 &gt;= 0.5 is False" in md and md.endswith("\n")


class TestExactLayout:
    def test_markdown_summary_is_a_github_table_with_every_cell_on_one_line(self):
        results = [
            CheckResult("x < 1", "PASS", 0.5, ""),
            CheckResult("y > 0", "FAIL", -1.0, "-1 > 0 is False\n<see the log>", 0, -1.0),
        ]
        assert markdown_summary(results, title="Checks") == (
            "### Checks\n"
            "\n"
            "2 checks: 1 PASS, 1 FAIL\n"
            "\n"
            "| Status | Check | Value | Message |\n"
            "|---|---|---|---|\n"
            "| PASS | `x < 1` | 0.5 |  |\n"
            "| FAIL | `y > 0` | -1 (bound 0, -100%) | -1 &gt; 0 is False &lt;see the log&gt; |\n"
        )

    def test_the_table_styles_and_sizes_each_column(self):
        table = build_table(RESULTS[:1])
        assert table.title == "Metric Checks"
        columns = [(c.header, c.style, c.ratio, c.no_wrap, c.overflow) for c in table.columns]
        assert columns == [
            ("Status", "bold", None, True, "fold"),
            ("Check", "", 3, False, "fold"),
            ("Value", "cyan", 2, False, "fold"),
            ("Message", "italic", 2, False, "fold"),
        ]
        statuses = build_table(RESULTS).columns[0].cells
        assert [(cell.plain, cell.style) for cell in statuses] == [
            ("PASS", "green"), ("WARN", "yellow"), ("FAIL", "red"),
            ("VACUOUS", "magenta"), ("SKIP", "dim"), ("FAIL", "red"),
        ]


class TestJsonRowValues:
    def test_a_value_json_cannot_hold_exactly_becomes_its_text_and_none_stays_null(self):
        row = CheckResult("r", "FAIL", (1, 2), "m", None, None).to_json()
        assert (row["value"], row["bound"], row["margin"]) == ("(1, 2)", None, None)
        row = CheckResult("r", "PASS", [0.5], "", "abc", -math.inf).to_json()
        assert (row["value"], row["bound"], row["margin"]) == ("[0.5]", "abc", "-inf")
