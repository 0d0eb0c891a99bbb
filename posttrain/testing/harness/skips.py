"""Skip accounting: every reason a test may skip with is declared, with the machine where it is expected.

A skip is a test that did not run, and a machine that lacks what a test needs skips it quietly:
a CI runner without the package a whole module needs goes green on the rest. The configuration
table (``tests/configurations.toml``) therefore declares each skip reason of the suite in a
``[[skip]]`` row: a regular expression the whole reason must match, and the conditions under
which that skip is expected (fewer GPUs than asked for, a package or a tool absent, ...).

At the end of a session the harness prints the skips grouped by row. Where skips are strict
(``--strict-skips``, or ``$CI`` true where the table declares skips), a skip whose reason no row
matches, or whose row's conditions do not hold on this machine, fails the run with one line
naming the test and the reason. The decisions are the pure :func:`account`; the pytest hooks
are :class:`SkipAccounting`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from packaging.version import InvalidVersion, Version

from posttrain.testing.harness.machine import on_ci


def is_importable(package: str) -> bool:
    """Whether ``import package`` would find it (a dotted name finds its parent first)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def _installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Machine:
    """What the conditions of a ``[[skip]]`` row are judged against (injectable for tests)."""

    num_gpus: int
    rootdir: Path
    strict: bool
    importable: Callable[[str], bool] = is_importable
    which: Callable[[str], str | None] = shutil.which
    version: Callable[[str], str | None] = _installed_version


def _older(machine: Machine, value: Any) -> bool:
    name, wanted = value
    have = machine.version(name)
    try:
        return have is not None and Version(have) < Version(wanted)
    except InvalidVersion:
        return False


@dataclass(frozen=True)
class Condition:
    """One kind of ``when`` entry: whether it ``holds`` on a machine for a value, what it
    ``means`` (the docs' wording) and what the machine has (``here``, for the verdict line)."""

    holds: Callable[[Machine, Any], bool]
    means: Callable[[Any], str]
    here: Callable[[Machine, Any], str]


CONDITIONS: dict[str, Condition] = {
    "gpus_below": Condition(lambda m, n: m.num_gpus < int(n), lambda n: f"fewer than {n} GPUs",
                            lambda m, _: f"{m.num_gpus} GPUs"),
    "gpus_at_least": Condition(lambda m, n: m.num_gpus >= int(n), lambda n: f"at least {n} GPUs",
                               lambda m, _: f"{m.num_gpus} GPUs"),
    "module_missing": Condition(lambda m, name: not m.importable(name), lambda name: f"{name} not importable",
                                lambda m, name: "importable" if m.importable(name) else "missing"),
    "module_older": Condition(_older, lambda v: f"{v[0]} older than {v[1]}",
                              lambda m, v: f"{v[0]} {m.version(v[0]) or 'not installed'}"),
    "tool_missing": Condition(lambda m, name: m.which(name) is None, lambda name: f"no `{name}` on PATH",
                              lambda m, name: m.which(name) or "absent"),
    "no_git": Condition(lambda m, _: not (m.rootdir / ".git").exists(), lambda _: "not a git checkout",
                        lambda m, _: "a git checkout" if (m.rootdir / ".git").exists() else "no .git"),
    "local_only": Condition(lambda m, _: not m.strict, lambda _: "never where skips are strict (CI)",
                            lambda m, _: "strict" if m.strict else "not strict"),
}


class SkipTableError(ValueError):
    """A ``[[skip]]`` row that cannot be used: the message names the row and what is wrong."""


@dataclass(frozen=True)
class SkipRule:
    """One ``[[skip]]`` row: ``reason`` must match a skip's whole reason; ``when`` are the
    conditions (all must hold) under which that skip is expected; ``about`` says who skips so."""

    reason: str
    when: Mapping[str, Any]
    about: str = ""
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "pattern", re.compile(self.reason))
        except re.error as e:
            raise SkipTableError(f"[[skip]] reason {self.reason!r} is not a regular expression: {e}") from None
        if not self.when:
            raise SkipTableError(f"[[skip]] reason {self.reason!r}: `when` is empty; say where the skip is expected")
        unknown = sorted(set(self.when) - set(CONDITIONS))
        if unknown:
            raise SkipTableError(f"[[skip]] reason {self.reason!r}: unknown condition {unknown[0]!r}; "
                                 f"known: {', '.join(CONDITIONS)}")

    def expected(self, groups: Mapping[str, str], machine: Machine) -> tuple[bool, str]:
        """Whether this skip is expected on ``machine`` (every condition holds), and the
        conditions said with what the machine has. String values are formatted with the
        reason's named ``groups`` (``"{n}"``)."""
        verdicts = []
        for name, value in self.when.items():
            value, condition = _fill(value, groups), CONDITIONS[name]
            verdicts.append((condition.holds(machine, value),
                             f"{condition.means(value)} (here: {condition.here(machine, value)})"))
        return all(ok for ok, _ in verdicts), "; ".join(said for _, said in verdicts)

    def means(self) -> str:
        """Where the skip is expected, in words, the reason's groups left as ``{name}``."""
        return "; ".join(CONDITIONS[name].means(value) for name, value in self.when.items())


def render_markdown(rules: Iterable[SkipRule]) -> str:
    """The skip table of docs/testing.md (the docs test compares it verbatim)."""
    rows = ["| skip reason (regular expression) | expected where | who skips so |", "|---|---|---|"]
    for rule in rules:
        reason = rule.reason.replace("|", "\\|")
        code = f"`` {reason} ``" if "`" in reason else f"`{reason}`"
        rows.append(f"| {code} | {rule.means()} | {rule.about} |")
    return "\n".join(rows)


