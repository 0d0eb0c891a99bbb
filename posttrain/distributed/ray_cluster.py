"""Ray start-up and the virtual cluster: resources reserved up front in a placement group.

The driver (single controller) calls :func:`init_ray` once, reserves a
:class:`RayVirtualCluster`, and places worker groups on its bundles. Reserving everything
before any actor starts makes an over-sized request fail at once with a clear message,
instead of hanging while actors wait for resources that never free up.
"""

from __future__ import annotations

import logging
import os
import socket

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from posttrain.distributed.node_placement import alive_node_resources, check_placement
from posttrain.errors import ConfigError, RayStartError
from posttrain.utils.interrupts import rearm

# Under `uv run`, Ray would re-create each worker's environment through uv (slow, and it
# needs the network); the driver's interpreter and venv are already right for workers.
WORKER_ENV_VARS = {"RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", "TOKENIZERS_PARALLELISM": "false"}
# Ray's and vLLM's INFO lines (a start-up banner, "Reloading weights" and "reset prefix cache"
# at every refit: hundreds per run) bury the run's own output; warnings and errors still show.
# POSTTRAIN_VERBOSE=1 shows everything; a VLLM_LOGGING_LEVEL the user set wins.
VERBOSE_ENV = "POSTTRAIN_VERBOSE"
QUIET_ENV_VARS = {"VLLM_LOGGING_LEVEL": "WARNING"}


def verbose() -> bool:
    """Whether ``$POSTTRAIN_VERBOSE`` asks for Ray's and vLLM's INFO lines."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


# Ray gives a starting node a fixed 30 s to register (not configurable); on a busy machine
# its processes can miss that, and a second start (imports now in the page cache) usually
# makes it. How many starts to try: $POSTTRAIN_RAY_START_ATTEMPTS (default 5).
START_ATTEMPTS_ENV = "POSTTRAIN_RAY_START_ATTEMPTS"
DEFAULT_START_ATTEMPTS = 5
STARTUP_TIMEOUT = "timed out during startup"


def start_attempts() -> int:
    """``$POSTTRAIN_RAY_START_ATTEMPTS`` (default 5).

    Raises:
        ConfigError: it is not a positive integer.
    """
    raw = os.environ.get(START_ATTEMPTS_ENV, str(DEFAULT_START_ATTEMPTS))
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"{START_ATTEMPTS_ENV}={raw!r}: expected a positive integer")
    return int(raw)


def init_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join a running Ray cluster, or start a local one.

    A cluster is joined when ``address`` is given or ``RAY_ADDRESS`` is set; otherwise (or with
    ``address="local"``, which ignores ``RAY_ADDRESS``) a new local single-node cluster starts, never
    one that ``ray start`` left on the machine, with ``num_cpus`` (default: the machine's cores, at
    least 2, so a policy worker and a generation worker fit on a 1-core box too). A local
    start that times out (a busy machine) is retried, one line per retry, up to
    ``$POSTTRAIN_RAY_START_ATTEMPTS`` starts in all. Calling it again in the same process
    is a no-op. Every entry point (examples, functional scripts, the test fixtures) starts
    Ray here.

    Raises:
        ConnectionError: (from Ray) the given address has no cluster.
        RayStartError: the local node timed out on every attempt (one line with what to try).
        ConfigError: a bad ``$POSTTRAIN_RAY_START_ATTEMPTS``.
    """
    env_vars = {**WORKER_ENV_VARS, **({} if verbose() else QUIET_ENV_VARS)}
    for key, value in env_vars.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": {key: os.environ[key] for key in env_vars}}
    logging_level = logging.INFO if verbose() else logging.WARNING
    if address and address != "local":
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=True, logging_level=logging_level)
        rearm()
        return
    attempts = start_attempts()
    for attempt in range(1, attempts + 1):
        try:
            ray.init(
                address="local",  # without it Ray joins the cluster of the machine's last `ray start`
                num_cpus=num_cpus if num_cpus is not None else max(2, os.cpu_count() or 1),
                num_gpus=num_gpus,
                include_dashboard=False,
                runtime_env=runtime_env,
                log_to_driver=True,
                logging_level=logging_level,
            )
            break
        except Exception as exc:  # noqa: BLE001 -- Ray raises a bare Exception for this timeout
            if STARTUP_TIMEOUT not in str(exc):
                raise
            ray.shutdown()  # stops what did start, so the next attempt begins clean
            if attempt == attempts:
                raise RayStartError(
                    f"Ray's local node {STARTUP_TIMEOUT} on all {attempts} attempts (the machine is busy): run "
                    f"again when it is quieter, set {START_ATTEMPTS_ENV} higher, or start Ray yourself "
                    "(`ray start --head`) and pass cluster.address=auto") from None
            print(f"ray: the local node {STARTUP_TIMEOUT} (attempt {attempt} of {attempts}, a busy machine); "
                  "starting it again", flush=True)
    rearm()  # ray.init replaced the entry point's SIGINT / SIGTERM handlers


