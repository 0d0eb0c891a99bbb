"""A group of identical Ray actors placed on bundles of a :class:`RayVirtualCluster`."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.errors import PosttrainError, WorkerDiedError, WorkerStartError


def get_unwrapped(refs: list[Any]) -> list[Any]:
    """``ray.get(refs)``, re-raising a worker's :class:`PosttrainError` as itself: its one line
    reaches the user, not Ray's task traceback around it."""
    try:
        return ray.get(refs)
    except RayTaskError as exc:
        if isinstance(exc.cause, PosttrainError):
            raise exc.cause.with_traceback(None) from None
        raise


def creation_error_line(exc: RayActorError) -> str:
    """``Type: message`` of the exception a failed actor constructor raised.

    Ray hands the driver only the remote traceback as text (``exc.cause`` is None for a
    creation task), so this takes its last ``Name: ...`` line: the final exception of the chain.
    """
    lines = [line for line in str(exc).splitlines() if re.match(r"[A-Za-z_][\w.]*: \S", line)]
    return lines[-1] if lines else str(exc).strip().splitlines()[0]


T = TypeVar("T")
U = TypeVar("U")
NODE_DEATH_WAIT_S = 3.0  # how long a worker's death waits for the GCS to say whether its node is gone


def check_shards(shards: Sequence[Sequence[Any]], workers: int) -> None:
    """Every shard list holds one shard per worker.

    Raises:
        ValueError: a shard list's length differs from ``workers``.
    """
    for shard_list in shards:
        if len(shard_list) != workers:
            raise ValueError(f"{len(shard_list)} shards for {workers} workers")


@dataclass(frozen=True)
class Pending(Generic[T]):
    """Calls started on a group's workers and not yet waited for (a sender and its receivers
    must run at once): :meth:`wait` blocks for them and returns what ``finish`` makes of them.

    Attributes:
        gather: the group's ``gather`` (the results in rank order, errors as its own).
        refs: the started calls.
        method: their method's name, for errors.
        finish: the answers in rank order -> the value (e.g. rank 0's, or one receipt).
    """

    gather: Callable[[list[Any], str], list[Any]]
    refs: list[Any]
    method: str
    finish: Callable[[list[Any]], T]

    def wait(self) -> T:
        return self.finish(self.gather(self.refs, self.method))


PEER_DEATH_WAIT_S = 10.0  # how long a failed side of a collective waits to hear that its peer died


def wait_both(first: Pending[T], second: Pending[U], peer_death_wait_s: float = PEER_DEATH_WAIT_S) -> tuple[T, U]:
    """Both sides of a collective that run at once (a broadcast's receivers and its sender),
    ``first`` waited for first; their values.

    When a worker dies mid-collective, the live side fails first, and not with a death of its
    own: its peer's socket closed (a ``RayTaskError`` around gloo's error). The death is the
    cause a user needs, so when ``first`` fails that way, ``second``'s calls get up to
    ``peer_death_wait_s`` seconds to report one, and that death is raised instead.

    Raises:
        WorkerDiedError: a worker of either side died (one line naming it).
        Exception: ``first``'s or ``second``'s own error otherwise.
    """
    try:
        value = first.wait()
    except WorkerDiedError:
        raise
    except Exception:
        done, _ = ray.wait(second.refs, num_returns=len(second.refs), timeout=peer_death_wait_s)
        try:
            second.gather(done, second.method)
        except WorkerDiedError as death:
            raise death from None
        except Exception:  # the peer failed too, but did not die: first's error is the one to show
            pass
        raise
    return value, second.wait()


