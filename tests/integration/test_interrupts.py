"""SIGINT / SIGTERM stop a run at a step boundary with a checkpoint of the last finished step;
the entry point prints one line and exits 130 / 143 with Ray shut down; a second signal aborts.

The same holds through the launchers users start a run with: ``uv run`` (which passes a signal on
to the run, so a Ctrl-C of the process group arrives twice) and the functional scripts' ``run_job``
(which passes INT and TERM on to their job), with a Ctrl-C to the process group and a SIGTERM to
the launcher alone."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from learnable_reward import low_digit_reward

from posttrain.algorithms import grpo, grpo_step
from posttrain.utils.checkpoint import COMPLETE
from posttrain.utils.interrupts import SAME_INTERRUPT_S, StopRequested, graceful_stop

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = str(ROOT / "examples" / "configs" / "grpo_arithmetic.yaml")
BASE = ["grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=4", "generation.max_new_tokens=3",
        "data.arithmetic.num_val=6", "grpo.val_period=0", "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=8", "grpo.num_steps=6"]


def signal_during_train(signum: int, at_call: int, times: int = 1, gap_s: float = 0.0):
    """A transform on the policy's train results: sends ``signum`` to this process ``times``
    times, ``gap_s`` apart, while the ``at_call``-th train call is being answered (mid-step)."""
    seen = []

    def transform(call, result):
        seen.append(call)
        if len(seen) == at_call:
            for i in range(times):
                if i:
                    time.sleep(gap_s)
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
    """A second Ctrl-C, pressed past the window in which a launcher's copy of the first arrives."""
    overrides = [f"model.path={tiny_model_path}", *BASE, f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=100"]
    second = signal_during_train(signal.SIGINT, 1, times=2, gap_s=SAME_INTERRUPT_S + 0.05)
    with graceful_stop(), pytest.raises(KeyboardInterrupt):
        in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): second})
    assert not (tmp_path / "ckpt").exists()