class RayVirtualCluster:
    """A placement group of identical bundles (each ``num_cpus`` CPUs, ``num_gpus`` GPUs).

    Args:
        num_bundles: how many bundles (one worker per bundle, typically).
        num_cpus, num_gpus: resources per bundle (fractions allowed).
        strategy: Ray's placement group strategy (``cluster.placement_strategy``): ``PACK`` keeps
            bundles on as few nodes as possible, ``SPREAD`` on as many, ``STRICT_PACK`` on one node,
            ``STRICT_SPREAD`` each on a node of its own.
        timeout_s: how long to wait for the reservation.

    Raises:
        ConfigError: the cluster cannot hold the request (names what was asked and what
            the cluster has), its nodes cannot satisfy ``strategy`` (``check_placement``), or the
            reservation timed out.
    """

    def __init__(self, num_bundles: int, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 strategy: str = "PACK", timeout_s: float = 60.0):
        if num_bundles < 1:
            raise ConfigError(f"a virtual cluster needs at least one bundle, got {num_bundles}")
        self.bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self.num_bundles = num_bundles
        self.strategy = strategy
        total = ray.cluster_resources()
        for resource, amount in self.bundle.items():
            if amount * num_bundles > total.get(resource, 0.0) + 1e-9:
                raise ConfigError(
                    f"virtual cluster needs {amount * num_bundles:g} {resource} "
                    f"({num_bundles} bundles x {amount:g}) but the Ray cluster has {total.get(resource, 0.0):g}"
                )
        # Before reserving: Ray would leave a group its nodes can never hold pending until the timeout.
        check_placement(strategy, self.bundle, num_bundles, alive_node_resources())
        self.placement_group: PlacementGroup = placement_group([dict(self.bundle)] * num_bundles, strategy=strategy)
        ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
        if not ready:
            remove_placement_group(self.placement_group)
            raise ConfigError(f"placement group {[self.bundle] * num_bundles} not ready after {timeout_s:g} s")
        # Each bundle's GPUs, as CUDA_VISIBLE_DEVICES names them: asked now, while nothing holds
        # them (a task reserving a bundle's GPUs waits for the actor that holds them).
        self.gpu_ids: list[str] | None = None
        if num_gpus:
            self.gpu_ids = ray.get([_gpu_ids.options(num_cpus=0, num_gpus=num_gpus, scheduling_strategy=self._on(i))
                                    .remote() for i in range(num_bundles)])

    def _on(self, bundle_index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=bundle_index)

    def visible_devices(self, bundle_index: int) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` for a worker on bundle ``bundle_index`` that reserves nothing
        (a colocated engine): the bundle's own GPUs, those its reserving worker sees. None for a
        bundle without GPUs. Ray sets the variable only for workers that reserve GPUs; one that
        reserves none would see every GPU of the node and take the first as ``cuda:0``, which is
        another GPU than the policy's wherever its bundle is not GPU 0."""
        return None if self.gpu_ids is None else self.gpu_ids[bundle_index]

    def shutdown(self) -> None:
        """Release the reservation (actors placed on it must be killed first)."""
        remove_placement_group(self.placement_group)

    def rendezvous_address(self, bundle_index: int = 0) -> str:
        """``tcp://<ip>:<port>`` on the node of bundle ``bundle_index``, with a port free there
        now: where the ranks of a ``torch.distributed`` group placed from that bundle meet."""
        return ray.get(_free_address.options(scheduling_strategy=self._on(bundle_index)).remote())


def free_port(host: str = "") -> int:
    """A TCP port free on ``host`` now ("": every interface), for a ``torch.distributed`` rendezvous."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@ray.remote(num_cpus=0)
def _free_address() -> str:
    return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"


@ray.remote(num_cpus=0)
def _gpu_ids() -> str:
    return ",".join(ray.get_runtime_context().get_accelerator_ids()["GPU"])