class RayActor:
    """One Ray actor outside the cluster's bundles (it reserves no CPU): a service the driver and
    its workers call, such as the rollout buffer. Each :meth:`call` waits for its answer; a
    :class:`PosttrainError` the actor raised is raised as itself (:func:`get_unwrapped`). The
    handle pickles: another actor that receives it calls the same actor.

    Args:
        actor_cls: the plain class, as written (one with ``async def`` methods becomes an asyncio
            actor: its calls interleave at each ``await`` on one event loop).
        args: its constructor's arguments.
        max_concurrency: calls a threaded actor serves at once (methods that wait on each other,
            such as a pause waiting for a sampling thread); None: Ray's default for the class.
        name: the name ``ray.get_actor`` finds it by.
    """

    def __init__(self, actor_cls: type, *args: Any, max_concurrency: int | None = None, name: str | None = None):
        options: dict[str, Any] = {"num_cpus": 0, "name": name}
        if max_concurrency is not None:
            options["max_concurrency"] = max_concurrency
        self.handle: Any = ray.remote(actor_cls).options(**options).remote(*args)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on the actor, waited for."""
        return get_unwrapped([getattr(self.handle, method).remote(*args, **kwargs)])[0]

    def kill(self) -> None:
        """End the actor's process (what it holds goes with it)."""
        ray.kill(self.handle)


