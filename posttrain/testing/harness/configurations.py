"""run_unit.sh's configurations: a table (``tests/configurations.toml`` in posttrain's own
repository) and the plan it gives.

:func:`make_plan` turns run_unit.sh's arguments into pytest's (or a usage error, or the
``uv run --extra ...`` line to use when the configuration's extra is missing). It is a pure
function of the arguments, the GPU count and what is importable, tested without a shell.
With ``--repeat N`` the plan's command is the repeat runner (``posttrain.testing.harness.repeat``)
instead of one pytest run.

Command line (what run_unit.sh calls)::

    python -m posttrain.testing.harness.configurations [--table T] plan -- ARGS...  # the command, NUL-separated
    python -m posttrain.testing.harness.configurations [--table T] --markdown       # the tables of docs/testing.md

``T`` defaults to ``tests/configurations.toml`` under the current directory (``TABLE_PATH``).

``plan`` exits 2 with one message line on stderr for a usage error or a missing extra.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from posttrain.testing.harness import skips
from posttrain.testing.harness.budget import BUDGET_INI
from posttrain.testing.harness.machine import count_gpus
from posttrain.testing.harness.repeat import REPEAT_FLAG, parse_repeat
from posttrain.testing.harness.skips import SkipRule, SkipTableError, is_importable, load_skip_rules

# Relative: the repository root of the project under test (run_unit.sh runs from there; the
# pytest plugin resolves it against pytest's rootdir, see its ``posttrain_configurations`` ini).
TABLE_PATH = Path("tests") / "configurations.toml"
# Always on in run_unit.sh: CI logs show the slowest tests, and a run that ran nothing fails.
FIXED_PYTEST_ARGS = ("--durations=10", "--fail-on-nothing-ran")


@dataclass(frozen=True)
class Configuration:
    """One row: ``flag`` picks it, ``select`` is its marker expression, ``package`` comes from ``extra``."""

    name: str
    flag: str
    select: str
    extra: str
    package: str
    help: str
    extra_gpu: str = ""
    # a selection file (relative to the repository root): JSON {"tests": [node id, ...], "about": "..."};
    # the row runs only those tests (and any path given with it); "about" is printed with the plan
    tests: str = ""
    # seconds one test's call may take in this row (the harness's posttrain_time_budget_s; 0: none);
    # None: the pytest ini's
    time_budget_s: float | None = None
    # the marker of the tests this row runs and the default leaves out, where ``select`` is an expression
    marker: str = ""

    @property
    def own_marker(self) -> str:
        """The marker whose tests only this row runs: ``marker``, else ``select`` when it is one marker name
        ("" for a row of no marker of its own, such as the default)."""
        return self.marker or (self.select if self.select.isidentifier() else "")

    def extra_for(self, num_gpus: int) -> str:
        """The uv extra to install on a machine with ``num_gpus`` GPUs ("" = none)."""
        return self.extra_gpu if num_gpus > 0 and self.extra_gpu else self.extra


@dataclass(frozen=True)
class Modifier:
    """A combinable flag: tests with ``marker`` are left out unless ``flag`` is given."""

    name: str
    flag: str
    marker: str
    help: str


@dataclass(frozen=True)
class Table:
    configurations: tuple[Configuration, ...]
    modifiers: tuple[Modifier, ...]
    skips: tuple[SkipRule, ...] = ()  # [[skip]]: the declared skip reasons (posttrain.testing.harness.skips)

    @property
    def default(self) -> Configuration:
        return next(c for c in self.configurations if not c.flag)

    def flag_for_marker(self, marker: str) -> str | None:
        """The flag that runs tests carrying ``marker`` (None if no row names it)."""
        for m in self.modifiers:
            if m.marker == marker:
                return m.flag
        for c in self.configurations:
            if c.flag and c.own_marker == marker:
                return c.flag
        return None


@dataclass(frozen=True)
class Plan:
    """What run_unit.sh runs: ``pytest_args`` for the chosen configuration, once or ``repeat`` times."""

    configuration: Configuration
    modifiers: tuple[Modifier, ...]
    marker_expr: str | None  # None: the user's own -m replaced it
    pytest_args: tuple[str, ...]
    repeat: int | None = None  # --repeat N
    about: str = ""  # the selection file's line about its tests (rows with ``tests``)

    @property
    def command(self) -> tuple[str, ...]:
        """The command line run_unit.sh executes: pytest, or the repeat runner around it."""
        if self.repeat is None:
            return ("python", "-m", "pytest", *self.pytest_args)
        return ("python", "-m", "posttrain.testing.harness.repeat", str(self.repeat), "--", *self.pytest_args)


class PlanError(Exception):
    """Usage error or missing extra: run_unit.sh prints the message and exits 2."""


def load_table(path: Path = TABLE_PATH) -> Table:
    """Read the configuration table.

    Raises:
        PlanError: the file is missing, not TOML, has no default row, a row lacks a field, or a
            ``[[skip]]`` row is unusable (a bad pattern, an unknown condition).
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        table = Table(tuple(Configuration(**row) for row in raw["configuration"]),
                      tuple(Modifier(**row) for row in raw.get("modifier", [])),
                      load_skip_rules(raw.get("skip", [])))
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, SkipTableError) as e:
        raise PlanError(f"bad configuration table {path}: {e}") from e
    if sum(not c.flag for c in table.configurations) != 1:
        raise PlanError(f"bad configuration table {path}: exactly one row must have flag = \"\" (the default)")
    return table


