"""``check-metrics --report DIR`` (posttrain/testing/report/): the verdicts as plots a person reads.

A passing and a failing run, each a small metrics JSON: the page has one section and one plot per
rule, with its bound (as text, as a ``data-bound`` attribute, and as a line in the plot at the
bound's value), the steps beyond the bound ringed, NaN and infinities marked at their steps (not
dropped), and a VACUOUS rule flagged. The figures are checked as objects (where each line is), on the
page (the inline SVG's elements) and as PNG pixels.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")  # the report extra (in the test group)

import numpy as np  # noqa: E402
from matplotlib.image import imread  # noqa: E402

from posttrain.testing import check_metrics  # noqa: E402
from posttrain.testing.report import PAGE, SUMMARY, rule_png  # noqa: E402
from posttrain.testing.report.plot_spec import named_metrics, plot_specs  # noqa: E402
from posttrain.testing.report.plots import BAD_COLOUR, rule_figure  # noqa: E402
from posttrain.testing.rules import check_rules, compile_rule  # noqa: E402
from posttrain.testing.rules.checker import normalize  # noqa: E402
from posttrain.testing.rules.report import format_number  # noqa: E402

STEPS = range(1, 21)
PASSING = {
    "train/loss": {str(s): 2.0 / s for s in STEPS},
    "train/reward_mean": {str(s): 0.1 + 0.03 * s for s in STEPS},
    "train/grad_norm": {str(s): 1.0 + 0.1 * math.sin(s) for s in STEPS},
}
FAILING = {
    **PASSING,
    "train/grad_norm": {**PASSING["train/grad_norm"], "7": 2.6, "12": 3.0},  # beyond the bound 2
    "train/loss": {**PASSING["train/loss"], "9": math.nan, "15": math.inf, "16": -math.inf},
}
RULES = [
    'max(data["train/grad_norm"]) < 2',  # a bound in the metric's units: a line
    'mean(data["train/reward_mean"], -5) > mean(data["train/reward_mean"], 1, 6)',  # a bound that reads a metric
    'std(data["train/loss"]) > 0',  # a bound not in the metric's units: the gauge
    'all_finite(data["train/loss"])',  # no bound
]
VACUOUS_RULE = 'max(data["train/reward_mean"]) < 1e29'  # a bound no run reaches
IN_UNITS_BOUND = {1: 2.0}  # rule index -> the bound drawn as a line across its panel


class Sections(HTMLParser):
    """Each ``<section>`` of the page: its attributes, the ids and classes inside it, its text."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[dict] = []
        self.current: dict | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section":
            self.current = {"attrs": found, "ids": set(), "classes": set(), "svgs": 0, "text": []}
            self.sections.append(self.current)
        elif self.current is not None:
            self.current["ids"].add(found.get("id"))
            self.current["classes"].update((found.get("class") or "").split())
            self.current["svgs"] += tag == "svg"

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.current is not None:
            self.current["text"].append(data)


def _report(tmp_path: Path, metrics: dict, rules: list[str]) -> tuple[int, Path, list[dict]]:
    """Run check-metrics with --report and --output-json; its exit code, report dir and JSON rows."""
    source = tmp_path / "metrics.json"
    source.write_text(json.dumps(metrics))  # NaN/Infinity as JSON's NaN tokens, as the logger writes them
    out, rows = tmp_path / "report", tmp_path / "check_report.json"
    code = check_metrics.main([str(source), *rules, "--report", str(out), "--output-json", str(rows)])
    return code, out, json.loads(rows.read_text())


