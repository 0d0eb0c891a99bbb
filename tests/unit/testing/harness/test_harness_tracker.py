"""The tracker fixture: JSON-only values, per-parameter keys, real memory readings that grow."""

from __future__ import annotations

import math

import pytest

from posttrain.testing.harness import memory
from posttrain.testing.harness.tracker import Tracker

# get_max_mem() reports GPU memory wherever NVML sees a GPU; the CPU-path tests cannot apply there.
cpu_path_only = pytest.mark.skipif(bool(memory.gpu_used_gib()),
                                   reason="GPU node: get_max_mem() reports GPU memory, not the CPU peak RSS")


def test_track_rejects_values_json_cannot_hold():
    store: dict = {}
    tracker = Tracker("t.py::test", store)
    tracker.track("loss", 0.5)
    tracker.track("shape", [2, 3])
    for bad in (object(), {1, 2}, math.nan):
        with pytest.raises(TypeError, match=r"tracker.track\('bad', \.\.\.\): value .* is not JSON-serializable"):
            tracker.track("bad", bad)
    assert store == {"t.py::test": {"loss": 0.5, "shape": [2, 3]}}


def test_the_refusal_names_the_metric_the_value_its_type_and_what_json_said():
    tracker = Tracker("t.py::test", {})
    with pytest.raises(TypeError) as refused:
        tracker.track("ids", {1, 2})
    assert str(refused.value) == ("tracker.track('ids', ...): value {1, 2} of type set is not JSON-serializable "
                                  "(Object of type set is not JSON serializable)")
    with pytest.raises(TypeError) as refused:
        tracker.track("loss", math.inf)
    # JSON's own words for inf (Python 3.12 adds ": inf" to them)
    assert str(refused.value).startswith("tracker.track('loss', ...): value inf of type float is not "
                                         "JSON-serializable (Out of range float values are not JSON compliant")


def test_a_tracker_adds_to_what_the_session_holds_for_its_test_and_a_later_value_replaces_an_earlier():
    store = {"t.py::test": {"_elapsed": 1.5}, "t.py::other": {"loss": 1.0}}
    tracker = Tracker("t.py::test", store)
    tracker.track("loss", 0.5)
    tracker.track("loss", 0.25)
    assert tracker.key == "t.py::test"
    assert store == {"t.py::test": {"_elapsed": 1.5, "loss": 0.25}, "t.py::other": {"loss": 1.0}}


@cpu_path_only
def test_log_max_mem_records_the_reading_it_returns_under_its_name(monkeypatch):
    """Without Ray the reading is this process's peak RSS (the tracker fixture's tests below need the
    harness on; this one calls the tracker directly)."""
    import sys

    monkeypatch.delitem(sys.modules, "ray", raising=False)  # as if Ray was never imported in this session
    store: dict = {}
    tracker = Tracker("t.py::test", store)
    value = tracker.log_max_mem("peak")
    assert store == {"t.py::test": {"peak": value}}
    assert value == pytest.approx(memory.peak_rss_gib(), rel=0.05)
    assert tracker.get_max_mem() == pytest.approx(value, rel=0.05)


@pytest.mark.parametrize("variant", ["a", "b"])
def test_key_holds_the_parameter_id(tracker, request, variant):
    tracker.track("variant", variant)
    assert tracker.key == request.node.nodeid
    assert tracker.key.endswith(f"test_harness_tracker.py::test_key_holds_the_parameter_id[{variant}]")


