"""What the machine has: GPU count and names (``nvidia-smi -L``), CPU model (``/proc/cpuinfo``)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from collections.abc import Mapping

# run_unit.sh exports its `nvidia-smi -L` count here so pytest and the plan agree; tests of
# the harness set it to pretend a machine has GPUs.
NUM_GPUS_ENV = "POSTTRAIN_NUM_GPUS"
CI_ENV = "CI"  # GitHub Actions, GitLab, Buildkite, ... set CI=true on their runners


def on_ci(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is a CI run's (``$CI`` true, 1 or yes): the harness's checks turn strict there."""
    return environ.get(CI_ENV, "").strip().lower() in ("true", "1", "yes")


def _nvidia_smi_lines() -> list[str]:
    """Lines ``GPU i: NAME (UUID: ...)`` of ``nvidia-smi -L``; [] without the tool or a driver."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")]


def count_gpus() -> int:
    """GPUs on this machine: ``$POSTTRAIN_NUM_GPUS`` if set, else the lines of ``nvidia-smi -L``.

    Raises:
        ValueError: ``$POSTTRAIN_NUM_GPUS`` is not a non-negative integer (the value is named).
    """
    value = os.environ.get(NUM_GPUS_ENV, "").strip()
    if value:
        if not value.isdigit():
            raise ValueError(f"{NUM_GPUS_ENV}={value!r} is not a non-negative integer")
        return int(value)
    return len(_nvidia_smi_lines())


def gpu_names() -> list[str]:
    """Names of the local GPUs, one per device, e.g. ``["NVIDIA H100 80GB HBM3"]``; [] without GPUs."""
    return [re.sub(r"^GPU \d+: ", "", line).split(" (UUID")[0] for line in _nvidia_smi_lines()]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