def test_a_launchers_copy_of_the_signal_does_not_abort(in_process, tiny_model_path, tmp_path) -> None:
    """Two SIGINTs at once (the group's and the launcher's): the step finishes, with its checkpoint."""
    overrides = [f"model.path={tiny_model_path}", *BASE, f"logger.log_dir={tmp_path / 'log'}",
                 f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.save_period=100"]
    try:
        with graceful_stop(), pytest.raises(StopRequested, match="after step 1: checkpoint"):
            in_process.run(grpo, GRPO_YAML, overrides, {("policy", "train"): signal_during_train(signal.SIGINT, 1, 2)})
    except KeyboardInterrupt:  # not out of the test: pytest would take it for the user's Ctrl-C
        pytest.fail("the launcher's copy of the SIGINT aborted the run")
    assert (tmp_path / "ckpt" / "step_1" / COMPLETE).is_file()


@pytest.mark.slow(reason="a real GRPO job, stopped by a signal")
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


def test_a_copy_of_the_signal_within_the_window_is_the_same_request_and_a_later_one_aborts(monkeypatch) -> None:
    """A launcher's copy of the interrupt (``uv run`` forwards a SIGINT 0.2 s later) does not abort;
    the same signal a window later, or another signal, does."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    with graceful_stop():
        os.kill(os.getpid(), signal.SIGINT)
        clock[0] += 0.2
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the copy: the same request
        except KeyboardInterrupt:
            pytest.fail("the copy of the SIGINT aborted")
        clock[0] += SAME_INTERRUPT_S
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    with graceful_stop():
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):  # another signal is not a copy
            os.kill(os.getpid(), signal.SIGINT)


def _grpo_args(tiny_model_path: str, tmp_path: Path) -> list[str]:
    return ["examples/run_grpo.py", f"model.path={tiny_model_path}", *BASE, "grpo.num_steps=500",
            "logger.print_period=1", f"logger.log_dir={tmp_path / 'log'}", f"checkpoint.dir={tmp_path / 'ckpt'}",
            "checkpoint.save_period=1000", "generation.backend=hf", "cluster.num_cpus=2"]


def _stop_through(launcher: list[str], send, tmp_path: Path) -> tuple[int | None, str, bool]:
    """Start ``launcher`` in a process group of its own (as a terminal starts a job), call
    ``send(process)`` once step 2 is printed; return the launcher's exit status (None: still
    running after 120 s), its stderr, and whether a process of the group outlived it (then killed)."""
    # uv runs the job in this test's own environment, also from a copy of the repository (the mutation
    # runner's), which has no .venv of its own
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1",
           "UV_PROJECT_ENVIRONMENT": sys.prefix}
    proc = subprocess.Popen(launcher, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    status = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("step 2/"):
                send(proc)
                break
        status = proc.wait(timeout=120)
        time.sleep(1)  # a job the launcher left behind is still running a second later
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, 0)
        left_behind = True
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        left_behind = False
    _, err = proc.communicate()
    return status, err, left_behind


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH (the README's commands run under uv)")
    return uv


def ctrl_c(proc: subprocess.Popen) -> None:
    """A terminal's Ctrl-C: SIGINT to every process of the job's group."""
    os.killpg(proc.pid, signal.SIGINT)


def sigterm_to_the_launcher(proc: subprocess.Popen) -> None:
    """``kill PID`` of the launcher alone (a scheduler's stop, a CI step's timeout)."""
    proc.send_signal(signal.SIGTERM)


def assert_stopped_cleanly(stopped: tuple[int | None, str, bool], signum: signal.Signals, tmp_path: Path) -> None:
    status, err, left_behind = stopped
    assert not left_behind, "a process of the run outlived its launcher"
    assert status == 128 + signum, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"stopped by {signum.name} after step "), err
    step = int(last.split("after step ")[1].split(":")[0])
    assert step >= 2 and (tmp_path / "ckpt" / f"step_{step}" / COMPLETE).is_file()
    assert "Traceback" not in err and "aborted" not in err


@pytest.mark.slow(reason="a real GRPO job under uv run, stopped by a signal")
def test_ctrl_c_under_uv_run_stops_with_the_closing_line_a_checkpoint_and_exit_130(tiny_model_path, tmp_path):
    """As the README starts a run: ``uv run python examples/run_grpo.py``. The run gets the group's
    SIGINT and uv's copy of it 0.2 s later (uv passes a SIGINT on when stdin is not a terminal)."""
    stopped = _stop_through([_uv(), "run", "--no-sync", "python", *_grpo_args(tiny_model_path, tmp_path)],
                            ctrl_c, tmp_path)
    assert_stopped_cleanly(stopped, signal.SIGINT, tmp_path)


@pytest.mark.parametrize(("send", "signum"), [(ctrl_c, signal.SIGINT), (sigterm_to_the_launcher, signal.SIGTERM)],
                         ids=["ctrl_c", "sigterm_to_uv"])
@pytest.mark.slow(reason="a real GRPO job under a functional script and uv run, stopped by a signal")
def test_a_functional_scripts_job_under_uv_run_stops_cleanly_and_the_script_exits_with_it(
        tiny_model_path, tmp_path, send, signum):
    """``uv run bash SCRIPT`` whose job runs through common.sh's run_job: a Ctrl-C reaches the job
    (directly, and through run_job's trap), a SIGTERM to uv reaches it through uv and the trap; the
    job stops at a step boundary and the script and uv exit with its status. No job is left behind."""
    script = tmp_path / "job.sh"
    args = shlex.join(_grpo_args(tiny_model_path, tmp_path))
    script.write_text(f"source {shlex.quote(str(ROOT / 'tests' / 'functional' / 'common.sh'))}\n"
                      f"WORK={shlex.quote(str(tmp_path))}\ncd {shlex.quote(str(ROOT))}\n"
                      f"run_job {args}\necho 'the script went on after its job'\n")
    stopped = _stop_through([_uv(), "run", "--no-sync", "bash", str(script)], send, tmp_path)
    assert_stopped_cleanly(stopped, signum, tmp_path)
