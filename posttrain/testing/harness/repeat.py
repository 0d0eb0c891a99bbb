"""``run_unit.sh --repeat N``: run the selected tests N times and print their pass rates.

A flake hunter. Each repetition is a fresh ``python -m pytest`` process; a failure is never
turned green by a later pass. Command line (what run_unit.sh runs for ``--repeat N``; the
plan's pytest arguments follow ``--``)::

    python -m posttrain.testing.harness.repeat N -- PYTEST_ARGS...

Repetition ``i`` (0..N-1) runs ``python -m pytest PYTEST_ARGS --junitxml=... -o
junit_family=xunit1`` with ``$POSTTRAIN_REPEAT_INDEX=i`` (a test derives its seeds from it
through the harness's ``repeat_index`` fixture) and ``$POSTTRAIN_UNIT_RESULTS_DIR`` set to its
own directory, ``<results dir>/unit_results/repeat/run-<i>/`` (``junit.xml`` and
``unit_results.json``), so the repetitions do not overwrite each other's records.

pytest's JUnit XML is the outcome record. In one repetition a test ``passed``, ``failed``,
was ``skipped`` (xfail included), or hit an ``infra`` error: a failure or error whose text
matches :data:`INFRA_PATTERNS`. A repetition whose pytest left no readable XML (it was
killed, or crashed) is one infrastructure error for the whole run, naming its exit status.

Exit status: 0 every run of every selected test passed (skips allowed); 1 a test failed in
any run, or a run's pytest failed with no failing test in its XML; 3 (``EXIT_INFRA``) the
only problems were infrastructure errors; 5 nothing was tested; 2 a bad N, or pytest refused
the arguments; 130 interrupted (the table of the finished runs is printed).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from posttrain.testing.harness import results

REPEAT_FLAG = "--repeat"
REPEAT_INDEX_ENV = "POSTTRAIN_REPEAT_INDEX"
EXIT_INFRA = 3

# A failure or error whose message or traceback matches one of these is an infrastructure
# error, not a test failure (name: what the table calls it). The texts are Ray 2.60's and
# posttrain's; test_harness_repeat.py holds the real messages they were taken from.
INFRA_PATTERNS: tuple[tuple[str, str], ...] = (
    # posttrain.distributed.ray_cluster.init_ray: the local node timed out on every attempt.
    ("Ray did not start", r"\bRayStartError\b"),
    # Ray's memory monitor killed the worker: "1 worker(s) were killed due to the node running
    # low on memory" (older Ray: "Task was killed due to the node running low on memory"); an
    # actor it killed, called again: "Worker exit type: NODE_OUT_OF_MEMORY".
    ("Ray out of memory", r"\bray\.exceptions\.OutOfMemoryError\b|killed due to the node running low on memory"
                          r"|Worker exit type: NODE_OUT_OF_MEMORY"),
    # A worker process died under a task or actor call: SIGKILL, the kernel's OOM killer (Ray
    # cannot tell them from a native crash: "Worker exit type: SYSTEM_ERROR ... (1) the process
    # was killed by the OOM killer ..."); posttrain's WorkerDiedError keeps Ray's first line.
    ("worker killed", r"\bray\.exceptions\.WorkerCrashedError\b|Worker exit type: SYSTEM_ERROR"
                      r"|WorkerDiedError: .* died during .*: The actor died unexpectedly before finishing this task"),
)

Outcome = Literal["passed", "failed", "infra", "skipped"]
_SEVERITY: dict[Outcome, int] = {"skipped": 0, "passed": 1, "infra": 2, "failed": 3}


@dataclass(frozen=True)
class TestResult:
    """One test in one repetition; ``detail``: for ``failed`` / ``infra``, the first line of
    its message (``infra``: prefixed with the pattern's name)."""

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class Run:
    """One repetition: pytest's exit status and its tests (None: no readable JUnit XML)."""

    index: int
    exit_status: int
    results: tuple[TestResult, ...] | None


@dataclass(frozen=True)
class RunProblem:
    """A repetition that failed as a whole: ``infra`` (no XML) or ``failed`` (pytest failed,
    its XML names no failing test)."""

    index: int
    kind: Literal["failed", "infra"]
    message: str


@dataclass(frozen=True)
class Row:
    """One test's counts over the repetitions it appeared in."""

    nodeid: str
    passed: int
    failed: int
    infra: int
    skipped: int

    @property
    def runs(self) -> int:
        return self.passed + self.failed + self.infra + self.skipped

    @property
    def pass_rate(self) -> float | None:
        """Passed / (passed + failed): an infrastructure error says nothing about the test
        (its own column counts it); None when the test never passed or failed."""
        judged = self.passed + self.failed
        return self.passed / judged if judged else None


@dataclass(frozen=True)
class Report:
    """The table, the runs that failed as a whole, every failure's line; the exit status."""

    repeats: int
    rows: tuple[Row, ...]
    problems: tuple[RunProblem, ...]
    failures: tuple[tuple[int, TestResult], ...]  # (repetition, failed or infra result)

    @property
    def flaky(self) -> int:
        return sum(1 for r in self.rows if r.passed and r.failed)

    @property
    def always_failed(self) -> int:
        return sum(1 for r in self.rows if r.failed and not r.passed)

    @property
    def infra_errors(self) -> int:
        return sum(r.infra for r in self.rows) + sum(1 for p in self.problems if p.kind == "infra")

    @property
    def exit_status(self) -> int:
        """1 any failure (a later pass never undoes it), else 3 any infrastructure error, else
        5 no test ever passed, else 0."""
        if any(r.failed for r in self.rows) or any(p.kind == "failed" for p in self.problems):
            return 1
        if self.infra_errors:
            return EXIT_INFRA
        return 0 if any(r.passed for r in self.rows) else 5


def parse_repeat(text: str) -> int:
    """``--repeat``'s value: a positive integer.

    Raises:
        ValueError: anything else (one line naming the value).
    """
    if not re.fullmatch(r"\d+", text.strip()) or int(text) < 1:
        raise ValueError(f"{REPEAT_FLAG} needs a positive integer, got {text!r}")
    return int(text)


def repeat_index(environ: Mapping[str, str] | None = None) -> int:
    """``$POSTTRAIN_REPEAT_INDEX`` of ``environ`` (default ``os.environ``): 0..N-1 under
    ``--repeat``; 0 when unset or empty.

    Raises:
        ValueError: not a non-negative integer (one line naming the value).
    """
    raw = (os.environ if environ is None else environ).get(REPEAT_INDEX_ENV, "")
    if not raw:
        return 0
    if not re.fullmatch(r"\d+", raw.strip()):
        raise ValueError(f"{REPEAT_INDEX_ENV}={raw!r}: expected a non-negative integer (run_unit.sh --repeat sets it)")
    return int(raw)


def infra_cause(text: str) -> str | None:
    """The name of the first :data:`INFRA_PATTERNS` row that ``text`` matches, else None."""
    return next((name for name, pattern in INFRA_PATTERNS if re.search(pattern, text)), None)


def node_id(testcase: Mapping[str, str]) -> str:
    """A ``<testcase>``'s pytest node id, from its xunit1 ``file``, ``classname`` and ``name``
    (pytest writes ``classname`` as the file's dotted path, then the classes; a collection
    error has no classname); ``classname::name`` where they do not fit."""
    file, classname, name = testcase.get("file", ""), testcase.get("classname", ""), testcase.get("name", "")
    module = re.sub(r"\.py$", "", file.replace("/", "."))
    if file and not classname:  # a collection error: name is the module's dotted path
        return file
    if file and classname == module:
        return f"{file}::{name}"
    if file and classname.startswith(module + "."):
        return "::".join([file, *classname[len(module) + 1:].split("."), name])
    return f"{classname}::{name}" if classname else name


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _testcase_result(testcase: ET.Element) -> TestResult:
    nodeid = node_id(testcase.attrib)
    outcomes = []
    for child in testcase:
        if child.tag in ("failure", "error"):
            message = child.get("message", "")
            cause = infra_cause(f"{message}\n{child.text or ''}")
            outcomes.append(TestResult(nodeid, "failed", _first_line(message) or child.tag) if cause is None
                            else TestResult(nodeid, "infra", f"{cause}: {_first_line(message)}"))
        elif child.tag == "skipped":
            outcomes.append(TestResult(nodeid, "skipped"))
    return max(outcomes, key=lambda r: _SEVERITY[r.outcome], default=TestResult(nodeid, "passed"))


def read_junit(text: str) -> tuple[TestResult, ...]:
    """The tests of one pytest JUnit XML document, one per node id (a test reported twice, a
    failed call and a teardown error, keeps its worst outcome: failed > infra > passed > skipped).

    Raises:
        ValueError: not XML, or no ``<testsuite>`` in it.
    """
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not JUnit XML: {e}") from None
    if root.tag != "testsuite" and root.find("testsuite") is None:
        raise ValueError(f"not JUnit XML: the root is <{root.tag}>, with no <testsuite>")
    merged: dict[str, TestResult] = {}
    for testcase in root.iter("testcase"):
        result = _testcase_result(testcase)
        seen = merged.get(result.nodeid)
        if seen is None or _SEVERITY[result.outcome] > _SEVERITY[seen.outcome]:
            merged[result.nodeid] = result
    return tuple(merged.values())


def describe_exit(exit_status: int) -> str:
    """``status 1``, or ``signal SIGKILL`` for a process a signal killed (a negative status)."""
    if exit_status < 0:
        try:
            return f"signal {signal.Signals(-exit_status).name}"
        except ValueError:
            return f"signal {-exit_status}"
    return f"status {exit_status}"


def run_problem(run: Run) -> RunProblem | None:
    """What went wrong with the repetition as a whole, beyond its tests' own outcomes."""
    if run.results is None:
        return RunProblem(run.index, "infra", f"pytest exited with {describe_exit(run.exit_status)} and left no "
                                               "readable JUnit XML (killed or crashed)")
    if run.exit_status not in (0, 5) and not any(r.outcome in ("failed", "infra") for r in run.results):
        return RunProblem(run.index, "failed", f"pytest exited with {describe_exit(run.exit_status)} but its "
                                                "JUnit XML records no failing test")
    return None


def summarize(runs: Sequence[Run], repeats: int) -> Report:
    """The pass-rate table of ``runs`` (rows: lowest pass rate first, then by node id; a test
    that never passed or failed last, those with infrastructure errors first among them)."""
    counts: dict[str, dict[Outcome, int]] = {}
    failures: list[tuple[int, TestResult]] = []
    for run in runs:
        for result in run.results or ():
            counts.setdefault(result.nodeid, {"passed": 0, "failed": 0, "infra": 0, "skipped": 0})
            counts[result.nodeid][result.outcome] += 1
            if result.outcome in ("failed", "infra"):
                failures.append((run.index, result))
    rows = [Row(nodeid, c["passed"], c["failed"], c["infra"], c["skipped"]) for nodeid, c in counts.items()]
    rows.sort(key=lambda r: (r.pass_rate is None, r.pass_rate or 0.0, -r.infra, r.nodeid))
    problems = tuple(p for p in map(run_problem, runs) if p is not None)
    return Report(repeats, tuple(rows), problems, tuple(failures))


LABEL = {"failed": "failed", "infra": "infrastructure error"}
EXIT_MEANING = {0: "every run of every test passed", 1: "a test failed in at least one run",
                EXIT_INFRA: "infrastructure errors only, no test failure", 5: "nothing was tested"}


def render(report: Report, detail_width: int = 160) -> str:
    """The pass-rate table, one line per failure / infrastructure error / failed run, and the
    summary line, as plain aligned text."""
    header = ("test", "runs", "passed", "failed", "infra", "skipped", "pass rate")
    cells = [header] + [(r.nodeid, str(r.runs), str(r.passed), str(r.failed), str(r.infra), str(r.skipped),
                         "-" if r.pass_rate is None else f"{r.pass_rate:.0%}") for r in report.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join([row[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True))])
             for row in cells]
    details = [(index, f"run {index} {LABEL[result.outcome]}: {result.nodeid}: {result.detail}"[:detail_width])
               for index, result in report.failures]
    details += [(p.index, f"run {p.index} {LABEL[p.kind]}: {p.message}") for p in report.problems]
    lines += [text for _, text in sorted(details, key=lambda d: d[0])]
    lines.append(f"{report.repeats} runs of {len(report.rows)} tests: {report.flaky} flaky (passed and failed), "
                 f"{report.always_failed} always failed, {report.infra_errors} infrastructure errors")
    return "\n".join(lines)


