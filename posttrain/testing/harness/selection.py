"""Which tests run: ``gpu(n)`` skips, the deselection report, and "nothing ran" as a failure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from posttrain.testing.harness import parallel
from posttrain.testing.harness.configurations import PlanError, Table, load_table
from posttrain.testing.harness.remote_testmon import UNAFFECTED
from posttrain.testing.harness.shards import OTHER_SHARDS

NOTHING_RAN = pytest.ExitCode.NO_TESTS_COLLECTED  # 5: the same status as "no test selected"


def gpu_skip_reason(item: pytest.Item, num_gpus: int) -> str | None:
    """"needs n GPUs, found m" when the test's ``gpu(n)`` asks for more than the machine has.

    Raises:
        pytest.UsageError: ``gpu`` marker without exactly one positive integer (names the test).
    """
    marker = item.get_closest_marker("gpu")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], int) or marker.args[0] < 1 or marker.kwargs:
        raise pytest.UsageError(f"{item.nodeid}: gpu marker needs one positive integer, e.g. gpu(1); "
                                f"got gpu{marker.args!r}")
    needed = marker.args[0]
    return f"needs {needed} GPUs, found {num_gpus}" if needed > num_gpus else None


def deselection_summary(items: Iterable[pytest.Item], table: Table) -> list[str]:
    """One line per reason: how many deselected tests carry each configuration marker, and the flag that runs them."""
    modifiers = [m.marker for m in table.modifiers]
    rows = [c.own_marker for c in table.configurations if c.flag and c.own_marker]
    counts: Counter[str] = Counter()
    for item in items:
        # every modifier's marker (they combine), but one configuration's: the first in the table's
        # order (a test marked learning and slow runs with --learning-only, which takes its slow tests)
        row = next((m for m in rows if item.get_closest_marker(m)), None)
        own = sorted([m for m in modifiers if item.get_closest_marker(m)] + ([row] if row else []))
        counts[", ".join(own) or "other (your -m / -k)"] += 1
    lines = []
    for reason, n in sorted(counts.items()):
        flags = [table.flag_for_marker(m) for m in reason.split(", ")]
        hint = f" (run with {' '.join(f for f in flags if f)})" if all(flags) else ""
        lines.append(f"{n} deselected: marked {reason}{hint}" if hint else f"{n} deselected: {reason}")
    return lines


def ran_its_body(report: pytest.TestReport) -> bool:
    """Whether ``report`` is a test's body run to a verdict: passed or failed, xfailed or xpassed.

    A test skipped at collection or set-up has no call report; one that calls ``pytest.skip``
    in its body has a call report whose outcome is skipped: neither tested anything. An xfail
    ran its body (to the failure it expected), so it counts.
    """
    if report.when != "call":
        return False
    return not report.skipped or hasattr(report, "wasxfail")


class Selection:
    """pytest hooks for selection; ``num_gpus`` comes from ``machine.count_gpus``, ``table_path``
    is the configuration table whose flags the deselection report names. Under xdist (``role``)
    a worker ships its deselection report to the controller, which prints it."""

    def __init__(self, num_gpus: int, fail_on_nothing_ran: bool, table_path: Path,
                 role: parallel.Role = "single"):
        self.num_gpus = num_gpus
        self.table_path = table_path
        self.fail_on_nothing_ran = fail_on_nothing_ran
        self.role = role
        self.shipped_lines: list[str] | None = None  # controller: the first worker's deselection report
        self.deselected: list[pytest.Item] = []
        self.ran = 0
        self.nothing_ran = False
        self.nothing_to_rerun = False

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            reason = gpu_skip_reason(item, self.num_gpus)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.extend(items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if ran_its_body(report):
            self.ran += 1

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        lines = parallel.received(node, "deselection")
        if self.shipped_lines is None and lines is not None:
            self.shipped_lines = list(lines)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.role == "worker":
            parallel.ship(session.config, "deselection", self._deselection_lines(session.config))
        if self.fail_on_nothing_ran and exitstatus in (pytest.ExitCode.OK, NOTHING_RAN) and self.ran == 0:
            if session.config.stash.get(UNAFFECTED, frozenset()):
                # --testmon found no test affected by the edits: nothing to do is the right answer
                self.nothing_to_rerun = True
                session.exitstatus = pytest.ExitCode.OK
                return
            session.exitstatus = NOTHING_RAN
            self.nothing_ran = True

    def pytest_terminal_summary(self, terminalreporter) -> None:
        lines = self.shipped_lines if self.role == "controller" else self._deselection_lines(terminalreporter.config)
        if lines:
            terminalreporter.section("deselected by the configuration", sep="-")
            for line in lines:
                terminalreporter.write_line(line)
        if self.nothing_ran:
            terminalreporter.write_line("nothing was tested: no test selected, or every selected test skipped (exit 5)",
                                        red=True)
        if self.nothing_to_rerun:
            terminalreporter.write_line("nothing to re-run: no selected test is affected by your edits (--testmon)")

    def _deselection_lines(self, config: pytest.Config) -> list[str]:
        """The deselection report: one line per reason (none when nothing was deselected)."""
        unaffected = config.stash.get(UNAFFECTED, frozenset())
        lines: list[str] = []
        if self.deselected or unaffected:
            # --shard's deselections are one line, not counted by marker (they carry no reason of their own)
            other = config.stash.get(OTHER_SHARDS, None)
            sharded = [i for i in self.deselected if other is not None and i.nodeid in other.nodeids]
            # plain testmon hands over stand-in objects without markers
            stand_ins = [i for i in self.deselected if not hasattr(i, "get_closest_marker")]
            reasoned = {id(i) for i in sharded + stand_ins}
            rest = [i for i in self.deselected if id(i) not in reasoned and i.nodeid not in unaffected]
            try:  # without a table (another project's tree) the lines just count
                table = load_table(self.table_path) if self.table_path.exists() else Table((), ())
                lines = deselection_summary(rest, table)
            except PlanError as e:
                lines = [str(e)]
            if sharded and other is not None:
                lines.append(f"{len(sharded)} deselected: in other shards (--shard {other.shard})")
            if unaffected or stand_ins:
                n = len(unaffected | {i.nodeid for i in stand_ins})
                lines.append(f"{n} deselected: unaffected by your edits (--testmon)")
        return lines
