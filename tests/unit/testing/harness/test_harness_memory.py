"""The memory readings behind ``tracker.get_max_mem()`` (posttrain.testing.harness.memory), read from
real processes: this test process plays a raylet whose children are titled as Ray titles its
workers and services, some started through a ``uv run`` wrapper, one with a command name that
holds parentheses and spaces. NVML is read for real where a GPU is; on a CPU machine a stand-in
``pynvml`` module gives the readings of two devices (the arithmetic and NVML's init/shutdown)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from posttrain.testing.harness import memory
from posttrain.testing.harness.memory import NodeReading

MIB = 2**20
# A process that prints its pid when ready, and sleeps until killed; ``HOLD`` MiB touched first.
SLEEPER = """
import os, sys, time
block = b"x" * ({hold} * 2**20)  # every page written: resident
print(os.getpid(), flush=True)
time.sleep(300)
"""
# Started as ``python run EXE ARGV0 ARGS...`` (or ``-c``): starts ARGS titled ARGV0 through EXE (without
# arguments: a bare worker), prints the child's pid, and waits. A file named ``run`` (or ``sync``) in the
# working directory makes the command line read ``uv run ...`` while the process is Python, as the
# tracker's uv test does.
STARTER = """
import subprocess, sys
BARE = [PYTHON, "ray::Bare.run", "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(300)"]
exe, *argv = sys.argv[1:] or BARE
child = subprocess.Popen(argv, executable=exe, stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
child.wait()
""".replace("PYTHON", repr(sys.executable))  # its own sys.executable is what argv[0] names: uv, under `uv run`
HELD_MIB = 256


@dataclass
class Tree:
    """The processes this test process (the 'raylet') started, by role."""

    workers: set[int]  # what ray_worker_pids must find: ray:: workers and their descendants
    others: set[int]  # what it must not: Ray's services, plain children, a `uv sync`'s worker
    held_worker: int  # the worker that holds HELD_MIB


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Iterator[Tree]:
    tmp = tmp_path_factory.mktemp("raylet")
    # /proc/PID/stat's command field (the executable's name): parentheses, spaces, a byte that is not UTF-8
    odd = os.fsdecode(os.path.join(os.fsencode(tmp), b"odd) 1 2 (\xe9"))
    os.symlink(sys.executable, odd)
    for name in ("run", "sync", " run"):
        (tmp / name).write_text(STARTER)
    (tmp / "idle").mkdir()
    (tmp / "idle" / "run").write_text(SLEEPER.format(hold=1))  # a `uv run` that has not started its worker
    procs: list[subprocess.Popen] = []

    def child(*argv: str | bytes, cwd: Path = tmp, stdin: str | None = None) -> int:
        """Start ``argv`` (argv[0] is only its title: Python runs it) and return the pid it prints."""
        proc = subprocess.Popen(argv, executable=sys.executable, cwd=cwd, stdout=subprocess.PIPE, text=True,
                                stdin=None if stdin is None else subprocess.PIPE, start_new_session=True)
        procs.append(proc)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        assert proc.stdout is not None
        return int(proc.stdout.readline())

    sleeper = SLEEPER.format(hold=1)
    try:
        held_worker = child("ray::Policy.train", "-c", SLEEPER.format(hold=HELD_MIB))
        # a worker's own child (an inference engine's process), whose command name is odd
        odd_child = child("ray::Engine.generate", "-c", STARTER, odd, "odd", "-c", sleeper)
        # a title that is not UTF-8 (a Latin-1 class name)
        latin1 = child(b"ray::Caf\xe9.run", "-c", sleeper)
        # Ray's uv integration: raylet -> `uv run ...` -> worker; `uv run` alone, and one with no worker yet
        behind_uv_run = child("uv", "run", sys.executable, "ray::Ref.get", "-c", sleeper)
        behind_bare_uv_run = child("uv", "run")
        idle_uv_run = child("uv", "run", cwd=tmp / "idle")
        # not workers: Ray's own services, a plain child, a ray:: child of something that is no `uv run`
        others = {child("ray::DashboardAgent", "-c", sleeper), child("ray::RuntimeEnvAgent", "-c", sleeper),
                  child("python", "-c", sleeper), child("uv", stdin=sleeper), idle_uv_run}
        behind_uv_sync = child("uv", "sync", sys.executable, "ray::Hidden.run", "-c", sleeper)
        behind_spaced = child("uv", " run", sys.executable, "ray::Spaced.run", "-c", sleeper)  # `uv  run`: no uv run
        yield Tree({held_worker, parent_of(odd_child), odd_child, latin1, behind_uv_run, behind_bare_uv_run},
                   others | {parent_of(behind_uv_run), parent_of(behind_bare_uv_run), behind_uv_sync,
                             parent_of(behind_uv_sync), behind_spaced, parent_of(behind_spaced)}, held_worker)
    finally:
        for proc in procs:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_the_workers_of_a_raylet_are_its_ray_children_their_descendants_and_those_behind_uv_run(tree):
    assert set(memory.ray_worker_pids(os.getpid())) == tree.workers
    assert not tree.others & set(memory.ray_worker_pids(os.getpid()))


# A Ray worker's reading of its node, printed as JSON: run with this checkout's posttrain first on the path
# (under mutmut, the mutated copy: its trampolines switch on in any process that imports it, and read
# mutmut's configuration from the working directory, the checkout's root).
READER = """
import dataclasses, json, os, sys
os.chdir(os.environ["POSTTRAIN_CHECKOUT"])
from posttrain.testing.harness import memory
print(json.dumps(dataclasses.asdict(memory._read_worker_node())), flush=True)
"""


def worker_reading(*argv: str, cwd: Path) -> NodeReading:
    checkout = str(Path(memory.__file__).parents[3])
    path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH", "")) if p)  # yours kept, after it
    env = {**os.environ, "PYTHONPATH": path, "POSTTRAIN_CHECKOUT": checkout}
    done = subprocess.run(argv, executable=sys.executable, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return NodeReading(**json.loads(done.stdout))


def test_a_worker_reads_its_node_through_its_raylet_or_the_uv_run_between_them(tree, tmp_path):
    """The reading task runs in a Ray worker: its parent is the raylet (this process), or the `uv run`
    that Ray's uv integration puts in between; either way it finds every worker of the node."""
    (tmp_path / "run").write_text(STARTER)
    (tmp_path / "reader.py").write_text(READER)
    # the reader keeps its interpreter's name (a ray:: title would lose the virtual environment): not counted
    direct = worker_reading(sys.executable, "-c", READER, cwd=tmp_path)
    through_uv = worker_reading("uv", "run", sys.executable, sys.executable, str(tmp_path / "reader.py"),
                                cwd=tmp_path)
    assert direct.num_workers == through_uv.num_workers == len(tree.workers)
    assert direct.workers_peak_rss_gib > HELD_MIB / 1024 and through_uv.workers_peak_rss_gib > HELD_MIB / 1024
    # mutmut maps a function to the tests that call it in their own process: this one, read from pytest,
    # whose parent is no raylet of this test's
    assert memory._read_worker_node().gpu_used_gib == memory.gpu_used_gib()


def test_a_process_without_children_has_no_workers(tree):
    assert memory.ray_worker_pids(tree.held_worker) == []


def test_peak_rss_is_the_kernels_high_water_mark_in_gib(tree):
    # getrusage's ru_maxrss (KiB) is the same high-water mark, read through another interface
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    assert memory.peak_rss_gib() == pytest.approx(own, rel=0.05)
    assert memory.peak_rss_gib(os.getpid()) == pytest.approx(own, rel=0.05)
    held = memory.peak_rss_gib(tree.held_worker)
    assert HELD_MIB / 1024 < held < (HELD_MIB + 64) / 1024  # the block and a bare interpreter


def test_a_process_that_is_gone_reads_0(tmp_path):
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: its /proc entry is gone
    assert memory.peak_rss_gib(proc.pid) == 0.0
    assert memory.ray_worker_pids(proc.pid) == []


def test_a_node_reading_sums_its_workers_peaks_and_counts_them(tree):
    reading = memory.read_this_node(os.getpid())
    assert reading.num_workers == len(tree.workers)
    # the held block once, and six interpreters of about 10 MiB each
    assert HELD_MIB / 1024 < reading.workers_peak_rss_gib < (HELD_MIB + 6 * 32) / 1024
    assert reading.gpu_used_gib == memory.gpu_used_gib()
    assert memory.read_this_node(None) == NodeReading(memory.gpu_used_gib(), 0.0, 0)


def test_without_ray_the_peak_is_this_process_alone(tree, monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # as if Ray was never imported
    if memory.gpu_used_gib():
        assert memory.max_mem_gib() == max(memory.gpu_used_gib())
    else:  # the workers this process started are not Ray's: not counted
        assert memory.max_mem_gib() == pytest.approx(memory.peak_rss_gib(), rel=0.05)


# get_max_mem() reports GPU memory wherever NVML sees a GPU; the CPU-path tests cannot apply there.
cpu_path_only = pytest.mark.skipif(bool(memory.gpu_used_gib()),
                                   reason="GPU node: get_max_mem() reports GPU memory, not the CPU peak RSS")


@cpu_path_only
def test_with_ray_a_workers_peak_adds_to_the_drivers_even_while_actors_hold_every_cpu(ray_cluster):
    """Each node is read by a zero-CPU task: an actor holding all the CPUs must not stall the reading."""
    import ray

    @ray.remote
    class Hog:
        def hold(self, mib: int) -> float:
            self.block = b"x" * (mib * MIB)
            return memory.peak_rss_gib()  # its own high-water mark, read inside the actor

    hog = Hog.options(num_cpus=ray.cluster_resources()["CPU"]).remote()
    try:
        hog_peak = ray.get(hog.hold.remote(HELD_MIB))
        driver_peak = memory.peak_rss_gib()
        readings: list[float] = []
        reader = threading.Thread(target=lambda: readings.append(memory.max_mem_gib()), daemon=True)
        reader.start()
        reader.join(timeout=60)
    finally:
        ray.kill(hog)
    assert readings, "max_mem_gib() waited for a CPU that the actor holds"
    assert hog_peak > HELD_MIB / 1024
    assert readings[0] >= driver_peak + hog_peak


# ---------------------------------------------------------------- NVML

class FakeNVML(types.ModuleType):
    """pynvml's calls that gpu_used_gib makes, for ``used`` bytes per device; records init/shutdown."""

    class NVMLError(Exception):
        pass

    def __init__(self, used: list[int], init_fails: bool = False):
        super().__init__("pynvml")
        self.used, self.init_fails, self.calls = used, init_fails, []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.used)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> types.SimpleNamespace:
        if handle >= len(self.used):
            raise self.NVMLError("Invalid Argument")
        return types.SimpleNamespace(used=self.used[handle], total=80 * 2**30)


def test_each_gpu_reads_its_used_memory_in_gib_and_nvml_is_shut_down(monkeypatch):
    nvml = FakeNVML([3 * 2**30, 2**29])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert memory.gpu_used_gib() == [3.0, 0.5]
    assert nvml.calls == ["init", "shutdown"]


def test_without_a_driver_or_pynvml_there_are_no_gpus(monkeypatch):
    nvml = FakeNVML([2**30], init_fails=True)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert memory.gpu_used_gib() == []
    assert nvml.calls == ["init"]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert memory.gpu_used_gib() == []


def test_a_gpu_node_reports_its_busiest_gpu_not_the_processes_rss(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([2**30, 5 * 2**30]))
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert memory.max_mem_gib() == 5.0


@pytest.mark.gpu(1)
def test_nvml_reads_what_torch_sees_in_use_on_each_gpu():
    """GPU machines: the real NVML, against CUDA's own count of the device's free memory."""
    torch = pytest.importorskip("torch")
    assert len(memory.gpu_used_gib()) == torch.cuda.device_count()
    free, total = torch.cuda.mem_get_info(0)  # CUDA's context first: both readings include it
    used = memory.gpu_used_gib()
    # NVML's used leaves out what the driver reserves (a few hundred MiB at most)
    assert abs((total - free) / 2**30 - used[0]) < 1.0, (used, free, total)
