"""tests/run_unit.sh end to end: each configuration runs exactly its tests of a fixture tree.

Each test runs ``bash tests/run_unit.sh`` in a subprocess on ``fixture_tree/case_markers.py``
(one trivial passing test per marker combination) and reads which tests passed / skipped
from pytest's ``-v`` lines. The GPU count is set through ``POSTTRAIN_NUM_GPUS``; a
configuration's package is made importable (or hidden) with a fake package on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
TREE = "tests/unit/testing/harness/fixture_tree/case_markers.py"
# The default configuration on a 1-GPU machine (POSTTRAIN_NUM_GPUS=1).
DEFAULT = {"test_plain": "PASSED", "test_gpu1": "PASSED", "test_gpu2": "SKIPPED",
           "test_param[1]": "PASSED", "test_param[2]": "PASSED"}


def run_unit(tmp_path: Path, *args: str, gpus: int = 0, fake: tuple[str, ...] = (), tree: bool = True
             ) -> subprocess.CompletedProcess:
    """Run run_unit.sh; ``fake`` lists dotted packages to create as empty packages on PYTHONPATH."""
    fake_root = tmp_path / "fake"
    for dotted in fake:
        pkg = fake_root.joinpath(*dotted.split("."))
        pkg.mkdir(parents=True, exist_ok=True)
        for parent in [pkg, *pkg.relative_to(fake_root).parents]:
            (fake_root / parent / "__init__.py").touch()
    env = {**os.environ, "POSTTRAIN_NUM_GPUS": str(gpus), "POSTTRAIN_UNIT_RESULTS_DIR": str(tmp_path / "results"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(fake_root)}
    tree_args = ["-o", "python_files=case_*.py", "-p", "no:cacheprovider", "-v", TREE] if tree else []
    return subprocess.run(["bash", "tests/run_unit.sh", *args, *tree_args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One default-configuration run on a pretend 1-GPU machine, shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("default")
    return run_unit(tmp, "-rs", gpus=1), tmp / "results"


def outcomes(proc: subprocess.CompletedProcess) -> dict[str, str]:
    """{test name: PASSED/SKIPPED/...} from pytest's -v lines."""
    return dict(re.findall(r"case_markers\.py::(\S+) (PASSED|SKIPPED|FAILED|ERROR)", proc.stdout))


def test_default_configuration(default_run):
    proc, _ = default_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc) == DEFAULT
    assert "needs 2 GPUs, found 1" in proc.stdout
    assert "slowest 10 durations" in proc.stdout


@pytest.mark.parametrize(("flags", "fake", "expected"), [
    (("--hf-gated",), (), {**DEFAULT, "test_hf_gated": "PASSED", "test_gpu2": "PASSED"}),
    (("--mcore-only",), ("megatron.core",), {"test_mcore": "PASSED"}),
    (("--mcore-only", "--hf-gated"), ("megatron.core",), {"test_mcore": "PASSED", "test_mcore_hf_gated": "PASSED"}),
    (("--vllm-only",), ("vllm",), {"test_vllm": "PASSED"}),
    (("--nightly-only",), (), {"test_nightly": "PASSED"}),
    (("--slow-only",), (), {"test_slow": "PASSED"}),
], ids=["hf-gated", "mcore-only", "mcore-only+hf-gated", "vllm-only", "nightly-only", "slow-only"])
def test_configuration_runs_exactly_its_tests(tmp_path, flags, fake, expected):
    proc = run_unit(tmp_path, *flags, fake=fake, gpus=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc) == expected


def test_deselected_tests_are_reported_with_the_flag_that_runs_them(default_run):
    proc, _ = default_run
    assert "1 deselected: marked mcore (run with --mcore-only)" in proc.stdout
    assert "1 deselected: marked hf_gated, mcore (run with --hf-gated --mcore-only)" in proc.stdout
    assert "1 deselected: marked nightly (run with --nightly-only)" in proc.stdout
    assert "1 deselected: marked slow (run with --slow-only)" in proc.stdout
    assert "6 deselected" in proc.stdout  # pytest's own count in the last line


def test_user_marker_replaces_the_configuration_filter(tmp_path):
    proc = run_unit(tmp_path, "-m", "mcore or nightly")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outcomes(proc) == {"test_mcore": "PASSED", "test_mcore_hf_gated": "PASSED", "test_nightly": "PASSED"}


def test_two_only_flags_are_a_usage_error(tmp_path):
    proc = run_unit(tmp_path, "--mcore-only", "--vllm-only", fake=("megatron.core", "vllm"))
    assert proc.returncode == 2
    assert "--mcore-only and --vllm-only cannot be combined" in proc.stderr
    assert "collected" not in proc.stdout  # pytest never started


def test_missing_extra_prints_the_uv_command(tmp_path):
    # A `megatron` package without `core` first on PYTHONPATH hides any installed megatron.core.
    proc = run_unit(tmp_path, "--mcore-only", "--hf-gated", fake=("megatron",), tree=False)
    assert proc.returncode == 2
    expected = "  uv run --extra mcore --group test bash tests/run_unit.sh --mcore-only --hf-gated"
    assert proc.stderr.splitlines()[-1] == expected


@pytest.mark.parametrize("args", [("-m", "mcore and vllm"), ("-k", "test_gpu2")],
                         ids=["none-selected", "all-skipped"])
def test_nothing_tested_exits_5(tmp_path, args):
    proc = run_unit(tmp_path, "-rs", *args)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "run_unit.sh: nothing was tested" in proc.stderr
    if args[0] == "-k":
        assert "needs 2 GPUs, found 0" in proc.stdout


def test_unit_results_written_where_redirected(default_run):
    proc, results_dir = default_run
    results = json.loads((results_dir / "unit_results.json").read_text())
    assert proc.returncode == results["exit_status"] == 0
    assert sorted(results["metrics"]) == sorted(f"{TREE}::{name}" for name, outcome in DEFAULT.items()
                                                 if outcome == "PASSED")
    assert all(m["_elapsed"] >= 0 for m in results["metrics"].values())
    assert results["coverage"] == "n/a (run without --cov)"
    assert len(list((results_dir / "unit_results").glob("*.json"))) == 1


def test_help_prints_the_configurations_and_runs_nothing(tmp_path):
    proc = run_unit(tmp_path, "--help", tree=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: uv run --group test bash tests/run_unit.sh")
    assert "--vllm-only" in proc.stdout and "Exit status" in proc.stdout
    assert "collected" not in proc.stdout  # pytest never started


@pytest.mark.parametrize(("flag", "message"), [("--vlm-only", "unknown flag --vlm-only; did you mean --vllm-only"),
                                               ("-Z", "pytest refused the arguments")])
@pytest.mark.slow(reason="run_unit.sh as a real process")
def test_unknown_flags_exit_2(tmp_path, flag, message):
    proc = run_unit(tmp_path, flag)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr


def test_bytecode_is_written_where_the_environment_forbids_it(tmp_path, monkeypatch):
    """The GPU image and CI machines set PYTHONDONTWRITEBYTECODE=1: then every process of the tier
    (xdist workers, Ray actors, pytester runs) compiled the same sources again; on 16 cores -n auto
    took 182 s with it and 115 s without (docs/testing.md, "Bytecode"). run_unit.sh drops it for its
    tests and everything they start."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    proc = run_unit(tmp_path, "-o", "python_files=case_*.py", "-p", "no:cacheprovider", "-v",
                    "tests/unit/testing/harness/fixture_tree/case_bytecode.py", tree=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "case_bytecode.py::test_bytecode_is_written PASSED" in proc.stdout
