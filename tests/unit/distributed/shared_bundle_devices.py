"""Which GPU each worker of a bundle sees: the one that reserves the bundle and one that reserves
nothing (a colocated engine). Run by ``test_shared_bundle_devices.py`` in a Ray instance of its
own (``--fake``: two logical GPUs on a CPU machine; else the machine's GPUs). A blocker takes GPU 0
first, so the bundle lands on GPU 1, where a worker that sees every GPU would pick the wrong one.
Prints one JSON object: for bundles of 1 and 0.5 GPU, each worker's CUDA_VISIBLE_DEVICES and the
UUID of its ``cuda:0`` (None without CUDA)."""

from __future__ import annotations

import json
import os
import sys

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from posttrain.distributed.ray_cluster import RayVirtualCluster, init_ray
from posttrain.distributed.worker_group import RayWorkerGroup


@ray.remote
class Device:
    def __init__(self, fake: bool, rank: int):
        self.fake, self.rank = fake, rank

    def where(self) -> tuple[str | None, str | None]:
        uuid = None
        if not self.fake:
            import torch

            uuid = str(torch.cuda.get_device_properties(0).uuid)
        return os.environ.get("CUDA_VISIBLE_DEVICES"), uuid


def main() -> None:
    fake = "--fake" in sys.argv
    init_ray(address="local", num_cpus=2, num_gpus=2 if fake else None)
    blocker = placement_group([{"GPU": 1}])
    ray.get(blocker.ready())
    seen = {}
    for gpus in (1.0, 0.5):
        cluster = RayVirtualCluster(1, num_cpus=0.5, num_gpus=gpus)
        owner = RayWorkerGroup(cluster, Device, fake)
        guest = RayWorkerGroup(cluster, Device, fake, reserve=False)
        try:
            seen[str(gpus)] = {"owner": owner.run_all("where")[0], "guest": guest.run_all("where")[0]}
        finally:
            guest.shutdown()
            owner.shutdown()
            cluster.shutdown()
    remove_placement_group(blocker)
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
