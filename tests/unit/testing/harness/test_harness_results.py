"""unit_results.json's git state: the commit a result was measured on, ``-dirty`` when the working
tree is not that commit (a change unstaged, staged or in a new untracked file), so a number from
an uncommitted experiment is never filed under a clean commit."""

from __future__ import annotations

import json
import os
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from posttrain.testing.harness import machine, results
from posttrain.testing.harness.results import git_commit


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository with one commit: a tracked file and a .gitignore for caches."""
    git(tmp_path, "init", "-q")
    (tmp_path / "train.py").write_text("lr = 1e-3\n")
    (tmp_path / ".gitignore").write_text("__pycache__/\n*.log\n")
    git(tmp_path, "add", "train.py", ".gitignore")
    git(tmp_path, "commit", "-q", "-m", "start")
    return tmp_path


def edit_unstaged(repo: Path) -> None:
    (repo / "train.py").write_text("lr = 1e-2\n")


def edit_staged(repo: Path) -> None:
    edit_unstaged(repo)
    git(repo, "add", "train.py")


def add_staged_file(repo: Path) -> None:
    (repo / "loss.py").write_text("scale = 2\n")
    git(repo, "add", "loss.py")


def add_untracked_file(repo: Path) -> None:
    (repo / "loss.py").write_text("scale = 2\n")


def delete_tracked_file(repo: Path) -> None:
    (repo / "train.py").unlink()


@pytest.mark.parametrize("change", [edit_unstaged, edit_staged, add_staged_file, add_untracked_file,
                                    delete_tracked_file])
def test_any_uncommitted_change_marks_the_commit_dirty(repo, change):
    head = git(repo, "rev-parse", "HEAD")
    assert git_commit(repo) == head  # clean: the bare hash
    change(repo)
    assert git_commit(repo) == f"{head}-dirty"


def test_ignored_files_leave_it_clean(repo):
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "train.cpython-312.pyc").write_bytes(b"\0")
    (repo / "run.log").write_text("step 1\n")
    assert git_commit(repo) == git(repo, "rev-parse", "HEAD")


def test_outside_a_repository_it_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"


def test_the_written_results_carry_the_state_of_the_tree_they_ran_in(pytester, monkeypatch, tmp_path):
    """End to end: a session in a clean checkout records the bare commit; after a new file that
    is not yet added (an experiment's new module), the next session records ``-dirty``."""
    out = tmp_path / "results"
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(out))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    pytester.makepyfile(test_inner="def test_ok():\n    pass\n")
    (pytester.path / ".gitignore").write_text("__pycache__/\n")
    git(pytester.path, "init", "-q")
    git(pytester.path, "add", "test_inner.py", ".gitignore")
    git(pytester.path, "commit", "-q", "-m", "start")
    head = git(pytester.path, "rev-parse", "HEAD")

    recorded = []
    for change in (None, add_untracked_file):
        if change:
            change(pytester.path)
        pytester.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider").assert_outcomes(passed=1)
        recorded.append(json.loads((out / "unit_results.json").read_text())["git_commit"])
    assert recorded == [head, f"{head}-dirty"]


# --- the document and where it goes ---

def test_the_document_holds_the_schemas_fields_with_the_start_in_utc_and_coverage_to_2_places(repo, monkeypatch):
    monkeypatch.setenv("TZ", "IST-5:30")  # a POSIX zone (no tzdata needed); it must not leak into start_time
    time.tzset()
    try:
        start = datetime(2026, 11, 21, 7, 40, 45, tzinfo=timezone(timedelta(hours=5, minutes=30)))
        doc = results.build(1, start, {"t.py::test": {"_elapsed": 0.5}}, 87.4567, repo)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert doc == {"exit_status": 1, "git_commit": git(repo, "rev-parse", "HEAD"), "start_time": "2026-11-21T02:10:45Z",
                   "metrics": {"t.py::test": {"_elapsed": 0.5}}, "gpu_types": machine.gpu_names(),
                   "cpu_model": machine.cpu_model(), "coverage": 87.46}
    assert results.build(0, start, {}, None, repo)["coverage"] == "n/a (run without --cov)"


def test_results_go_to_tests_unit_unless_the_environment_moves_them(tmp_path, monkeypatch):
    monkeypatch.delenv(results.RESULTS_DIR_ENV, raising=False)
    assert results.results_dir(tmp_path) == tmp_path / "tests" / "unit"
    monkeypatch.setenv(results.RESULTS_DIR_ENV, str(tmp_path / "elsewhere"))
    assert results.results_dir(tmp_path) == tmp_path / "elsewhere"


def test_the_results_and_their_archive_copy_are_sorted_indented_json(tmp_path):
    doc = {"start_time": "2026-11-21T02:10:45Z", "exit_status": 0, "metrics": {"b": {}, "a": {}}}
    latest, copy = results.write(doc, tmp_path)
    assert (latest, copy) == (tmp_path / "unit_results.json", tmp_path / "unit_results" / "20261121T021045Z.json")
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert latest.read_text() == text and copy.read_text() == text
    assert text.index('"exit_status"') < text.index('"metrics"') < text.index('"start_time"')
    again = results.write(doc, tmp_path)[1]  # a second session in the same second keeps the first's copy
    assert again == tmp_path / "unit_results" / f"20261121T021045Z-{os.getpid()}.json" and copy.read_text() == text
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(
        ["unit_results.json", "unit_results", "20261121T021045Z.json", again.name])  # no temporary file left
