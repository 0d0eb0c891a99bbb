"""Ray start-up and the virtual cluster: resources reserved up front in a placement group.

The driver (single controller) calls :func:`init_ray` once, reserves a
:class:`RayVirtualCluster`, and places worker groups on its bundles. Reserving everything
before any actor starts makes an over-sized request fail at once with a clear message,
instead of hanging while actors wait for resources that never free up.
"""

from __future__ import annotations

import os
import socket

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from posttrain.errors import ConfigError
from posttrain.utils.interrupts import rearm

# Under `uv run`, Ray would re-create each worker's environment through uv (slow, and it
# needs the network); the driver's interpreter and venv are already right for workers.
WORKER_ENV_VARS = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "TOKENIZERS_PARALLELISM": "false"}


def init_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join a running Ray cluster, or start a local one.

    A cluster is joined when ``address`` is given or ``RAY_ADDRESS`` is set; otherwise a
    local single-node cluster starts with ``num_cpus`` (default: the machine's cores, at
    least 2, so a policy worker and a generation worker fit on a 1-core box too).
    Calling it again in the same process is a no-op.

    Raises:
        ConnectionError: (from Ray) the given address has no cluster.
    """
    for key, value in WORKER_ENV_VARS.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": dict(WORKER_ENV_VARS)}
    if address:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True)
        rearm()
        return
    ray.init(
        num_cpus=num_cpus if num_cpus is not None else max(2, os.cpu_count() or 1),
        num_gpus=num_gpus,
        include_dashboard=False,
        runtime_env=runtime_env,
        log_to_driver=True,
    )
    rearm()  # ray.init replaced the entry point's SIGINT / SIGTERM handlers


class RayVirtualCluster:
    """A placement group of identical bundles (each ``num_cpus`` CPUs, ``num_gpus`` GPUs).

    Args:
        num_bundles: how many bundles (one worker per bundle, typically).
        num_cpus, num_gpus: resources per bundle (fractions allowed).
        strategy: Ray placement strategy (``PACK`` keeps bundles on as few nodes as possible).
        timeout_s: how long to wait for the reservation.

    Raises:
        ConfigError: the cluster cannot hold the request (names what was asked and what
            the cluster has) or the reservation timed out.
    """

    def __init__(self, num_bundles: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 strategy: str = "PACK", timeout_s: float = 60.0):
        if num_bundles < 1:
            raise ConfigError(f"a virtual cluster needs at least one bundle, got {num_bundles}")
        self.bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self.num_bundles = num_bundles
        total = ray.cluster_resources()
        for resource, amount in self.bundle.items():
            if amount * num_bundles > total.get(resource, 0.0) + 1e-9:
                raise ConfigError(
                    f"virtual cluster needs {amount * num_bundles:g} {resource} "
                    f"({num_bundles} bundles x {amount:g}) but the Ray cluster has {total.get(resource, 0.0):g}"
                )
        self.placement_group: PlacementGroup = placement_group([dict(self.bundle)] * num_bundles, strategy=strategy)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.placement_group)
            raise ConfigError(f"placement group {[self.bundle] * num_bundles} not ready after {timeout_s:g} s")

    def shutdown(self) -> None:
        """Release the reservation (actors placed on it must be killed first)."""
        remove_placement_group(self.placement_group)

    def rendezvous_address(self, bundle_index: int = 0) -> str:
        """``tcp://<ip>:<port>`` on the node of bundle ``bundle_index``, with a port free there
        now: where the ranks of a ``torch.distributed`` group placed from that bundle meet."""
        strategy = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=bundle_index)
        return ray.get(_free_address.options(scheduling_strategy=strategy).remote())


@ray.remote(num_cpus=0)
def _free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return f"tcp://{ray.util.get_node_ip_address()}:{port}"
