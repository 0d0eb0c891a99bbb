"""tools/bisect.sh (posttrain/testing/git_bisect.py): git bisect run on the toolkit's verdicts.

Each test builds a scratch repository of eight commits with a planted regression and runs the
real tool on it, as a user would (``bash tools/bisect.sh ...`` in the repository): the answer is
the commit planted, what flipped is the rule (from the real ``check-metrics`` report) or the test
planted, a flaky check needs ``--repeat``, a commit that cannot run is skipped, and the user's
checkout (branch, HEAD, untracked files) is as it was, every bisect state and worktree gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from posttrain.testing import git_bisect
from posttrain.testing.git_bisect import Judgement, Run, classify, flipped_rules, repeat_verdict

ROOT = Path(__file__).resolve().parents[3]
TOOL = ROOT / "tools" / "bisect.sh"
COMMITS = 8

# A functional check as tests/functional/common.sh runs one: write the run's metrics.json, judge it
# with the real check-metrics into tests/functional/<name>/check_report.json, exit with its status.
CHECK_METRICS = """import json, subprocess, sys
from pathlib import Path
GAIN = {gain}
work = Path("tests/functional/toy")
work.mkdir(parents=True, exist_ok=True)
steps = range(1, 11)
metrics = {{"train/loss": {{str(s): 2.0 / s for s in steps}}, "val/gain": {{str(s): GAIN * s / 10 for s in steps}}}}
(work / "metrics.json").write_text(json.dumps(metrics))
rules = ['last(data["val/gain"]) > 0.1', 'mean(data["train/loss"], -3) < mean(data["train/loss"], 1, 4)']
sys.exit(subprocess.run([sys.executable, "-m", "posttrain.testing.check_metrics", str(work / "metrics.json"), *rules,
                         "--expect-steps", "10", "--output-json", str(work / "check_report.json")]).returncode)
"""
GAIN_RULE = 'last(data["val/gain"]) > 0.1'
LOSS_RULE = 'mean(data["train/loss"], -3) < mean(data["train/loss"], 1, 4)'

# A good commit (n < 5) fails 1 run in 3 at random, seeded by the commit and the run index; a bad
# one (n >= 5) fails every run.
FLAKY = """import os, random, sys
n = int(open("n").read())
run = int(os.environ.get("POSTTRAIN_REPEAT_INDEX", "0"))
flake = random.Random(f"{seed}:{{n}}:{{run}}").random() < 1 / 3
sys.exit(1 if n >= 5 or flake else 0)
"""
# Seed 6: one run per commit misplaces the culprit (commit 3: the flake hits a good commit the
# bisect visits); three runs per commit outvote it.
FLAKY_SEED = 6

PYTEST_FILE = """def test_add():
    assert 2 + 2 == 4


def test_mul():
    assert 2 * 3 == {product}
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def make_repo(path: Path, versions: list[Mapping[str, str | None]]) -> list[str]:
    """A repository on branch ``main`` with one commit per version (``commit 1`` ...): each
    writes its files (None removes one) and ``n``, the commit's number. Returns the hashes."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    shas = []
    for n, files in enumerate(versions, start=1):
        (path / "n").write_text(str(n))
        for name, text in files.items():
            if text is None:
                (path / name).unlink(missing_ok=True)
            else:
                (path / name).parent.mkdir(parents=True, exist_ok=True)
                (path / name).write_text(text)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {n}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def bisect(repo: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The tool as a user runs it; its scratch worktree and logs go under the test's own tmp_path."""
    env = {**os.environ, "TMPDIR": str(repo.parent)}
    return subprocess.run(["bash", str(TOOL), *args], cwd=cwd or repo, capture_output=True, text=True, timeout=300,
                          env=env)


def first_bad(out: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("bisect: first bad commit: ")]
    assert len(lines) == 1, out.stdout + out.stderr
    return lines[0].removeprefix("bisect: first bad commit: ")


def repo_state(repo: Path) -> dict[str, object]:
    """What the bisect must leave as it found it."""
    return {
        "branch": git(repo, "symbolic-ref", "HEAD"),
        "head": git(repo, "rev-parse", "HEAD"),
        "status": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "worktrees": git(repo, "worktree", "list", "--porcelain").count("worktree "),
        "bisect_refs": git(repo, "for-each-ref", "refs/bisect"),
        "bisect_log": Path(repo, git(repo, "rev-parse", "--git-path", "BISECT_LOG")).exists(),
    }


