"""A time budget per test: a test whose call takes longer than the budget says why, or fails the run.

A tier's time is the sum of its tests', and it grows one slow test at a time: each is a few
seconds nobody decided to spend. The pytest ini sets a budget for one test's call phase
(``posttrain_time_budget_s``; 0, the default, sets none). A test that needs longer carries
``@pytest.mark.slow(reason="...")``: the reason is what the seconds buy (a real Ray cluster, a
run that must really learn). Where the budget is strict (``--strict-budget``, or ``$CI`` true)
a call over the budget without a reason fails the run, one line naming the test and its time;
elsewhere the lines are printed and the run's status is left alone (a laptop under load is not
a verdict on the test). ``--durations-report`` prints the tests marked slow with their times and
reasons, slowest first.

Only the call phase counts: set-up and teardown are mostly fixtures shared by a module, whose
cost one test's budget cannot judge. The decisions are the pure :func:`violations` and
:func:`report_lines`; the pytest hooks are :class:`TimeBudget`. Under xdist the controller
judges every worker's reports (the worker attaches the test's slow reason to its call report).
The harness registers the ``slow(reason)`` marker unless the project's ini declares ``slow`` itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

BUDGET_INI = "posttrain_time_budget_s"
SLOW_MARKER = "slow"
SLOW_MARKER_HELP = ("slow(reason): the test's call takes longer than the time budget (posttrain_time_budget_s); "
                    "the reason says what the seconds buy")
SLOW_REASON = "posttrain_slow_reason"  # on a call report: the test's slow reason ("" marked without one)


@dataclass(frozen=True)
class Timing:
    """One test's call phase: ``seconds`` of wall-clock time (pytest's report duration) and its
    slow reason (None: not marked slow; "": marked without a reason)."""

    nodeid: str
    seconds: float
    slow: str | None


def parse_budget(value: str) -> float:
    """The budget of the ini value ``value`` in seconds (0: no budget).

    Raises:
        pytest.UsageError: not a finite number >= 0 (one line naming the value).
    """
    try:
        budget = float(value)
    except ValueError:
        budget = math.nan
    if not math.isfinite(budget) or budget < 0:
        raise pytest.UsageError(f"{BUDGET_INI} = {value!r}: expected seconds, a finite number >= 0 (0: no budget)")
    return budget


def slow_reason(item: pytest.Item) -> str | None:
    """The reason of ``item``'s closest ``slow`` marker (``slow(reason=...)`` or ``slow("...")``);
    "" when it has none, None when the test is not marked slow."""
    marker = item.get_closest_marker(SLOW_MARKER)
    if marker is None:
        return None
    reason = marker.kwargs.get("reason", marker.args[0] if marker.args else "")
    return reason.strip() if isinstance(reason, str) else ""


def violations(timings: Iterable[Timing], budget_s: float) -> list[str]:
    """One line per test whose call took longer than ``budget_s`` seconds and whose slow marker gives
    no reason (or that has none), slowest first; [] when ``budget_s`` is 0 (no budget)."""
    if budget_s <= 0:
        return []
    over = sorted((t for t in timings if t.seconds > budget_s and not t.slow), key=lambda t: (-t.seconds, t.nodeid))
    return [f"{t.nodeid}: its call took {t.seconds:.1f} s, over the {budget_s:g} s budget of one test, and "
            + ("it is not marked slow" if t.slow is None else "its slow marker gives no reason")
            + ": make it faster, or mark it @pytest.mark.slow(reason=...) saying what the seconds buy"
            for t in over]


def report_lines(timings: Iterable[Timing], budget_s: float) -> list[str]:
    """The tests marked slow, slowest first: seconds, node id, reason (a test now within the budget
    says so: its marker may go). The last line totals them."""
    marked = sorted((t for t in timings if t.slow is not None), key=lambda t: (-t.seconds, t.nodeid))
    lines = []
    for t in marked:
        within = " (within the budget now)" if 0 < budget_s and t.seconds <= budget_s else ""
        lines.append(f"{t.seconds:7.1f} s  {t.nodeid}: {t.slow or '(no reason given)'}{within}")
    total = math.fsum(t.seconds for t in marked)
    lines.append(f"{len(marked)} test(s) marked slow, {total:.1f} s of calls together")
    return lines


def declares_slow(marker_lines: Iterable[str]) -> bool:
    """Whether the pytest ini's ``markers`` lines declare ``slow`` already (``slow: ...`` or
    ``slow(reason): ...``): the harness then leaves the project's own wording alone."""
    return any(re.match(rf"\s*{SLOW_MARKER}\s*[(:]", line) for line in marker_lines)


class TimeBudget:
    """pytest hooks: attach each test's slow reason to its call report, collect the call times,
    fail a strict run over the budget, print the lines and (``--durations-report``) the table.
    Under xdist a worker attaches (its own judgement is never shown); the controller, which sees
    every report, judges."""

    def __init__(self, budget_s: float, strict: bool, report: bool):
        self.budget_s, self.strict, self.report = budget_s, strict, report
        self.timings: list[Timing] = []

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):
        report = yield
        reason = slow_reason(item)
        if call.when == "call" and reason is not None:
            setattr(report, SLOW_REASON, reason)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.timings.append(Timing(report.nodeid, report.duration, getattr(report, SLOW_REASON, None)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.strict and violations(self.timings, self.budget_s) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.report:
            terminalreporter.section(f"tests marked slow (budget: {self.budget_s:g} s a call)", sep="-")
            for line in report_lines(self.timings, self.budget_s):
                terminalreporter.write_line(line)
        over = violations(self.timings, self.budget_s)
        if over:
            strict = "strict: fails the run" if self.strict else \
                "not strict: --strict-budget or CI=true fails the run on these"
            terminalreporter.section(f"over the time budget of one test ({strict})", sep="-")
            for line in over:
                terminalreporter.write_line(line, red=self.strict)
