"""The harness is a pytest plugin that installing posttrain registers, and it stays inert
until a project's ini turns it on: another project's suite must not change under it."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

INNER = '''
import pytest

@pytest.mark.gpu(8)
def test_needs_eight_gpus():
    pass

def test_tracks(tracker):
    tracker.track("answer", 42)
'''


def test_the_plugin_is_registered_through_the_pytest11_entry_point():
    (ep,) = [ep for ep in entry_points(group="pytest11") if ep.name == "posttrain"]
    assert ep.value == "posttrain.testing.harness.plugin"


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_UNIT_RESULTS_DIR", str(pytester.path / "results"))
    monkeypatch.setenv("POSTTRAIN_NUM_GPUS", "0")
    pytester.makepyfile(test_inner=INNER)
    return pytester


def test_switched_on_the_harness_skips_gpu_tests_and_writes_results(inner):
    result = inner.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs 8 GPUs, found 0*"])
    assert (inner.path / "results" / "unit_results.json").is_file()


def test_switched_off_it_adds_nothing_to_another_projects_run(inner):
    result = inner.runpytest_inprocess("-p", "no:cacheprovider", "--fail-on-nothing-ran")
    # The gpu test runs (no skip, no marker check), tracker is a usage error naming the switch,
    # and no results file appears.
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*the tracker fixture needs posttrain's harness: set posttrain_harness = true*"])
    assert not (inner.path / "results").exists()


def test_without_the_entry_point_tests_conftest_loads_the_harness(tmp_path):
    """Where pytest loads no entry points (a checkout on PYTHONPATH only), tests/conftest.py
    registers the harness itself: gpu(n) still skips, and --fail-on-nothing-ran still exists."""
    repo = Path(__file__).resolve().parents[4]
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "POSTTRAIN_NUM_GPUS": "0",
           "POSTTRAIN_UNIT_RESULTS_DIR": str(tmp_path)}
    tree = "tests/unit/testing/harness/fixture_tree/case_markers.py"
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "python_files=case_*.py", "-p", "no:cacheprovider",
                          "-rs", "--fail-on-nothing-ran", "-k", "gpu2", tree], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 5, out.stdout + out.stderr  # the only selected test skipped: nothing ran
    assert "needs 2 GPUs, found 0" in out.stdout