def regression_at(n: int, good: str, bad: str, name: str = "check.sh") -> list[Mapping[str, str | None]]:
    return [{name: good if i < n else bad} for i in range(1, COMMITS + 1)]


# --- the planted regression -------------------------------------------------------------------


def test_a_regression_at_commit_5_is_named_with_the_rule_that_flipped_and_the_checkout_is_untouched(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, [{"check.py": CHECK_METRICS.format(gain=0.0 if n >= 5 else 0.3)}
                            for n in range(1, COMMITS + 1)])
    git(repo, "checkout", "-q", "-b", "feature", shas[6])  # the user is on another branch, not at BAD
    (repo / "notes.txt").write_text("untracked, must survive")
    before = repo_state(repo)

    out = bisect(repo, shas[0], "main", "--", sys.executable, "check.py")

    assert out.returncode == 0, out.stdout + out.stderr
    assert first_bad(out) == f"{shas[4]} commit 5"
    assert f"bisect: last good commit: {shas[3]} commit 4" in out.stdout
    flipped = [ln for ln in out.stdout.splitlines() if "rule that flipped" in ln]
    assert len(flipped) == 1 and f"(PASS -> FAIL): {GAIN_RULE}" in flipped[0], out.stdout
    assert "tests/functional/toy/check_report.json" in flipped[0]
    assert LOSS_RULE not in out.stdout  # it passed on both sides: not a flip
    assert repo_state(repo) == before
    assert (repo / "notes.txt").read_text() == "untracked, must survive"
    assert not (repo / "tests").exists()  # the runs wrote into the scratch worktree only


