"""Outputs are checked before any work: a run that could not write its logs, checkpoints or
final model fails at once in one line, exit 2, before Ray starts - and a functional script
with a bad override exits 2 before it removes the previous run's results."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from posttrain import config as config_module
from posttrain.algorithms.grpo import GRPOMasterConfig
from posttrain.config import check_output_paths
from posttrain.errors import ConfigError
from posttrain.utils.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")


def cfg(**sections) -> GRPOMasterConfig:
    return GRPOMasterConfig.model_validate(sections)


@pytest.mark.parametrize("key", ["logger.log_dir", "checkpoint.dir", "checkpoint.save_path"])
def test_a_file_where_a_directory_must_go_is_refused(tmp_path, key) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"^{key} '{blocker}' is a file, not a directory$"):
        check_output_paths(cfg(**{section: {name: str(blocker)}}))
    with pytest.raises(ConfigError, match=f"^{key} '{blocker}/run' cannot be created: '{blocker}' is a file$"):
        check_output_paths(cfg(**{section: {name: str(blocker / "run")}}))


def test_a_directory_that_does_not_allow_writing_is_refused(tmp_path, monkeypatch) -> None:
    # root ignores permission bits, so the answer of os.access is what is varied here
    monkeypatch.setattr(config_module.os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(ConfigError, match=f"logger.log_dir '{tmp_path}/new/logs' is not writable"):
        check_output_paths(cfg(logger={"log_dir": str(tmp_path / "new" / "logs")}))


def test_writable_and_creatable_paths_pass(tmp_path) -> None:
    check_output_paths(cfg(logger={"log_dir": str(tmp_path / "a" / "b")}, checkpoint={
        "dir": str(tmp_path), "save_path": str(tmp_path / "final")}))
    assert os.listdir(tmp_path) == []  # checking creates nothing


def test_the_entry_point_refuses_before_any_work(tmp_path, capsys) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("")

    def train(_):
        raise AssertionError("training started")

    code = run_main("GRPO", GRPO_YAML, GRPOMasterConfig, train, [f"checkpoint.save_path={blocker}/model"])
    assert code == 2
    assert capsys.readouterr().err == f"error: checkpoint.save_path '{blocker}/model' cannot be created: " \
                                      f"'{blocker}' is a file\n"
    assert run_main("GRPO", GRPO_YAML, GRPOMasterConfig, train, ["--validate", "grpo.num_steps=3"]) == 0


@pytest.mark.slow(reason="a functional script as a real process")
def test_a_functional_script_with_a_bad_override_keeps_the_previous_results() -> None:
    work = ROOT / "tests" / "functional" / "sft"
    created = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    marker = work / "previous_run_marker.txt"
    marker.write_text("a passing run's results")
    try:
        result = subprocess.run(["bash", "tests/functional/sft.sh", "sft.num_stepz=3"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 2
        assert result.stderr.strip() == "error: unknown config key 'sft.num_stepz'"
        assert marker.read_text() == "a passing run's results"
    finally:
        marker.unlink(missing_ok=True)
        if created:
            work.rmdir()