def _sections(out: Path) -> list[dict]:
    parser = Sections()
    parser.feed((out / PAGE).read_text(encoding="utf-8"))
    return parser.sections


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def _red_pixels(path: Path) -> int:
    """Pixels of the colour of failing steps and non-finite markers (opaque, as the markers are drawn)."""
    rgb = imread(path)[..., :3]
    target = np.array([int(BAD_COLOUR[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int(np.all(np.abs(rgb - target) < 0.02, axis=-1).sum())


def _artists(figure) -> dict:
    """Every artist of a figure that has a gid, by gid."""
    return {a.get_gid(): a for ax in figure.axes for a in ax.get_children() if a.get_gid()}


def test_a_passing_run_has_one_plot_per_rule_each_with_its_bound(tmp_path) -> None:
    code, out, rows = _report(tmp_path, PASSING, RULES)
    assert code == 0 and [r["status"] for r in rows] == ["PASS"] * 4
    sections = _sections(out)
    assert [s["attrs"]["id"] for s in sections] == [f"rule-{i}" for i in range(1, 5)]
    for index, (section, row) in enumerate(zip(sections, rows, strict=True), start=1):
        assert section["svgs"] == 1, index  # its plot, inline
        assert section["attrs"]["data-status"] == row["status"]
        bound = "" if row["bound"] is None else format_number(row["bound"])
        assert section["attrs"]["data-bound"] == bound
        if bound:
            assert f"bound {bound}" in "".join(section["text"])  # the value cell, as the table shows it
        assert _png_size(out / rule_png(index)) == (1100, 390)  # one panel: 11 x 3.9 in at 100 dpi
    # the bound in the metric's units is a line of the plot; one that reads a metric a segment; the
    # std's a bar on the gauge
    assert "rule-1-bound-0" in sections[0]["ids"] and "rule-1-bound-0-failing-side" in sections[0]["ids"]
    assert {"rule-2-value-0", "rule-2-bound-1"} <= sections[1]["ids"]
    assert "rule-3-gauge-bound-0" in sections[2]["ids"]
    assert not any(s["classes"] & {"vacuous", "non-finite"} for s in sections)
    assert _red_pixels(out / rule_png(1)) == 0  # nothing beyond the bound, nothing non-finite
    width, height = _png_size(out / SUMMARY)
    assert width == 1100 and height > 100


def test_a_failing_run_rings_the_steps_beyond_the_bound_and_marks_nan_and_inf_at_their_steps(tmp_path) -> None:
    code, out, rows = _report(tmp_path, FAILING, [*RULES, VACUOUS_RULE])
    assert code == 1
    assert [r["status"] for r in rows] == ["FAIL", "PASS", "FAIL", "FAIL", "VACUOUS"]
    sections = _sections(out)
    assert len(sections) == 5 and all(s["svgs"] == 1 for s in sections)
    assert "rule-1-failing-0" in sections[0]["ids"] and _red_pixels(out / rule_png(1)) > 50
    for section in sections[2:4]:  # the two rules that read the loss
        assert "non-finite" in section["classes"]
        text = "".join(section["text"])
        for label in ("NaN at step 9", "+inf at step 15", "-inf at step 16"):
            assert label in text  # on the page, and on the plot's own labels (SVG text)
            assert text.count(label) == 2, label
    assert _red_pixels(out / rule_png(4)) > 50
    vacuous = sections[4]
    assert vacuous["attrs"]["data-status"] == "VACUOUS" and "vacuous" in vacuous["classes"]
    assert "rule-5-vacuous" in vacuous["ids"]


def test_the_plots_draw_the_bound_at_its_value_and_the_failing_steps_and_nan_where_they_are() -> None:
    results = check_rules(FAILING, [*RULES, 'max(data["train/loss"]) < 1.5'])
    plots = plot_specs(results, normalize(FAILING))
    bound_fig = _artists(rule_figure(plots[0]))
    line = bound_fig["rule-1-bound-0"]
    assert line.get_visible() and list(line.get_ydata()) == [2.0, 2.0]
    ringed = bound_fig["rule-1-failing-0"]
    assert list(ringed.get_xdata()) == [7, 12] and list(ringed.get_ydata()) == [2.6, 3.0]
    # a rule the engine stopped at a NaN still shows its bound, and the finite steps beyond it
    loss = _artists(rule_figure(plots[4]))
    assert list(loss["rule-5-bound-0"].get_ydata()) == [1.5, 1.5]
    assert list(loss["rule-5-failing-0"].get_xdata()) == [1]  # 2.0 / s >= 1.5 at step 1 only
    marks = loss["rule-5-nonfinite-0"]
    assert list(marks.get_xdata()) == [9, 15, 16]
    assert list(marks.get_ydata()) == [0.96, 0.96, 0.04]  # NaN and +inf on the top edge, -inf on the bottom
    series = loss["rule-5-series-0"]
    assert list(series.get_xdata()) == list(STEPS)  # every step stays on the x axis; the line has gaps
    assert [math.isnan(v) for v in series.get_ydata()] == [s in (9, 15, 16) for s in STEPS]
    # an aggregate is a segment over the steps it reads
    mean = _artists(rule_figure(plots[1]))
    (segment,) = mean["rule-2-value-0"].get_segments()
    assert [tuple(p) for p in segment] == [(16, pytest.approx(0.1 + 0.03 * 18)), (20, pytest.approx(0.1 + 0.03 * 18))]


def test_the_page_needs_nothing_from_elsewhere(tmp_path) -> None:
    _, out, _ = _report(tmp_path, FAILING, RULES)
    page = (out / PAGE).read_text(encoding="utf-8")
    assert "<script" not in page and "<link" not in page and "<img" not in page
    # the SVG namespaces are names, not fetched; every link is within the page
    refs = re.findall(r'(?:href|src)="([^"]*)"', page)
    assert refs and all(ref.startswith("#") for ref in refs)
    assert not re.findall(r"url\((?!#)", page)
    assert set(re.findall(r'"(https?://[^"]*)"', page)) == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


def test_report_without_matplotlib_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys) -> None:
    source = tmp_path / "metrics.json"
    source.write_text(json.dumps(PASSING))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # an import of it raises ImportError
    code = check_metrics.main([str(source), RULES[0], "--report", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "--report needs matplotlib" in err and "report" in err
    assert not (tmp_path / "report").exists()


def test_a_report_dir_that_cannot_be_written_is_a_usage_error_naming_it(tmp_path, capsys) -> None:
    source = tmp_path / "metrics.json"
    source.write_text(json.dumps(PASSING))
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    code = check_metrics.main([str(source), RULES[0], "--report", str(blocked / "report")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(blocked / "report") in err


def test_a_report_leaves_no_plot_of_an_earlier_run_with_more_rules(tmp_path) -> None:
    _report(tmp_path, PASSING, RULES)
    _, out, _ = _report(tmp_path, PASSING, RULES[:2])
    assert sorted(p.name for p in out.glob("rule-*.png")) == ["rule-01.png", "rule-02.png"]


def test_the_metrics_a_rule_reads_come_from_its_parsed_tree_in_order() -> None:
    tree = compile_rule('"val/x" in data and mean(data["b"], -3) > data["a"]["0"] + max(data["b"])')
    assert named_metrics(tree) == ["val/x", "b", "a"]
    assert named_metrics(compile_rule("1 < 2")) == []