def test_a_pytest_command_names_the_failing_test_node_ids(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, [{"test_calc.py": PYTEST_FILE.format(product=7 if n >= 5 else 6)}
                            for n in range(1, COMMITS + 1)])
    # without the plugins this environment installs (xdist, hypothesis, the harness...): 3 s less
    out = bisect(repo, shas[0], shas[-1], "--", "env", "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1", sys.executable, "-m",
                 "pytest", "-q", "-p", "no:cacheprovider", "test_calc.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert first_bad(out) == f"{shas[4]} commit 5"
    failing = [ln.removeprefix("bisect: failing test: ") for ln in out.stdout.splitlines() if "failing test:" in ln]
    assert failing == ["test_calc.py::test_mul"]


def test_the_bisect_runs_in_the_directory_it_was_started_from(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, [{"sub/check.sh": "exit 1\n" if n >= 3 else "exit 0\n"} for n in range(1, COMMITS + 1)])
    out = bisect(repo, shas[0], shas[-1], "--", "bash", "check.sh", cwd=repo / "sub")
    assert out.returncode == 0, out.stdout + out.stderr
    assert first_bad(out) == f"{shas[2]} commit 3"


# --- --repeat ---------------------------------------------------------------------------------


def test_a_flaky_check_misplaces_the_culprit_once_and_repeat_finds_it(tmp_path):
    repo = tmp_path / "repo"
    shas = make_repo(repo, [{"check.py": FLAKY.format(seed=FLAKY_SEED)}] * COMMITS)
    command = ("--", sys.executable, "check.py")

    once = bisect(repo, shas[0], shas[-1], *command)
    assert once.returncode == 0 and first_bad(once) != f"{shas[4]} commit 5", once.stdout  # the flake bites

    repeated = bisect(repo, "--repeat", "3", shas[0], shas[-1], *command)
    assert repeated.returncode == 0, repeated.stdout + repeated.stderr
    assert first_bad(repeated) == f"{shas[4]} commit 5"
    assert "run 3/3" in repeated.stdout or "run 2/3" in repeated.stdout


@pytest.mark.parametrize(("outcomes", "repeat", "verdict"), [
    (["pass"], 1, "good"), (["fail"], 1, "bad"), (["skip"], 1, "skip"),
    (["fail"], 3, None), (["fail", "pass"], 3, None), (["fail", "fail"], 3, "bad"), (["pass", "pass"], 3, "good"),
    (["fail", "pass", "pass"], 3, "good"), (["pass", "fail", "fail"], 3, "bad"),
    (["skip", "pass", "fail"], 3, "skip"),  # a tie of the runs with a verdict
    (["skip", "skip", "fail"], 3, "bad"), (["skip", "skip", "skip"], 3, "skip"),
    (["pass", "fail"], 2, "skip"), (["fail", "fail", "fail"], 5, "bad"), (["fail", "fail", "pass"], 5, None),
])
def test_the_repeat_policy_is_the_majority_of_the_runs_with_a_verdict(outcomes, repeat, verdict):
    assert repeat_verdict(outcomes, repeat) == verdict


def test_the_repeat_policy_refuses_what_it_cannot_judge():
    with pytest.raises(ValueError):
        repeat_verdict(["pass", "crash"], 3)
    with pytest.raises(ValueError):
        repeat_verdict(["pass", "pass"], 1)


# --- commits that cannot be judged ------------------------------------------------------------


UNRUNNABLE = {
    "exit-2": ({"check.sh": "echo 'needs 1 GPU, found 0' >&2; exit 2\n"}, (), "exit 2: not a verdict"),
    "missing-script": ({"check.sh": None}, (), "exit 127"),
    "killed": ({"check.sh": "kill -KILL $$\n"}, (), "killed by SIGKILL"),
    "timeout": ({"check.sh": "sleep 60\n"}, ("--timeout", "2"), "timed out after 2 s"),
    "setup-fails": ({"broken": "yes"}, ("--setup", "test ! -e broken"), "setup: exit 1"),
}


@pytest.mark.parametrize("kind", UNRUNNABLE)
@pytest.mark.slow(reason="git bisect over real commits, each judged by a subprocess")
def test_a_commit_that_cannot_be_judged_is_skipped_and_the_bisect_still_converges(tmp_path, kind):
    """Regression at commit 6; commit 4, the bisect's first pick, cannot be judged."""
    files, options, why = UNRUNNABLE[kind]
    versions = [dict(v) for v in regression_at(6, "exit 0\n", "echo 'gain 0.0 < 0.02'; exit 1\n")]
    versions[3].update(files)
    versions[4].setdefault("broken", None)
    repo = tmp_path / "repo"
    shas = make_repo(repo, versions)
    start = time.monotonic()
    out = bisect(repo, *options, shas[0], shas[-1], "--", "bash", "check.sh")
    assert out.returncode == 0, out.stdout + out.stderr
    assert first_bad(out) == f"{shas[5]} commit 6"
    assert why in out.stdout and "commit 4: skip" in out.stdout, out.stdout
    assert time.monotonic() - start < 60


def test_a_skipped_commit_next_to_the_culprit_leaves_both_as_candidates(tmp_path):
    versions = [dict(v) for v in regression_at(5, "exit 0\n", "exit 1\n")]
    versions[3]["check.sh"] = "exit 2\n"
    repo = tmp_path / "repo"
    shas = make_repo(repo, versions)
    out = bisect(repo, shas[0], shas[-1], "--", "bash", "check.sh")
    assert out.returncode == 3, out.stdout + out.stderr
    assert "only skipped commits are left" in out.stdout
    assert f"{shas[3]} commit 4" in out.stdout and f"{shas[4]} commit 5" in out.stdout


@pytest.mark.parametrize(("good", "bad", "message"), [
    ("exit 1\n", "exit 1\n", "fails here too"),
    ("exit 0\n", "exit 0\n", "passes here"),
])
def test_a_good_end_that_fails_or_a_bad_end_that_passes_is_no_answer(tmp_path, good, bad, message):
    repo = tmp_path / "repo"
    shas = make_repo(repo, regression_at(5, good, bad))
    before = repo_state(repo)
    out = bisect(repo, shas[0], shas[-1], "--", "bash", "check.sh")
    assert out.returncode == 3 and message in out.stdout, out.stdout + out.stderr
    assert "first bad commit" not in out.stdout
    assert repo_state(repo) == before


def test_an_interrupt_removes_the_scratch_worktree_and_leaves_the_checkout_as_it_was(tmp_path):
    repo = tmp_path / "repo"
    started = tmp_path / "started"
    shas = make_repo(repo, regression_at(5, f"touch {started}\nsleep 60\n", "exit 1\n"))
    before = repo_state(repo)
    # As a terminal's foreground job: SIGINT at its default action. A process started in the
    # background of a non-interactive shell (`cmd &`) inherits SIGINT ignored, and so would the
    # tool, git and the step under it: the Ctrl-C then stops nothing and the run sleeps its 60 s out.
    proc = subprocess.Popen(["bash", str(TOOL), shas[0], shas[-1], "--", "bash", "check.sh"], cwd=repo, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not started.exists():  # the first run's command is running, not only its log opened
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert repo_state(repo) == before
    assert not list(tmp_path.glob("posttrain-bisect-*/worktree"))


# --- refusals: one line, exit 2, nothing touched ----------------------------------------------


@pytest.fixture
def small_repo(tmp_path) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    return repo, make_repo(repo, regression_at(3, "exit 0\n", "exit 1\n")[:4])


def refused(repo: Path, *args: str) -> str:
    before = repo_state(repo)
    out = bisect(repo, *args)
    lines = out.stderr.splitlines()
    assert out.returncode == 2 and len(lines) == 1 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    assert lines[0].startswith("bisect: error: ")
    assert repo_state(repo) == before
    return lines[0]


@pytest.mark.parametrize(("args", "named"), [
    (("--repeat", "0", "GOOD", "BAD", "--", "true"), "'0'"),
    (("--repeat", "three", "GOOD", "BAD", "--", "true"), "'three'"),
    (("--timeout", "-5", "GOOD", "BAD", "--", "true"), "'-5'"),
    (("--timeout", "nan", "GOOD", "BAD", "--", "true"), "'nan'"),
    (("--frobnicate", "GOOD", "BAD", "--", "true"), "--frobnicate"),
    (("GOOD", "BAD", "true"), "no -- before the command ('true')"),
    (("GOOD", "BAD", "--"), "after --"),
    (("GOOD", "--", "true"), "BAD"),
    (("--report", "/etc/passwd", "GOOD", "BAD", "--", "true"), "'/etc/passwd'"),
    (("nonexistent", "BAD", "--", "true"), "GOOD 'nonexistent' is not a commit"),
])
def test_bad_arguments_are_one_line_naming_the_bad_value(small_repo, args, named):
    repo, shas = small_repo
    args = tuple({"GOOD": shas[0], "BAD": shas[-1]}.get(a, a) for a in args)
    assert named in refused(repo, *args)


def test_good_not_an_ancestor_of_bad_is_refused(small_repo):
    repo, shas = small_repo
    assert "is not an ancestor of BAD" in refused(repo, shas[-1], shas[0], "--", "true")
    git(repo, "checkout", "-q", "-b", "side", shas[0])
    (repo / "side.txt").write_text("a sibling of main's commits")
    git(repo, "add", "side.txt")
    git(repo, "commit", "-q", "-m", "side")
    assert "is not an ancestor of BAD" in refused(repo, "side", "main", "--", "true")
    assert "the same commit" in refused(repo, "main", shas[-1], "--", "true")


@pytest.mark.parametrize("staged", [False, True])
def test_uncommitted_changes_are_refused_and_untracked_files_are_not(small_repo, staged):
    repo, shas = small_repo
    (repo / "check.sh").write_text("exit 0  # an edit not yet committed\n")
    if staged:
        git(repo, "add", "check.sh")
    assert "uncommitted changes to check.sh:" in refused(repo, shas[0], shas[-1], "--", "bash", "check.sh")
    git(repo, "checkout", "-q", "HEAD", "--", "check.sh")
    (repo / "scratch.txt").write_text("untracked")
    out = bisect(repo, shas[0], shas[-1], "--", "bash", "check.sh")
    assert out.returncode == 0 and first_bad(out) == f"{shas[2]} commit 3", out.stdout + out.stderr


def test_outside_a_repository_is_one_line(tmp_path):
    out = bisect(tmp_path, "a", "b", "--", "true")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not inside a git working tree" in out.stderr


def test_help_states_the_contract():
    out = bisect(ROOT, "--help")
    assert out.returncode == 0 and "usage: bisect" in out.stdout and "majority" in out.stdout


# --- the pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "outcome"), [
    (0, "pass"), (1, "fail"), (2, "skip"), (3, "skip"), (4, "skip"), (5, "skip"), (125, "skip"), (126, "skip"),
    (127, "skip"), (137, "skip"), (-9, "skip"), (-15, "skip"), (None, "skip"),
])
def test_only_exit_0_and_1_are_verdicts(code, outcome):
    assert classify(code, "timed out")[0] == outcome


