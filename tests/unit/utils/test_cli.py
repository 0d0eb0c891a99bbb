"""The entry points' command line (posttrain/utils/cli.py): --help lists the config keys,
--print-config prints what a run would get, neither starts anything."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import yaml

from posttrain.algorithms.grpo import GRPOMasterConfig
from posttrain.utils import cli
from posttrain.utils.cli import config_keys, run_main
from posttrain.utils.interrupts import StopRequested

GRPO_YAML = str(Path(__file__).resolve().parents[3] / "examples" / "configs" / "grpo_arithmetic.yaml")


def never_train(cfg) -> None:
    raise AssertionError("the entry point trained")


def test_print_config_shows_the_yaml_file_and_the_overrides_and_trains_nothing(capsys) -> None:
    code = run_main("GRPO", GRPO_YAML, GRPOMasterConfig, never_train,
                    ["--print-config", "grpo.num_steps=7", "policy.lora.rank=4"])
    assert code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["grpo"]["num_steps"] == 7 and printed["policy"]["lora"]["rank"] == 4  # the overrides
    assert printed["grpo"]["num_prompts_per_step"] == 16  # the YAML file's value, not the schema default
    assert printed["policy"]["lora"]["alpha"] == 16.0  # a default neither sets


def test_print_config_of_a_bad_override_is_the_one_line_error(capsys) -> None:
    assert run_main("GRPO", GRPO_YAML, GRPOMasterConfig, never_train, ["--print-config", "grpo.num_stepz=7"]) == 2
    assert "unknown config key 'grpo.num_stepz'" in capsys.readouterr().err


def test_help_lists_every_config_key_with_its_type_default_and_description(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        run_main("GRPO", GRPO_YAML, GRPOMasterConfig, never_train, ["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "  policy.lora.rank: int = 0: adapter rank r; 0: no LoRA (full fine-tuning)" in out
    assert "  grpo.num_steps: int = " in out and "  cluster.gpus_per_worker: float = 0.0: GPUs per" in out
    assert len(config_keys(GRPOMasterConfig)) == sum(line.startswith("  ") and ": " in line
                                                     for line in out.split("config keys")[1].splitlines())


@pytest.mark.parametrize(("stop", "last_line"), [
    (StopRequested(signal.SIGINT, 3, "ckpt/step_3"), "stopped by SIGINT after step 3: checkpoint ckpt/step_3"),
    (KeyboardInterrupt(), "aborted: no checkpoint of the step in flight"),
], ids=["stop", "abort"])
def test_a_late_copy_of_the_signal_while_the_run_shuts_down_leaves_the_stop_clean(stop, last_line, monkeypatch, capsys,
                                                                                  tmp_path) -> None:
    """A launcher's copy of the interrupt can land while the run shuts Ray down: still exit 130 and the
    closing line, not a traceback (seen under ``uv run``, exit 1 with no closing line)."""
    def train(cfg) -> None:
        raise stop

    monkeypatch.setattr(cli, "_shutdown_ray", lambda: os.kill(os.getpid(), signal.SIGINT))
    try:
        code = run_main("GRPO", GRPO_YAML, GRPOMasterConfig, train, [f"logger.log_dir={tmp_path / 'log'}"])
    except KeyboardInterrupt:  # not out of the test: pytest would take it for the user's Ctrl-C
        pytest.fail("the signal during the shutdown escaped the entry point")
    assert code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == last_line
