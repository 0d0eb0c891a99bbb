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


@cpu_path_only
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
