"""What the machine has (posttrain.testing.harness.machine), read through a stand-in ``nvidia-smi``
on ``PATH``: the GPU count and names unit_results.json records, and the count gpu(n) skips by."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

from posttrain.testing.harness import machine

SMI = """#!/bin/sh
[ "$1" = "-L" ] || exit 2
echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
echo "GPU 11: NVIDIA A10 (UUID: GPU-2)"
echo "No devices were found"
"""


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A stand-in ``nvidia-smi`` first on PATH; returns a function that sets its script."""
    def install(script: str) -> None:
        tool = tmp_path / "nvidia-smi"
        tool.write_text(script)
        tool.chmod(0o755)

    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(machine.NUM_GPUS_ENV, raising=False)
    return install


def test_the_gpus_are_the_gpu_lines_of_nvidia_smi_and_their_names_lose_index_and_uuid(smi):
    smi(SMI)
    assert machine.count_gpus() == 2
    assert machine.gpu_names() == ["NVIDIA H100 80GB HBM3", "NVIDIA A10"]


def test_a_failing_nvidia_smi_is_no_gpu(smi):
    smi("#!/bin/sh\necho 'GPU 0: lost (UUID: x)' >&2\nexit 9\n")
    assert machine.count_gpus() == 0 and machine.gpu_names() == []


def test_without_nvidia_smi_there_is_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no nvidia-smi anywhere
    monkeypatch.delenv(machine.NUM_GPUS_ENV, raising=False)
    assert machine.count_gpus() == 0 and machine.gpu_names() == []


@pytest.mark.parametrize(("value", "count"), [("3", 3), (" 0 ", 0), ("", 2)])
def test_the_environment_overrides_the_count_and_an_empty_value_does_not(smi, monkeypatch, value, count):
    smi(SMI)
    monkeypatch.setenv(machine.NUM_GPUS_ENV, value)
    assert machine.count_gpus() == count


@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_a_gpu_count_that_is_not_a_non_negative_integer_is_refused_naming_it(monkeypatch, value):
    monkeypatch.setenv(machine.NUM_GPUS_ENV, value)
    with pytest.raises(ValueError, match=rf"^POSTTRAIN_NUM_GPUS='{value}' is not a non-negative integer$"):
        machine.count_gpus()


def test_the_cpu_model_is_procs_model_name():
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
             if line.startswith("model name")] if cpuinfo.exists() else []
    assert machine.cpu_model() == (names[0] if names else platform.processor() or platform.machine())


def test_without_proc_cpuinfo_the_cpu_model_is_what_platform_knows(monkeypatch):
    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/cpuinfo")  # a machine without /proc (macOS)

    monkeypatch.setattr(machine, "open", no_proc, raising=False)
    assert machine.cpu_model() == (platform.processor() or platform.machine())