def _fill(value: Any, groups: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return value.format_map(groups)
    if isinstance(value, list):
        return [_fill(v, groups) for v in value]
    return value


def load_skip_rules(rows: Iterable[Mapping[str, Any]]) -> tuple[SkipRule, ...]:
    """The ``[[skip]]`` rows of a configuration table as rules.

    Raises:
        SkipTableError: a row lacks ``reason`` or ``when``, has other keys, or is unusable.
    """
    rules = []
    for row in rows:
        extra = sorted(set(row) - {"reason", "when", "about"})
        if "reason" not in row or "when" not in row or extra:
            raise SkipTableError(f"[[skip]] row {dict(row)!r}: needs `reason` and `when` (and optionally `about`)"
                                 + (f", not {extra[0]!r}" if extra else ""))
        rules.append(SkipRule(str(row["reason"]), dict(row["when"]), str(row.get("about", ""))))
    return tuple(rules)


@dataclass(frozen=True)
class Skip:
    """A test (or a module, skipped at collection) that did not run, and the reason it gave."""

    nodeid: str
    reason: str


@dataclass
class Group:
    """The skips one row accounts for, and whether that row's conditions hold here."""

    rule: SkipRule | None  # None: the reason matched no row
    reason: str  # the first skip's reason (the rows group skips whose reasons differ in a number)
    expected: bool
    said: str
    nodeids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Accounting:
    """The skips of a session by row: ``groups`` in the table's order, undeclared ones last."""

    groups: tuple[Group, ...]

    def violations(self) -> list[str]:
        """One line per skip that is undeclared or unexpected on this machine."""
        lines = []
        for g in self.groups:
            for nodeid in g.nodeids:
                if g.rule is None:
                    lines.append(f"undeclared skip: {nodeid}: {g.reason!r} matches no [[skip]] row of the "
                                 "configuration table: declare it with the machines where it is expected")
                elif not g.expected:
                    lines.append(f"unexpected skip: {nodeid}: {g.reason!r} is declared for {g.said}")
        return lines


def account(skips: Iterable[Skip], rules: Iterable[SkipRule], machine: Machine) -> Accounting:
    """Group ``skips`` by the first rule whose pattern matches the whole reason and by what its
    conditions say (``needs 1 GPU`` and ``needs 2 GPUs`` are two groups of one row), and judge each
    group on ``machine``; a reason no rule matches gets a group of its own. Groups come in the
    table's order, undeclared ones last, each in the order of its first skip."""
    rules = tuple(rules)
    groups: dict[tuple[int, str], Group] = {}
    for skip in skips:
        for i, rule in enumerate(rules):
            match = rule.pattern.fullmatch(skip.reason)
            if match:
                expected, said = rule.expected(match.groupdict(), machine)
                key = (i, said)
                groups.setdefault(key, Group(rule, skip.reason, expected, said)).nodeids.append(skip.nodeid)
                break
        else:
            key = (len(rules), skip.reason)
            groups.setdefault(key, Group(None, skip.reason, False, "not declared")).nodeids.append(skip.nodeid)
    return Accounting(tuple(groups[k] for k in sorted(groups, key=lambda k: k[0])))  # stable: first seen first


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str | None:
    """The reason of a skip report (None for any other report, an xfail included)."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def strict_from(option: bool, environ: Mapping[str, str], rules: tuple[SkipRule, ...]) -> bool:
    """Skips are strict with ``--strict-skips``, or under CI (``$CI`` true) where the table declares skips."""
    return option or (bool(rules) and on_ci(environ))


class SkipAccounting:
    """pytest hooks: collect every skip (run time, set-up and collection), print them by row, and
    under strict skips fail the run on an undeclared or unexpected one. Under xdist the controller
    sees every worker's reports and accounts for them; workers account for nothing."""

    def __init__(self, rules: tuple[SkipRule, ...], machine: Machine, active: bool = True):
        self.rules, self.machine, self.active = rules, machine, active
        self.skips: list[Skip] = []
        self.accounting: Accounting | None = None

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        reason = skip_reason(report)
        if reason is not None and self.active:
            self.skips.append(Skip(report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # after the selection's "nothing ran" (tryfirst: a run of skips only stays exit 5) and
        # before unit_results.json records the status (trylast)
        if not self.active:
            return
        self.accounting = account(self.skips, self.rules, self.machine)
        if self.machine.strict and self.accounting.violations() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.accounting or not self.accounting.groups:
            return
        strict = "strict: every skip must be declared and expected here" if self.machine.strict else \
            "not strict: --strict-skips or CI=true fails on an undeclared or unexpected skip"
        terminalreporter.section(f"skips by reason ({strict})", sep="-")
        for g in self.accounting.groups:
            verdict = "expected" if g.expected else ("NOT DECLARED" if g.rule is None else "NOT EXPECTED")
            terminalreporter.write_line(f"{len(g.nodeids):4} {g.reason}: {verdict}: {g.said}")
        if self.machine.strict:
            for line in self.accounting.violations():
                terminalreporter.write_line(line, red=True)


def machine_from(config: pytest.Config, num_gpus: int, rules: tuple[SkipRule, ...]) -> Machine:
    """The machine of this session: its GPU count, rootdir and whether skips are strict."""
    return Machine(num_gpus, config.rootpath, strict_from(bool(config.getoption("strict_skips")), os.environ, rules))
