"""``check-metrics --report DIR``: the verdicts as pictures a person can read.

DIR gets ``index.html`` (one self-contained page: the verdict table, then each rule's plot inline),
``rule-01.png``, ``rule-02.png``, ... (one per rule, numbered as the table's rows) and
``summary.png`` (every verdict on one image, to embed where a page cannot be, such as a CI job's
summary). What a rule's plot shows is worked out from the rule engine (:mod:`.plot_spec`), drawn by
:mod:`.plots` and laid out by :mod:`.page`.

The plotting library is matplotlib, an optional extra (``report``): the rule engine and the rest of
the toolkit need nothing beyond rich and pytest. Why matplotlib: one library writes both outputs
from one figure, a PNG through its Agg renderer and an SVG the page inlines, with no browser, no
JavaScript and no network at any point. An interactive library such as plotly would put ~4.5 MB of
JavaScript into every page to stay self-contained and needs a headless browser (kaleido) to write
a PNG; the PNGs are what a CI summary or a pull-request comment can show.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.testing.rules.interpreter import CheckResult

INSTALL_HINT = "pip install 'posttrain-testing[report]', or uv sync --extra report in a posttrain checkout"
PAGE = "index.html"
SUMMARY = "summary.png"


class ReportError(Exception):
    """The report cannot be written: matplotlib is missing, or DIR cannot be written (one line)."""


def require_plotting() -> None:
    """Import matplotlib, the report extra, before any work is done.

    Raises:
        ReportError: matplotlib is not installed (the message says how to install it).
    """
    try:
        importlib.import_module("matplotlib")
    except ImportError:
        raise ReportError(f"--report needs matplotlib, which is not installed ({INSTALL_HINT})") from None


def rule_png(index: int) -> str:
    """The file name of rule ``index``'s plot (``rule-07.png``)."""
    return f"rule-{index:02d}.png"


def write_report(directory: str | Path, data: Mapping[str, Any], results: Sequence[CheckResult],
                 source: str = "") -> Path:
    """Write the page, one PNG per rule and the summary PNG into ``directory``.

    Args:
        directory: created if missing; ``rule-NN.png`` files of an earlier report there are removed
            first, so that a run with fewer rules leaves none of another run's plots behind.
        data: the checked metrics (metric -> step dict, Series or number).
        results: the rules' results, as ``run_checks`` returned them.
        source: where the metrics came from, for the page's heading.

    Returns:
        The page's path.

    Raises:
        ReportError: matplotlib is missing, or ``directory`` cannot be written (naming it).
    """
    require_plotting()
    from posttrain.testing.report.page import render_page
    from posttrain.testing.report.plot_spec import plot_specs
    from posttrain.testing.report.plots import drop_headings, figure_bytes, rule_figure, summary_figure
    from posttrain.testing.rules.checker import normalize

    out = Path(directory)
    plots = plot_specs(results, normalize(data))
    try:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("rule-[0-9]*.png"):
            stale.unlink()
        svgs = []
        for plot in plots:
            figure = rule_figure(plot)
            (out / rule_png(plot.index)).write_bytes(figure_bytes(figure, "png"))
            svgs.append(figure_bytes(drop_headings(figure), "svg", salt=f"rule-{plot.index}").decode())
        (out / SUMMARY).write_bytes(figure_bytes(summary_figure(results), "png"))
        page = out / PAGE
        page.write_text(render_page(plots, svgs, source), encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the report to {out}: {e}") from None
    return page