def load_selection(configuration: Configuration, root: Path = Path()) -> tuple[tuple[str, ...], str]:
    """The node ids and the "about" line of ``configuration``'s selection file; ((), "") without one.

    Raises:
        PlanError: the file is missing, not JSON, or not {"tests": [str, ...], "about": str} with at least
            one test (one line naming the file).
    """
    if not configuration.tests:
        return (), ""
    path = root / configuration.tests
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError(f"the {configuration.name} configuration's tests file {path}: cannot read it: {e}") from None
    tests = doc.get("tests") if isinstance(doc, dict) else None
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t for t in tests) \
            or not isinstance(doc.get("about", ""), str):
        raise PlanError(f"the {configuration.name} configuration's tests file {path}: expected "
                        '{"tests": [node id, ...], "about": "..."} with at least one test')
    return tuple(tests), doc.get("about", "")


def marker_expression(configuration: Configuration, modifiers_on: Sequence[Modifier], table: Table) -> str:
    """``(select) and not <marker>`` for every modifier not switched on."""
    on = {m.flag for m in modifiers_on}
    left_out = [f"not {m.marker}" for m in table.modifiers if m.flag not in on]
    return " and ".join([f"({configuration.select})", *left_out])


def pytest_long_options() -> set[str]:
    """Every ``--option`` that ``python -m pytest --help`` lists (plugins included)."""
    # every plugin run_unit.sh's pytest loads, the cache provider's --lf/--ff/--sw included
    out = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, timeout=120)
    return set(re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", out.stdout))


def check_flags(argv: Sequence[str], table: Table, known: Callable[[], set[str]] = pytest_long_options) -> None:
    """Every ``--flag`` in ``argv`` is run_unit.sh's or pytest's (``known`` is asked only when
    one is neither a configuration nor a modifier flag; arguments after ``--`` are not flags).

    Raises:
        PlanError: an unknown flag, with the closest known ones ("did you mean ...").
    """
    ours = {c.flag for c in table.configurations if c.flag} | {m.flag for m in table.modifiers} | {REPEAT_FLAG}
    flags = [a.split("=", 1)[0] for a in (argv[:list(argv).index("--")] if "--" in argv else argv)]
    unknown = [a for a in flags if a.startswith("--") and len(a) > 2 and a not in ours]
    if not unknown:
        return
    options = known() | ours
    for flag in unknown:
        if flag not in options:
            close = difflib.get_close_matches(flag, sorted(options), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(close)}?" if close else "; see bash tests/run_unit.sh --help"
            raise PlanError(f"unknown flag {flag}{hint}")


def usage(table: Table) -> str:
    """run_unit.sh's ``--help``: its configurations (from the table), their extras, exit codes."""
    lines = ["usage: uv run --group test bash tests/run_unit.sh [CONFIGURATION] [MODIFIER...] [pytest args / paths...]",
             "", "Configurations (one at most; the default runs when none is given):"]
    for c in table.configurations:
        extra = c.extra + (f" ({c.extra_gpu} with GPUs)" if c.extra_gpu else "") if c.extra else "none"
        lines.append(f"  {c.flag or '(none)':16} {c.help}")
        lines.append(f"  {'':16} tests matching: {c.select}; uv extra: {extra}")
        if c.tests:
            lines.append(f"  {'':16} only the tests listed in {c.tests}")
    lines += ["", "Modifiers (combine with any configuration):"]
    lines += [f"  {m.flag:16} {m.help}" for m in table.modifiers]
    lines += ["", "Runner (combines with any configuration and pytest args):",
              f"  {REPEAT_FLAG + ' N':16} run the selected tests N times, each in a fresh pytest process, and print",
              f"  {'':16} a pass-rate table (flake hunting; docs/testing.md, \"Flake hunting\")"]
    lines += ["", "Everything else goes to pytest unchanged (`python -m pytest --help` lists its options); useful:",
              "  -m EXPR          replaces the configuration's marker filter",
              "  --testmon        run only the tests affected by your edits (code inside Ray actors included)",
              "  --shard I/N      run the I-th of N deterministic, duration-balanced parts (CI's matrix)",
              "  -n auto          parallel workers (pytest-xdist), a Ray cluster each, heaviest modules first",
              "  --cov=posttrain  coverage, Ray workers included",
              "", "Exit status: pytest's (0 passed, 1 failures); 2 usage error, unknown flag or missing uv extra",
              "(the `uv run --extra ...` line to use is printed); 5 nothing was tested (no test selected, or",
              "every selected test skipped). With --repeat: 1 a test failed in any run; 3 infrastructure errors",
              "only (Ray did not start, out of memory, a killed worker or pytest)."]
    return "\n".join(lines)


def make_plan(argv: Sequence[str], num_gpus: int, table: Table,
              importable: Callable[[str], bool] = is_importable,
              known: Callable[[], set[str]] = pytest_long_options, root: Path = Path()) -> Plan:
    """Pick the configuration from run_unit.sh's ``argv`` and build pytest's arguments.

    A user's ``-m EXPR`` replaces the configuration's marker filter; every argument that is
    not a configuration flag goes to pytest unchanged, in order. ``--repeat N`` (or
    ``--repeat=N``) runs them N times (``Plan.command``).
    ``-n N`` (pytest-xdist) without a ``--dist`` of its own gets :func:`xdist_schedule_args`.
    A row with a selection file (``tests``) adds its node ids, read under ``root`` (the repository root).

    Raises:
        PlanError: two ``-only`` flags, ``-m`` without an expression, ``--repeat`` without a
            positive integer, an unknown ``--flag``
            (with a did-you-mean), the configuration's package not importable (the
            message holds the exact ``uv run --extra`` line), or its selection file unreadable.
    """
    check_flags(argv, table, known)
    by_flag = {c.flag: c for c in table.configurations if c.flag}
    modifier_flags = {m.flag: m for m in table.modifiers}
    chosen: Configuration | None = None
    modifiers: list[Modifier] = []
    passthrough: list[str] = []
    user_marker = False
    repeat: int | None = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in by_flag:
            if chosen is not None and chosen.flag != arg:
                raise PlanError(f"{chosen.flag} and {arg} cannot be combined: pick one configuration")
            chosen = by_flag[arg]
        elif arg in modifier_flags:
            modifiers.append(modifier_flags[arg])
        elif arg == REPEAT_FLAG or arg.startswith(REPEAT_FLAG + "="):
            value = arg.partition("=")[2] if "=" in arg else (args.pop(0) if args else "")
            try:
                repeat = parse_repeat(value)
            except ValueError as e:
                raise PlanError(str(e)) from None
        elif arg == "-m":
            if not args:
                raise PlanError("-m needs a marker expression, e.g. -m 'slow and not gpu'")
            user_marker = True
            passthrough += [arg, args.pop(0)]
        else:
            user_marker = user_marker or (arg.startswith("-m") and not arg.startswith("--"))
            passthrough.append(arg)
    configuration = chosen or table.default
    _check_extra(configuration, num_gpus, argv, importable)
    selected, about = load_selection(configuration, root)
    expr = None if user_marker else marker_expression(configuration, modifiers, table)
    marker_args = () if expr is None else ("-m", expr)
    budget = configuration.time_budget_s
    budget_args = () if budget is None else ("-o", f"{BUDGET_INI}={budget:g}")
    return Plan(configuration, tuple(modifiers), expr,
                (*marker_args, *budget_args, *FIXED_PYTEST_ARGS, *xdist_schedule_args(passthrough), *passthrough,
                 *selected), repeat, about)


def xdist_schedule_args(args: Sequence[str]) -> tuple[str, ...]:
    """``--dist loadfile --no-loadscope-reorder`` when ``args`` ask for xdist workers (``-n N``, ``-nN``,
    ``--numprocesses[=]N``; not ``-n 0``) and choose no ``--dist`` (or ``-d``) of their own, else ().

    loadfile keeps a module's tests on one worker (its module-scoped fixtures start Ray actors once);
    without reordering, xdist hands out the modules in the order the workers collected them, which
    the harness makes heaviest first (``parallel.heaviest_modules_first``).
    """
    workers = None
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg in ("-n", "--numprocesses"):
            workers = args[i + 1] if i + 1 < len(args) else None
        elif arg.startswith("--numprocesses="):
            workers = arg.partition("=")[2]
        elif arg.startswith("-n") and not arg.startswith("--"):
            workers = arg[2:].lstrip("=")
        elif arg in ("-d", "--dist") or arg.startswith("--dist="):
            return ()
    if workers is None or workers.strip() == "0":
        return ()
    return ("--dist", "loadfile", "--no-loadscope-reorder")


def _check_extra(configuration: Configuration, num_gpus: int, argv: Sequence[str],
                 importable: Callable[[str], bool]) -> None:
    if not configuration.package or importable(configuration.package):
        return
    extra = configuration.extra_for(num_gpus)
    command = shlex.join(["uv", "run", "--extra", extra, "--group", "test", "bash", "tests/run_unit.sh", *argv])
    raise PlanError(f"the {configuration.name} configuration needs the uv extra '{extra}' "
                    f"({configuration.package} is not importable); run:\n  {command}")


def render_markdown(table: Table) -> str:
    """The configurations table of docs/testing.md (the docs test compares it verbatim)."""
    rows = ["| flag | runs tests matching | uv extra | package checked first | time budget of a call |",
            "|---|---|---|---|---|"]
    for c in table.configurations:
        extra = f"`{c.extra}`" if c.extra else "-"
        if c.extra_gpu:
            extra += f" (`{c.extra_gpu}` with GPUs)"
        flag = f"`{c.flag}`" if c.flag else "(none: default)"
        only = f", only the tests listed in `{c.tests}`" if c.tests else ""
        budget = "the ini's" if c.time_budget_s is None else (f"{c.time_budget_s:g} s" if c.time_budget_s else "none")
        rows.append(f"| {flag} | `{c.select}`{only} | {extra} | {f'`{c.package}`' if c.package else '-'} | {budget} |")
    for m in table.modifiers:
        rows.append(f"| `{m.flag}` (combines with any) | also `{m.marker}` tests, left out otherwise | - | - | - |")
    return "\n".join(rows)


def describe(plan: Plan, num_gpus: int) -> str:
    """One line for the log: configuration, marker filter, GPUs."""
    name = plan.configuration.name + "".join(f" +{m.name}" for m in plan.modifiers)
    marker = f"-m '{plan.marker_expr}'" if plan.marker_expr else "your own -m"
    repeated = f", {plan.repeat} runs (--repeat)" if plan.repeat is not None else ""
    about = f"\nrun_unit.sh: {plan.about}" if plan.about else ""
    return f"run_unit.sh: configuration {name}, {marker}, {num_gpus} GPU(s){repeated}{about}"


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    table_path = TABLE_PATH
    if args[:1] == ["--table"] and len(args) > 1:
        table_path, args = Path(args[1]), args[2:]
    try:
        if args == ["--markdown"]:  # the configurations, then the declared skips
            table = load_table(table_path)
            print(render_markdown(table) + "\n\n" + skips.render_markdown(table.skips))
            return 0
        if args[:1] == ["plan"] and any(a in ("-h", "--help") for a in args[2:]):
            print(usage(load_table(table_path)))
            return 3  # run_unit.sh: help shown, exit 0 without running pytest
        if args[:2] != ["plan", "--"]:
            print("usage: python -m posttrain.testing.harness.configurations [--table T] plan -- ARGS... | --markdown",
                  file=sys.stderr)
            return 2
        num_gpus = count_gpus()
        plan = make_plan(args[2:], num_gpus, load_table(table_path))
    except (PlanError, ValueError) as e:
        print(f"run_unit.sh: {e}", file=sys.stderr)
        return 2
    print(describe(plan, num_gpus), file=sys.stderr)
    sys.stdout.write("".join(arg + "\0" for arg in plan.command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
