""".github/ci_level.sh: which CI level a workflow run gets (docs/testing.md "CI levels")."""

import json
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / ".github" / "ci_level.sh"


def level(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    "labels, expected",
    [
        ([], "L0"),
        (["bug", "CI:L0"], "L0"),
        (["CI:L1"], "L1"),
        (["CI:L2", "docs"], "L2"),
        (["CI:L1", "CI:L2"], "L2"),  # the highest label wins
        (["CI:L10", "xCI:L1", "CI:L1x"], "L0"),  # only exact labels count
    ],
)
def test_pull_request_level_is_its_highest_label(labels, expected):
    result = level("pull_request", json.dumps(labels))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_push_to_main_runs_l1():
    assert level("push", "null").stdout.strip() == "L1"


def test_dispatch_runs_the_level_asked_for():
    assert level("workflow_dispatch", "null", "L2").stdout.strip() == "L2"
    bad = level("workflow_dispatch", "null", "L3")
    assert bad.returncode == 2
    assert "'L3'" in bad.stderr


def test_unknown_event_is_an_error_not_l0():
    result = level("schedule", "null")
    assert result.returncode == 2
    assert "'schedule'" in result.stderr
