"""SIGINT / SIGTERM stop a run at a step boundary with a checkpoint of the last finished step;
the entry point prints one line and exits 130 / 143 with Ray shut down; a second signal aborts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from learnable_reward import low_digit_reward

from posttrain.algorithms import grpo, grpo_step
from posttrain.utils.checkpoint import COMPLETE
from posttrain.utils.interrupts import StopRequested, graceful_stop

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")
BASE = ["grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4", "generation.max_new_tokens=3",
        "data.arithmetic.num_val=6", "grpo.val_period=0", "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8", "grpo.num_steps=6"]


def signal_during_train(signum: int, at_call: int, times: int = 1):
    """A transform on the policy's train results: sends ``signum`` to this process ``times``
    times while the ``at_call``-th train call is being answered (mid-step)."""
    seen = []

    def transform(call, result):
        seen.append(call)
        if len(seen) == at_call:
            for _ in range(times):
                os.kill(os.getpid(), signum)
        return result
    return transform


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_finishes_the_step_checkpoints_it_and_stops(in_process, tiny_model_path, tmp_path,
                                                                       monkeypatch, signum) -> None:
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)
    overrides = [f"model.path={tiny_model_path}", *BASE, f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=100"]
    with graceful_stop(), pytest.raises(StopRequested) as stop:
        in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): signal_during_train(signum, 2)})
    assert stop.value.signum == signum and stop.value.step == 2
    assert str(stop.value) == f"stopped by {signum.name} after step 2: checkpoint {tmp_path / 'ckpt' / 'step_2'}"
    assert (tmp_path / "ckpt" / "step_2" / COMPLETE).is_file()
    trained = [c for c in in_process.recorder.calls if (c.role, c.method) == ("policy", "train")]
    assert len(trained) == 2  # step 2 finished, no step 3
    # and the run continues from there
    resumed = in_process.run(grpo, GRPO_YAML, overrides)
    assert len(resumed.calls("policy", "train")) == 4


def test_without_periodic_checkpoints_the_stop_says_none_was_written(in_process, tiny_model_path, tmp_path) -> None:
    overrides = [f"model.path={tiny_model_path}", *BASE, f"logger.log_dir={tmp_path / 'log'}"]
    with graceful_stop(), pytest.raises(StopRequested, match="after step 1: no checkpoint"):
        in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): signal_during_train(signal.SIGINT, 1)})


def test_a_second_signal_aborts_at_once(in_process, tiny_model_path, tmp_path) -> None:
    overrides = [f"model.path={tiny_model_path}", *BASE, f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=100"]
    with graceful_stop(), pytest.raises(KeyboardInterrupt):
        in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): signal_during_train(signal.SIGINT, 1, 2)})
    assert not (tmp_path / "ckpt").exists()


def test_sigterm_to_the_entry_point_exits_143_in_one_line_with_a_checkpoint(tiny_model_path, tmp_path) -> None:
    """The real entry point on a real Ray cluster: SIGTERM after step 2 was printed."""
    cmd = [sys.executable, "examples/run_grpo.py", f"model.path={tiny_model_path}", *BASE, "grpo.num_steps=500",
           "logger.print_period=1", f"logger.log_dir={tmp_path / 'log'}", f"checkpoint.dir={tmp_path / 'ckpt'}",
           "checkpoint.save_period=1000", "generation.backend=hf", "cluster.num_cpus=2"]
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_ADDRESS": ""}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:
            if line.startswith("step 2/"):
                proc.send_signal(signal.SIGTERM)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM after step "), err
    step = int(last.split("after step ")[1].split(":")[0])
    assert step >= 2 and (tmp_path / "ckpt" / f"step_{step}" / COMPLETE).is_file()
    assert "Traceback" not in err


def test_a_signal_during_the_last_step_ends_the_run_normally(in_process, tiny_model_path, tmp_path) -> None:
    """The run is complete anyway: no StopRequested, and the final export is written."""
    overrides = [f"model.path={tiny_model_path}", *BASE, "grpo.num_steps=2", f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.save_path={tmp_path / 'final'}"]
    with graceful_stop():
        run = in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): signal_during_train(signal.SIGTERM, 2)})
    assert sorted(map(int, run.metrics["train/loss"])) == [1, 2]
    assert (tmp_path / "final" / "config.json").is_file()