def _node_id(_actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


def _shared_bundle_env(cluster: RayVirtualCluster, bundle_index: int) -> dict[str, Any]:
    """Actor options for a worker that reserves nothing on ``bundle_index``: the bundle's GPUs
    made visible to it (Ray does so only for workers that reserve GPUs)."""
    devices = cluster.visible_devices(bundle_index)
    return {} if devices is None else {"runtime_env": {"env_vars": {"CUDA_VISIBLE_DEVICES": devices}}}


class RayWorkerGroup:
    """One actor per bundle index; calls fan out to all workers and gather in order.

    Args:
        cluster: where to place the actors.
        actor_cls: a ``ray.remote`` class (the thin wrapper around an ``*Impl`` class).
        bundle_indices: which bundles of the cluster get a worker (default: all; an index may
            repeat when the workers do not reserve).
        reserve: each worker reserves its bundle's CPUs and GPUs (True), or nothing (False:
            it shares the bundle with the workers that do, e.g. a colocated engine with the
            policy, which never runs at the same time in the synchronous loop; it sees the
            bundle's GPUs, ``cluster.visible_devices``, as the reserving worker does).
        *args, **kwargs: constructor arguments, the same for every worker; the worker's
            rank in the group is passed as the keyword ``rank``.
    """

    def __init__(self, cluster: RayVirtualCluster, actor_cls: Any, *args: Any,
                 bundle_indices: Sequence[int] | None = None, reserve: bool = True, **kwargs: Any):
        indices = list(bundle_indices) if bundle_indices is not None else list(range(cluster.num_bundles))
        self.name = actor_cls.__ray_metadata__.class_name  # the class Ray wraps, e.g. "HfPolicyWorker"
        self._nodes: list[str] | None = None  # each worker's node, once asked (node_ids): names a lost node
        self.workers = [
            actor_cls.options(
                num_cpus=cluster.bundle["CPU"] if reserve else 0,
                num_gpus=cluster.bundle.get("GPU", 0) if reserve else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    cluster.placement_group, placement_group_bundle_index=i
                ),
                **({} if reserve else _shared_bundle_env(cluster, i)),
            ).remote(*args, rank=rank, **kwargs)
            for rank, i in enumerate(indices)
        ]

    def wait_ready(self, who: str) -> None:
        """Block until every worker's constructor has returned.

        Construction is asynchronous so that groups start in parallel; call this once all
        are created, so that a constructor error surfaces here, not at the first call.

        Raises:
            WorkerStartError: ``"<who> did not start: Type: message"``, one line; the
                group's workers are killed first.
        """
        try:
            ray.get([w.__ray_ready__.remote() for w in self.workers])
        except RayActorError as exc:
            self.shutdown()
            raise WorkerStartError(f"{who} did not start: {creation_error_line(exc)}") from None

    def __len__(self) -> int:
        return len(self.workers)

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every worker; results in rank order.

        Positional arguments go into the object store once and every worker reads that
        copy (a refit's state dict is not serialized once per worker); an argument that is an
        ``ObjectRef`` already is passed as it is, and Ray hands each worker its value.
        """
        return self.gather(self.submit_all(method, *args, **kwargs), method)

    def submit_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """:meth:`run_all` without waiting: the calls' object refs, in rank order, for
        :meth:`gather` (so that several groups can work at once, e.g. start their engines)."""
        refs = [self.share(a) for a in args]
        return [getattr(w, method).remote(*refs, **kwargs) for w in self.workers]

    def share(self, value: Any) -> Any:
        """``value`` as one object-store copy that every worker's call reads (an ``ObjectRef``
        as it is; with one worker, ``value`` itself: Ray serializes it once anyway)."""
        if len(self.workers) > 1 and not isinstance(value, ray.ObjectRef):
            return ray.put(value)
        return value

    def gather(self, refs: list[Any], method: str) -> list[Any]:
        """``ray.get(refs)``; a worker that died on the way is one line naming it.

        Raises:
            WorkerDiedError: ``"<Class> worker <rank> died during <method>: <reason>"``; once the
                workers' nodes are known (:meth:`node_ids`), ``"<Class> worker <rank> died during
                <method>: node <id8> (<ip>) left the Ray cluster: <reason>"`` when the worker's
                node is gone, else ``"... died during <method> on node <id8> (<ip>): <reason>"``.
            PosttrainError: a worker raised one (as itself, see :func:`get_unwrapped`).
        """
        try:
            return get_unwrapped(refs)
        except RayActorError as exc:
            dead = getattr(exc, "actor_id", None)
            ranks = [r for r, w in enumerate(self.workers) if dead is not None and w._actor_id.hex() == dead]
            who = f"{self.name} worker {ranks[0] if ranks else '?'}"
            text = str(exc).strip()
            reason = text.splitlines()[0] if text else type(exc).__name__
            where = self._where(ranks[0]) if ranks and self._nodes is not None else ""
            raise WorkerDiedError(f"{who} died during {method}{where}: {reason}") from None

    def _where(self, rank: int) -> str:
        """How a death message names worker ``rank``'s node: lost (no longer alive in the GCS) or not."""
        assert self._nodes is not None
        node = self._nodes[rank]
        # The GCS learns of a node whose raylet died within a few seconds; a worker's death can be
        # reported before that, so wait a little for its verdict.
        deadline = time.monotonic() + NODE_DEATH_WAIT_S
        while True:
            nodes = {n["NodeID"]: n for n in ray.nodes()}
            info = nodes.get(node, {})
            name = f"node {node[:8]} ({info.get('NodeManagerAddress', '?')})"
            if not info.get("Alive", False):
                return f": {name} left the Ray cluster"
            if time.monotonic() > deadline:
                return f" on {name}"
            time.sleep(0.5)

    def run_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        """Call ``method(shards[0][rank], shards[1][rank], ..., **kwargs)`` on worker ``rank``;
        results in rank order. Each positional argument holds one shard per worker.

        Raises:
            ValueError: a shard list's length differs from the number of workers.
        """
        return self.gather(self.submit_sharded(method, *shards, **kwargs), method)

    def submit_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        """:meth:`run_sharded` without waiting: the calls' object refs, for :meth:`gather`
        (e.g. the engines' side of a refit broadcast, whose sender runs at the same time).

        Raises:
            ValueError: a shard list's length differs from the number of workers.
        """
        check_shards(shards, len(self.workers))
        per_worker = zip(self.workers, *shards, strict=True)
        return [getattr(w, method).remote(*args, **kwargs) for w, *args in per_worker]

    def node_ids(self) -> list[str]:
        """The Ray node id each worker runs on, in rank order: asked of the actors themselves
        (``__ray_call__`` runs a function in the actor's process), not inferred from bundles; asked
        once (actors do not move), then known to :meth:`gather`'s death messages."""
        if self._nodes is None:
            self._nodes = self.gather([w.__ray_call__.remote(_node_id) for w in self.workers], "node_ids")
        return list(self._nodes)

    def shutdown(self) -> None:
        """Kill every worker (their reserved bundles stay with the cluster)."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