@cpu_path_only
def test_max_mem_without_ray_is_this_process_peak_rss(tracker, monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ray", raising=False)  # as if Ray was never imported in this session
    value = tracker.log_max_mem("peak")
    assert value == pytest.approx(memory.peak_rss_gib(), rel=0.05)
    assert 0.01 < value < 64  # a Python process with pytest loaded: tens of MiB at least


# A wrapper whose command line reads `uv run`, and the worker it starts, titled as Ray titles its workers.
UV_RUN = '''
import subprocess, sys
WORKER = """
import os, time
print(os.getpid(), flush=True)
time.sleep(120)
"""
# titled as Ray titles its workers, through argv[0] (setproctitle is not everywhere);
# sys.executable would be uv, found on PATH from argv[0]
subprocess.run(["ray::Policy.train", "-c", WORKER], executable=sys.argv[1])
'''


def test_a_worker_that_ray_started_through_uv_run_is_counted(tmp_path):
    """Ray's uv integration (on by default when the driver runs under ``uv run``) starts each worker
    as raylet -> ``uv run ...`` -> worker: the reading must look through the wrapper, or every actor's
    memory goes missing from get_max_mem(). This process plays the raylet."""
    import os
    import signal
    import subprocess
    import sys

    (tmp_path / "run").write_text(UV_RUN)
    wrapper = subprocess.Popen(["uv", "run", sys.executable], executable=sys.executable, cwd=tmp_path,
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert wrapper.stdout is not None
        worker = int(wrapper.stdout.readline())
        assert worker in memory.ray_worker_pids(os.getpid())
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait()


@cpu_path_only
@pytest.mark.slow(reason="a Ray actor allocating 1 GiB, read by the cluster's memory probe")
def test_max_mem_grows_when_a_ray_actor_allocates_1_gib(ray_cluster, tracker):
    """CPU: the peak RSS of Ray workers counts, so a 1 GiB allocation inside an actor shows."""
    import numpy as np
    import ray

    @ray.remote(num_cpus=0.1)
    class Hog:
        def allocate(self, gib: float) -> int:
            self.block = np.ones(int(gib * 2**30) // 8)  # float64 ones: every page touched
            return self.block.nbytes

    before = tracker.get_max_mem()
    hog = Hog.remote()
    try:
        assert ray.get(hog.allocate.remote(1.0)) == 2**30
        after = tracker.log_max_mem("after_1gib_actor")
    finally:
        ray.kill(hog)
    # 0.9, not 1.0: the reading sums the live workers' peaks, and an idle worker that exits
    # between the two readings takes its tens of MiB out of the sum (seen: +0.945 GiB).
    assert after - before >= 0.9, (before, after)


@cpu_path_only
def test_max_mem_keeps_a_1_gib_spike_that_a_ray_actor_allocated_and_freed(ray_cluster, tracker):
    """The reading is the peak (VmHWM), not the memory in use now: an actor that allocates 1 GiB
    and frees it before the reading still shows it, since a freed spike is what runs a node out of
    memory. The actor's resident set is read back to prove the block really left it."""
    import numpy as np
    import ray

    @ray.remote(num_cpus=0.1)
    class Spike:
        def rss_gib(self) -> float:
            with open("/proc/self/status", encoding="utf-8") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 2**20

        def spike(self, gib: float) -> float:
            block = np.ones(int(gib * 2**30) // 8)  # float64 ones: every page touched
            del block  # a block this large is its own mapping: freeing it returns it to the OS
            return self.rss_gib()

    spike = Spike.remote()
    try:
        rss_before = ray.get(spike.rss_gib.remote())
        before = tracker.get_max_mem()
        rss_after = ray.get(spike.spike.remote(1.0))
        after = tracker.log_max_mem("after_1gib_spike_freed")
    finally:
        ray.kill(spike)
    assert rss_after - rss_before < 0.25, (rss_before, rss_after)  # freed: in use again as before
    # 0.9, not 1.0: an idle worker that exits between the readings takes its tens of MiB out of the sum
    assert after - before >= 0.9, (before, after)


@pytest.mark.gpu(1)
def test_max_mem_grows_when_1_gib_is_allocated_on_the_gpu(tracker):
    """GPU: NVML's used memory of the device grows by the allocation (with or without Ray)."""
    torch = pytest.importorskip("torch")
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the CUDA context is not part of the measured growth
    before = tracker.log_max_mem("gpu_before")
    block = torch.ones(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
    torch.cuda.synchronize()
    after = tracker.log_max_mem("gpu_after_1gib")
    print(f"tracker.get_max_mem(): {before:.3f} GiB before, {after:.3f} GiB after allocating 1 GiB")
    del block
    # 0.9, not 1.0: the reading sums the live workers' peaks, and an idle worker that exits
    # between the two readings takes its tens of MiB out of the sum (seen: +0.945 GiB).
    assert after - before >= 0.9, (before, after)


@pytest.mark.gpu(1)
def test_max_mem_grows_when_a_gpu_actor_allocates_1_gib(ray_cluster, tracker):
    """GPU through Ray: a 1-GPU actor's allocation shows in the reading of every GPU of every node."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0.1)
    class GpuHog:
        def warm_up(self) -> None:
            import torch

            torch.zeros(1, device="cuda")  # the CUDA context is not part of the measured growth

        def allocate(self) -> int:
            import torch

            self.block = torch.ones(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
            torch.cuda.synchronize()
            return self.block.numel() * 4

    hog = GpuHog.remote()
    try:
        ray.get(hog.warm_up.remote())
        before = tracker.log_max_mem("ray_gpu_before")
        assert ray.get(hog.allocate.remote()) == 2**30
        after = tracker.log_max_mem("ray_gpu_after_1gib")
    finally:
        ray.kill(hog)
    print(f"tracker.get_max_mem() via Ray: {before:.3f} GiB before, {after:.3f} GiB after a 1 GiB actor allocation")
    # 0.9, not 1.0: the reading sums the live workers' peaks, and an idle worker that exits
    # between the two readings takes its tens of MiB out of the sum (seen: +0.945 GiB).
    assert after - before >= 0.9, (before, after)
