"""Where the workers run: Ray actors (the default) or this process.

A run's start-up asks the current transport for three things: to start (Ray's node), a
cluster (the reservation of bundles), and worker groups placed on it; asynchronous GRPO also
asks it for service actors that hold no bundle (the rollout buffer and producer). :class:`RayTransport` is
Ray. :class:`InProcessTransport` constructs the same worker classes in this process and calls
them directly, copying arguments and results through pickle as Ray's serialization would, so
a worker cannot reach into the driver's objects; tests run the real loops with it in about a
second and record every worker call (``tests/integration/in_process.py``). The transport is
chosen at set-up, never patched in::

    with use_transport(InProcessTransport()):
        grpo.train(cfg)

A worker that hands the driver a reference to a large value (the refit's weights) asks the
transport of its own process (:func:`object_store_put`): inside a Ray actor that is Ray's
object store, in-process the value itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import pickle
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch

from posttrain.distributed.node_placement import IN_PROCESS_NODE, node_addresses
from posttrain.distributed.ray_cluster import RayVirtualCluster, init_ray
from posttrain.distributed.worker_group import RayActor, RayWorkerGroup, check_shards


class WorkerGroup(Protocol):
    """What the driver classes (``Policy``, ``EngineGroup``) call on a group of workers."""

    name: str
    workers: list[Any]  # the actor handles (Ray) or the worker objects (in-process), in rank order

    def wait_ready(self, who: str) -> None: ...

    def __len__(self) -> int: ...

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def submit_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def gather(self, refs: list[Any], method: str) -> list[Any]: ...

    def share(self, value: Any) -> Any: ...

    def run_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]: ...

    def submit_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]: ...

    def node_ids(self) -> list[str]:
        """The node each worker runs on (Ray's node id), in rank order."""
        ...

    def shutdown(self) -> None: ...


class Cluster(Protocol):
    """A reservation of ``num_bundles`` identical bundles (``bundle``: resources of each)."""

    num_bundles: int
    bundle: dict[str, float]
    strategy: str  # the placement group strategy (cluster.placement_strategy)

    def rendezvous_address(self, bundle_index: int = 0) -> str: ...

    def shutdown(self) -> None: ...


class Actor(Protocol):
    """One service actor outside the cluster's bundles (the rollout buffer, the async producer)."""

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` on the actor, waited for; its PosttrainError raised as itself."""
        ...

    def kill(self) -> None: ...


class Transport(Protocol):
    """Starts the workers' world, reserves bundles and places worker groups on them."""

    def start(self, address: str | None, num_cpus: int | None, num_gpus: int | None) -> None: ...

    def cluster(self, num_bundles: int, num_cpus: float, num_gpus: float, strategy: str = "PACK") -> Cluster: ...

    def group(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
              reserve: bool = True, **kwargs: Any) -> WorkerGroup: ...

    def actor(self, actor_cls: type, *args: Any, max_concurrency: int | None = None,
              name: str | None = None) -> Actor:
        """Start ``actor_cls(*args)`` as a service actor (no bundle, no CPU reserved)."""
        ...

    def put(self, value: Any) -> Any:
        """A reference the driver can pass on to other workers without holding ``value``."""
        ...

    def node_addresses(self) -> dict[str, str]:
        """Node id -> IP address of the nodes workers may run on (none for workers in this process)."""
        ...


class RayTransport:
    """Ray: ``init_ray``, a placement group (``RayVirtualCluster``), an actor per worker."""

    def start(self, address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:
        init_ray(address=address, num_cpus=num_cpus, num_gpus=num_gpus)

    def cluster(self, num_bundles: int, num_cpus: float, num_gpus: float, strategy: str = "PACK") -> Cluster:
        return RayVirtualCluster(num_bundles, num_cpus=num_cpus, num_gpus=num_gpus, strategy=strategy)

    def group(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
              reserve: bool = True, **kwargs: Any) -> WorkerGroup:
        if not isinstance(cluster, RayVirtualCluster):
            raise TypeError(f"a Ray worker group needs a RayVirtualCluster, got {type(cluster).__name__}")
        return RayWorkerGroup(cluster, actor_cls, *args, bundle_indices=bundle_indices, reserve=reserve, **kwargs)

    def actor(self, actor_cls: type, *args: Any, max_concurrency: int | None = None,
              name: str | None = None) -> Actor:
        return RayActor(actor_cls, *args, max_concurrency=max_concurrency, name=name)

    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def node_addresses(self) -> dict[str, str]:
        return node_addresses()


def copied(value: Any) -> Any:
    """``value`` as the other side of a Ray call receives it: a deep copy through pickle."""
    return pickle.loads(pickle.dumps(value))


def worker_class(actor_cls: Any) -> type:
    """The class a ``ray.remote`` wrapper wraps (the worker as written, before Ray's changes)."""
    return actor_cls.__ray_metadata__.modified_class.__bases__[0]


class InProcessCluster:
    """A reservation that reserves nothing: the bundles it was asked for, remembered."""

    def __init__(self, num_bundles: int, num_cpus: float = 1.0, num_gpus: float = 0.0, strategy: str = "PACK"):
        self.num_bundles = num_bundles
        self.bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self.strategy = strategy

    def rendezvous_address(self, bundle_index: int = 0) -> str:
        raise NotImplementedError("in-process workers form no torch.distributed group (a Megatron or a "
                                  "data-parallel policy needs Ray)")

    def shutdown(self) -> None:
        pass


class InProcessWorkerGroup:
    """``RayWorkerGroup``'s calls on workers constructed in this process, one per bundle index.

    Every call runs now, in rank order; ``submit_*`` return the results and :meth:`gather` hands
    them back. Arguments and results are copied (:func:`copied`). The process's torch thread
    count is kept: a worker's constructor sets its own.
    """

    def __init__(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
                 reserve: bool = True, **kwargs: Any):
        cls = worker_class(actor_cls)
        self.name = cls.__name__
        indices = list(bundle_indices) if bundle_indices is not None else list(range(cluster.num_bundles))
        threads = torch.get_num_threads()
        self.workers: list[Any] = []
        for rank, _ in enumerate(indices):
            self.workers.append(self.construct(cls, rank, copied(args), copied(kwargs)))
            torch.set_num_threads(threads)

    def construct(self, cls: type, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Worker ``rank`` of the group (a subclass may record it)."""
        return cls(*args, rank=rank, **kwargs)

    def call(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``method(*args, **kwargs)`` on worker ``rank``, arguments and result copied (a subclass may record it)."""
        return copied(getattr(self.workers[rank], method)(*copied(args), **copied(kwargs)))

    def wait_ready(self, who: str) -> None:
        """The constructors ran in ``__init__``: an error there already surfaced."""

    def __len__(self) -> int:
        return len(self.workers)

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [self.call(rank, method, args, kwargs) for rank in range(len(self.workers))]

    def submit_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.run_all(method, *args, **kwargs)

    def gather(self, refs: list[Any], method: str) -> list[Any]:
        return refs

    def share(self, value: Any) -> Any:
        """No object store: every call gets its own copy anyway."""
        return value

    def run_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        check_shards(shards, len(self.workers))
        return [self.call(rank, method, tuple(s[rank] for s in shards), kwargs) for rank in range(len(self.workers))]

    def submit_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        return self.run_sharded(method, *shards, **kwargs)

    def node_ids(self) -> list[str]:
        """Every worker runs in this process: one node."""
        return [IN_PROCESS_NODE] * len(self.workers)

    def shutdown(self) -> None:
        self.workers = []


class InProcessActor:
    """A service actor as an object of this process.

    A coroutine method runs on the actor's own event-loop thread, as Ray runs an asyncio actor's
    methods; any other method runs in the caller's thread, as a threaded actor's. Each call's
    arguments and result are copied (:func:`copied`). The constructor's arguments are not: they
    are handles (an engine group, another actor), and a handle's in-process form is the object.
    """

    def __init__(self, actor_cls: type, *args: Any, max_concurrency: int | None = None, name: str | None = None):
        self.name = name or actor_cls.__name__
        self.instance = actor_cls(*args)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.instance, method)
        args, kwargs = copied(args), copied(kwargs)
        if inspect.iscoroutinefunction(fn):
            return copied(asyncio.run_coroutine_threadsafe(fn(*args, **kwargs), self._event_loop()).result())
        return copied(fn(*args, **kwargs))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._serve, args=(self._loop,), name=f"{self.name}-loop", daemon=True).start()
            return self._loop

    @staticmethod
    def _serve(loop: asyncio.AbstractEventLoop) -> None:
        loop.run_forever()
        loop.close()

    def kill(self) -> None:
        """End the actor: its ``stop()``, if it has one (a thread of its own ends), and its event
        loop, whose calls still waiting are cancelled (their callers get ``CancelledError``, as a
        Ray caller gets ``RayActorError`` from a killed actor)."""
        stop = getattr(self.instance, "stop", None)
        if callable(stop):
            stop()
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            asyncio.run_coroutine_threadsafe(self._cancel_all_and_stop(loop), loop)

    @staticmethod
    async def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
        # The loop stops only once the cancelled calls are done: their callers' futures are told
        # in a later turn of the loop than the cancellation itself.
        calls = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task()]
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        loop.stop()


class InProcessTransport:
    """Workers in this process (see the module doc); starts nothing, reserves nothing."""

    def start(self, address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:
        pass

    def cluster(self, num_bundles: int, num_cpus: float, num_gpus: float, strategy: str = "PACK") -> Cluster:
        return InProcessCluster(num_bundles, num_cpus, num_gpus, strategy)

    def group(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
              reserve: bool = True, **kwargs: Any) -> WorkerGroup:
        return InProcessWorkerGroup(cluster, actor_cls, *args, bundle_indices=bundle_indices, reserve=reserve,
                                    **kwargs)

    def actor(self, actor_cls: type, *args: Any, max_concurrency: int | None = None,
              name: str | None = None) -> Actor:
        return InProcessActor(actor_cls, *args, max_concurrency=max_concurrency, name=name)

    def put(self, value: Any) -> Any:
        return value

    def node_addresses(self) -> dict[str, str]:
        return {}


_RAY = RayTransport()
_CURRENT: contextvars.ContextVar[Transport | None] = contextvars.ContextVar("posttrain_transport", default=None)


def current_transport() -> Transport:
    """The transport of this process's run set-up (:class:`RayTransport` unless :func:`use_transport` says)."""
    return _CURRENT.get() or _RAY


@contextlib.contextmanager
def use_transport(transport: Transport) -> Iterator[Transport]:
    """Inside the block, runs set up (and their workers put) through ``transport``."""
    token = _CURRENT.set(transport)
    try:
        yield transport
    finally:
        _CURRENT.reset(token)


def object_store_put(value: Any) -> Any:
    """``value`` put where the driver can pass it on without holding it: this process's
    transport's :meth:`Transport.put` (a Ray actor: the object store; in-process: the value)."""
    return current_transport().put(value)