def test_a_timeout_kills_the_whole_process_group(tmp_path):
    marker = tmp_path / "child-alive"
    script = f"(sleep 1; touch {marker}) & sleep 60\n"
    start = time.monotonic()
    code, why = git_bisect.run_once(["bash", "-c", script], tmp_path, dict(os.environ), 0.3, tmp_path / "log")
    assert code is None and why == "timed out after 0.3 s" and time.monotonic() - start < 10
    time.sleep(1.5)
    assert not marker.exists()  # the shell's background child died with it


def test_a_step_that_fails_itself_stops_the_bisect_instead_of_judging(tmp_path):
    assert git_bisect.step_main([str(tmp_path / "no-state")]) == git_bisect.GIT_ABORT


def _report(*rows: tuple[str, str]) -> list[dict[str, object]]:
    return [{"rule": rule, "status": status, "value": None, "bound": None} for rule, status in rows]


def test_flipped_rules_are_the_failing_ones_that_did_not_fail_before():
    good = {"a/check_report.json": _report(("r1", "PASS"), ("r2", "WARN"), ("r3", "PASS"), ("r5", "SKIP"))}
    bad = {"a/check_report.json": _report(("r1", "FAIL"), ("r2", "VACUOUS"), ("r3", "PASS"), ("r4", "FAIL"),
                                          ("r5", "FAIL")),
           "b/check_report.json": _report(("r1", "FAIL"))}
    flips = {(f.report, f.rule, f.before, f.after) for f in flipped_rules(good, bad)}
    assert flips == {("a/check_report.json", "r1", "PASS", "FAIL"), ("a/check_report.json", "r2", "WARN", "VACUOUS"),
                     ("a/check_report.json", "r4", "absent", "FAIL"), ("a/check_report.json", "r5", "SKIP", "FAIL"),
                     ("b/check_report.json", "r1", "absent", "FAIL")}
    assert flipped_rules(bad, bad) == []