def records_dir(index: int, base: Path) -> Path:
    """Repetition ``index``'s directory for its junit.xml and unit_results.json."""
    return base / "unit_results" / "repeat" / f"run-{index}"


def run_once(index: int, pytest_args: Sequence[str], base: Path) -> Run:
    """Run repetition ``index`` in a fresh pytest process (its output goes to ours)."""
    directory = records_dir(index, base)
    directory.mkdir(parents=True, exist_ok=True)
    junit = directory / "junit.xml"
    junit.unlink(missing_ok=True)  # a stale file must not stand in for a run that wrote none
    env = {**os.environ, REPEAT_INDEX_ENV: str(index), results.RESULTS_DIR_ENV: str(directory)}
    # Last: a --junitxml of the user's must not replace this run's record; xunit1 writes `file` (node ids).
    command = [sys.executable, "-m", "pytest", *pytest_args, f"--junitxml={junit}", "-o", "junit_family=xunit1"]
    status = subprocess.run(command, env=env, check=False).returncode
    try:
        return Run(index, status, read_junit(junit.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return Run(index, status, None)


def run_all(count: int, pytest_args: Sequence[str], base: Path) -> Iterator[Run]:
    """Run the repetitions one after another, announcing each on stdout."""
    for index in range(count):
        print(f"run_unit.sh --repeat: run {index} ({index + 1} of {count}, {REPEAT_INDEX_ENV}={index})", flush=True)
        yield run_once(index, pytest_args, base)


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if len(args) < 2 or args[1] != "--":
        print("usage: python -m posttrain.testing.harness.repeat N -- PYTEST_ARGS...", file=sys.stderr)
        return 2
    try:
        count = parse_repeat(args[0])
    except ValueError as e:
        print(f"run_unit.sh: {e}", file=sys.stderr)
        return 2
    base = results.results_dir(Path.cwd())
    runs: list[Run] = []
    try:
        for run in run_all(count, args[2:], base):
            if run.exit_status == 4:  # pytest's usage error: every repetition would refuse the same way
                print("run_unit.sh: pytest refused the arguments (see above): exit 2", file=sys.stderr)
                return 2
            runs.append(run)
    except KeyboardInterrupt:
        print(render(summarize(runs, len(runs))))
        print(f"run_unit.sh --repeat: interrupted after {len(runs)} of {count} runs: exit 130", file=sys.stderr)
        return 130
    report = summarize(runs, count)
    print(f"run_unit.sh --repeat: {count} runs, pass rate per test")
    print(render(report))
    print(f"run_unit.sh --repeat: exit {report.exit_status}: {EXIT_MEANING[report.exit_status]}")
    print(f"records: {records_dir(0, base).parent}/run-*/ (junit.xml, unit_results.json)")
    return report.exit_status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
