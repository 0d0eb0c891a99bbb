"""A worker that shares a bundle without reserving it (a colocated engine) runs on the bundle's
GPU, the one the reserving worker (the policy) runs on: Ray names GPUs only to workers that
reserve them (Ray 2.60 leaves the variable unset for a worker that reserves none), so without
``RayVirtualCluster.visible_devices`` such a worker sees every GPU and takes GPU 0 whatever the
bundle holds (seen with logical GPUs: the guest got no ``CUDA_VISIBLE_DEVICES`` while the owner
got "1"). Each check of the GPUs Ray assigns runs ``shared_bundle_devices.py`` in a Ray instance of its
own: with two logical GPUs on any machine, and with the real ones where two are present (passed on
2 x H200). The first test, on the session's cluster, takes the bundle's GPUs as the cluster was told
them and checks what reaches the worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import RayWorkerGroup

SCRIPT = Path(__file__).with_name("shared_bundle_devices.py")


def devices_seen(*flags: str) -> dict:
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    out = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=240,
                         env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@ray.remote
class Visible:
    def __init__(self, rank: int):
        self.rank = rank

    def devices(self) -> str | None:
        return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_worker_that_reserves_nothing_is_given_its_bundles_gpus(ray_cluster) -> None:
    """The session's cluster has no GPU: the bundle's GPU ids are set as ``RayVirtualCluster`` reads
    them from Ray on a machine with GPUs, where the bundle got GPU 1 (the case GPU 0 would be wrong)."""
    cluster = RayVirtualCluster(1, num_cpus=0.5)
    cluster.gpu_ids = ["1"]
    guest = RayWorkerGroup(cluster, Visible, reserve=False)
    try:
        assert guest.run_all("devices") == ["1"]
    finally:
        guest.shutdown()
        cluster.shutdown()


@pytest.mark.slow(reason="real worker actors in Ray placement-group bundles")
def test_a_worker_that_reserves_nothing_sees_its_bundles_gpu_logical_gpus() -> None:
    seen = devices_seen("--fake")
    for gpus in ("1.0", "0.5"):
        assert seen[gpus]["owner"][0] == "1", seen  # the blocker holds GPU 0
        assert seen[gpus]["guest"] == seen[gpus]["owner"], (gpus, seen)


@pytest.mark.gpu(2)
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason=f"needs 2 GPUs, found {torch.cuda.device_count()}")
def test_a_worker_that_reserves_nothing_runs_on_its_bundles_gpu() -> None:
    seen = devices_seen()
    for gpus in ("1.0", "0.5"):
        owner, guest = seen[gpus]["owner"], seen[gpus]["guest"]
        assert owner[1] is not None and guest[1] == owner[1], (gpus, seen)  # the same device, by UUID
