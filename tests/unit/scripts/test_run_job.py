"""``run_job`` (tests/functional/common.sh) passes a Ctrl-C or a SIGTERM on to its job and exits with
the job's status once the job has stopped: a signal to the script never leaves the job running alone.

The script is real bash sourcing common.sh; its job is a stand-in for an entry point that stops on
a signal as ``posttrain.utils.interrupts`` makes the real ones stop: at the end of the step in
flight (0.3 s here), with one line, exit 128 + the signal's number. (A job that exits the instant
a Ctrl-C reaches it and bash together can lose its status: bash 5.2's ``wait``, interrupted by the
trapped SIGINT, then reports -1 and the script exits 255, in 9 of 30 tries.) The same through
``uv run`` with a real GRPO job: tests/integration/test_interrupts.py."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

JOB = """\
import signal, sys, time

requested = []
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda signum, frame: requested.append(signum))
print("job ready", flush=True)
deadline = time.monotonic() + 60  # a job nobody stopped ends by itself; the test kills it before
while not requested and time.monotonic() < deadline:
    time.sleep(0.01)  # a step
time.sleep(0.3)  # the step in flight finishes (a copy of the signal meanwhile is the same request)
name = signal.Signals(requested[0]).name if requested else "nothing"
print(f"stopped by {name}", file=sys.stderr, flush=True)
sys.exit(128 + requested[0] if requested else 0)
"""


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: /proc; elsewhere assumed)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def ctrl_c(proc: subprocess.Popen) -> None:
    """A terminal's Ctrl-C: SIGINT to every process of the script's group."""
    os.killpg(proc.pid, signal.SIGINT)


def sigterm_to_the_script(proc: subprocess.Popen) -> None:
    """``kill PID`` of the script alone (a scheduler's stop, a CI step's timeout, ``uv run`` passing it on)."""
    proc.send_signal(signal.SIGTERM)


@pytest.mark.parametrize(("send", "signum"), [(ctrl_c, signal.SIGINT), (sigterm_to_the_script, signal.SIGTERM)],
                         ids=["ctrl_c", "sigterm_to_the_script"])
def test_a_signal_to_the_script_stops_its_job_and_the_script_exits_with_the_jobs_status(tmp_path, send, signum):
    (tmp_path / "job.py").write_text(JOB)
    script = tmp_path / "script.sh"
    script.write_text(f"source {shlex.quote(str(ROOT / 'tests' / 'functional' / 'common.sh'))}\n"
                      f"WORK={shlex.quote(str(tmp_path))}\nrun_job {shlex.quote(str(tmp_path / 'job.py'))}\n"
                      "echo 'the script went on after its job'\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # a group of its own, as a terminal starts a job: a Ctrl-C reaches the script and its job, nothing else
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "job ready\n"
        # run_job sets its traps as it starts the job: on a busy machine, wait until they are set
        deadline = time.monotonic() + 2.0
        while not catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.01)
        send(proc)
        status = proc.wait(timeout=30)
        try:
            os.killpg(proc.pid, 0)
            left_behind = True
        except ProcessLookupError:
            left_behind = False
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    assert not left_behind, "the job outlived the script"
    assert status == 128 + signum, err
    assert err.strip().splitlines()[-1] == f"stopped by {signum.name}", err
    assert "the script went on" not in out