def test_the_flip_compares_a_passing_run_of_the_good_commit_with_a_failing_run_of_the_bad_one(tmp_path):
    def run(index: int, outcome: str, status: str) -> Run:
        log = tmp_path / f"{outcome}{index}.log"
        log.write_text("FAILED t.py::test_x - boom\n" if outcome == "fail" else "1 passed\n")
        return Run(index, outcome, "", str(log), {"r.json": _report(("rule", status))})

    good = Judgement("g", "good one", "good", [run(0, "fail", "FAIL"), run(1, "pass", "PASS"), run(2, "pass", "PASS")])
    bad = Judgement("b", "bad one", "bad", [run(0, "pass", "PASS"), run(1, "fail", "FAIL"), run(2, "fail", "FAIL")])
    lines = git_bisect.describe_flip(good, bad)
    assert lines[0].startswith("rule that flipped (PASS -> FAIL): rule")
    assert lines[1:] == ["failing test: t.py::test_x"]


def test_failing_tests_reads_pytests_short_summary():
    log = "\n".join([
        "tests/x.py F.E",
        "=========================== short test summary info ============================",
        "FAILED tests/x.py::test_a[1-2] - AssertionError: assert 1 == 2",
        "ERROR tests/x.py::test_b - RuntimeError: fixture",
        "FAILED tests/x.py::test_c",
        "FAILED tests/x.py::test_a[1-2] - AssertionError: again",
        "1 failed, 1 passed, 1 error in 0.1s",
    ])
    assert git_bisect.failing_tests(log) == ["tests/x.py::test_a[1-2]", "tests/x.py::test_b", "tests/x.py::test_c"]


def test_a_report_that_is_not_check_metrics_json_is_ignored(tmp_path):
    path = tmp_path / "check_report.json"
    for text in ("not json", json.dumps({"rule": "x"}), json.dumps([{"rule": 1, "status": "FAIL"}])):
        path.write_text(text)
        assert git_bisect.read_report(path) == []
