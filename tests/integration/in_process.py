"""Run the real training loops in this process, with every call to a worker recorded.

``grpo.train`` and ``sft.train`` run unchanged from a loaded config: the real
``setup_runtime``, the driver-side ``Policy`` and ``EngineGroup``, and the worker classes.
Only the transport differs, and it is chosen, not patched in: the library's
``InProcessTransport`` (``posttrain.distributed.transport``) starts nothing, reserves nothing and
calls the workers in this process, with arguments and results copied through pickle as Ray's
serialization would copy them, so a worker cannot reach into the driver's objects.
:class:`RecordingTransport` is that transport keeping a record of every worker, call, start-up
and reservation; any worker class runs in it unlisted (its role is read from its base class).

Why: a short run takes about a second instead of ~12 s of actor start-up, so a test can run
the loop many times, once per config value it varies, and read what the loop actually fed
its workers (prompts, sampling parameters, training batches, the loss object) next to the
weights each step started from, and when (each call's start and end, the asynchronous loop's
buffer and producer calls, each step's log: ``step_timing.py`` bounds the loops' timings by
them). What Ray itself adds (serialization of real actors, placement, refit through the object
store or a broadcast) is tested with real Ray elsewhere (``tests/unit/algorithms``,
``tests/integration/test_grpo_loop_refit.py``).

    def test_x(in_process):                      # fixture in tests/integration/conftest.py
        run = in_process.run(grpo, GRPO_YAML, ["grpo.num_steps=2", "generation.backend=hf"])
        run.metrics["train/loss"]; run.calls("generation", "generate")[0].args
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from posttrain.config import load_config
from posttrain.config_reads import record_of
from posttrain.distributed.transport import (
    Actor,
    Cluster,
    InProcessActor,
    InProcessTransport,
    InProcessWorkerGroup,
    WorkerGroup,
    copied,
    use_transport,
)
from posttrain.models.generation.engine import EngineWorker
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase
from posttrain.utils.logger import MetricsLogger

HARNESS_OVERRIDES = ["generation.backend=hf", "generation.refit_transport=object_store"]  # see InProcess.run

# Methods a worker calls on itself inside a fused call (``train_step`` trains, then reports;
# ``put_weights`` and ``broadcast_weights`` score the probe; an engine's ``update_weights``
# reads its version back and scores the probe): recorded as calls of their own, so a test
# reads (and transforms) the loop's training and scoring however the driver batched its requests.
NESTED: dict[str, tuple[str, ...]] = {"policy": ("train", "get_logprobs"), "generation": ("weight_version", "score")}


def role_of(worker: Any) -> str:
    """"policy" or "generation", from the worker's base class."""
    if isinstance(worker, PolicyWorkerBase):
        return "policy"
    if isinstance(worker, EngineWorker):
        return "generation"
    raise TypeError(f"{type(worker).__name__} is neither a policy worker nor an engine worker")


@dataclass
class Call:
    """One call of a worker method, in the order the driver made them.

    Attributes:
        role: "policy" or "generation".
        rank: the worker's rank in its group.
        method: the method name.
        args, kwargs: what the worker received (copies).
        result: what the driver received (a copy, after any ``transform``).
        weights_before: for the policy's ``train`` calls, the weights the step started from
            (Hugging Face names, CPU copies); else None.
        forward_rows: policy calls: the number of rows of each forward pass of the policy's
            models (trained and reference) during the call, in order.
        started, ended: ``time.perf_counter()`` when the call began and when its (transformed)
            result was ready, the clock the loops time their phases with.
        thread: the calling thread (``threading.get_ident()``): the asynchronous loop's producer
            samples on a thread of its own.
    """

    role: str
    rank: int
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    weights_before: dict[str, torch.Tensor] | None = None
    forward_rows: list[int] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    thread: int = 0


@dataclass
class ActorCall:
    """One call of a service actor (the asynchronous loop's rollout buffer or producer): which,
    the method, and when (``perf_counter``) from which thread; arguments and results are not kept."""

    actor: str
    method: str
    started: float
    ended: float
    thread: int


@dataclass
class Worker:
    """An in-process worker and what its constructor did: the torch threads it set."""

    impl: Any
    role: str
    rank: int
    num_threads: int


@dataclass
class Recorder:
    """The calls, workers, Ray start-up arguments and reservations of the current run;
    ``transforms`` rewrite results on the way back (``(role, method) -> fn(call, result) ->
    result``), e.g. to perturb an engine's logprobs."""

    calls: list[Call] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    transforms: dict[tuple[str, str], Callable[[Call, Any], Any]] = field(default_factory=dict)
    ray_init: list[dict[str, Any]] = field(default_factory=list)  # init_ray's keyword arguments
    clusters: list[Cluster] = field(default_factory=list)  # the reservations asked for
    actor_calls: list[ActorCall] = field(default_factory=list)  # the service actors' calls
    # step -> perf_counter() when the loop handed that step's metrics to its logger
    logged_at: dict[int, float] = field(default_factory=dict)


class RecordingGroup(InProcessWorkerGroup):
    """An in-process worker group that records its workers and every call into ``recorder``."""

    def __init__(self, recorder: Recorder, cluster: Cluster, actor_cls: Any, *args: Any, **kwargs: Any):
        self.recorder = recorder
        super().__init__(cluster, actor_cls, *args, **kwargs)

    def construct(self, cls: type, rank: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        impl = super().construct(cls, rank, args, kwargs)
        role = role_of(impl)
        for name in NESTED[role]:
            recorded = functools.partial(self._record, impl, role, rank, name, getattr(impl, name))
            setattr(impl, name, recorded)  # an instance attribute: the worker's own calls go through it
        if role == "policy":
            # with LoRA the reference is the trained model with its adapters off (None here)
            for model in (m for m in (impl.model, impl.reference) if m is not None):
                model.register_forward_pre_hook(self._count_rows, with_kwargs=True)
        self.recorder.workers.append(Worker(impl, role, rank, torch.get_num_threads()))  # the threads it set
        return impl

    def _count_rows(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook: the rows of this forward pass, on the call being executed."""
        calls = self.recorder.calls
        if calls:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            calls[-1].forward_rows.append(int(ids.shape[0]))

    def call(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        worker = self.workers[rank]
        fn = getattr(worker, method)
        if isinstance(fn, functools.partial):  # a NESTED method: it records itself
            return fn(*copied(args), **copied(kwargs))
        return self._record(worker, role_of(worker), rank, method, fn, *args, **kwargs)

    def _record(self, worker: Any, role: str, rank: int, method: str, fn: Callable[..., Any], *args: Any,
                **kwargs: Any) -> Any:
        call = Call(role, rank, method, copied(args), copied(kwargs), thread=threading.get_ident())
        if role == "policy" and method == "train":
            call.weights_before = worker.get_weights()
        self.recorder.calls.append(call)
        call.started = time.perf_counter()
        result = copied(fn(*call.args, **call.kwargs))
        transform = self.recorder.transforms.get((role, method))
        call.result = transform(call, result) if transform else result
        call.ended = time.perf_counter()
        return copied(call.result)  # the driver gets its own copy, the record stays as received


class RecordingActor(InProcessActor):
    """An in-process service actor whose calls are timed into ``recorder.actor_calls``."""

    def __init__(self, recorder: Recorder, actor_cls: type, *args: Any, max_concurrency: int | None = None,
                 name: str | None = None):
        self.recorder = recorder
        super().__init__(actor_cls, *args, max_concurrency=max_concurrency, name=name)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return super().call(method, *args, **kwargs)
        finally:
            self.recorder.actor_calls.append(ActorCall(self.name, method, started, time.perf_counter(),
                                                       threading.get_ident()))


class RecordingTransport(InProcessTransport):
    """``InProcessTransport`` with a record: Ray's start-up arguments, the reservations, the
    workers and their calls."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder

    def start(self, address: str | None, num_cpus: int | None, num_gpus: int | None) -> None:
        self.recorder.ray_init.append({"address": address, "num_cpus": num_cpus, "num_gpus": num_gpus})

    def cluster(self, num_bundles: int, num_cpus: float, num_gpus: float, strategy: str = "PACK") -> Cluster:
        cluster = super().cluster(num_bundles, num_cpus, num_gpus, strategy)
        self.recorder.clusters.append(cluster)
        return cluster

    def group(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
              reserve: bool = True, **kwargs: Any) -> WorkerGroup:
        return RecordingGroup(self.recorder, cluster, actor_cls, *args, bundle_indices=bundle_indices,
                              reserve=reserve, **kwargs)

    def actor(self, actor_cls: type, *args: Any, max_concurrency: int | None = None,
              name: str | None = None) -> Actor:
        return RecordingActor(self.recorder, actor_cls, *args, max_concurrency=max_concurrency, name=name)


@dataclass
class Run:
    """One finished in-process run: the config it ran with, its logged metrics, what the loop did."""

    cfg: Any  # the validated GRPOMasterConfig / SFTMasterConfig
    metrics: dict[str, dict[str, float]]
    recorder: Recorder
    started: float = 0.0  # perf_counter() before the loop's train() was called
    ended: float = 0.0  # perf_counter() after it returned
    thread: int = 0  # the thread it ran in (the driver's)

    def calls(self, role: str, method: str) -> list[Call]:
        """The recorded calls of ``method`` on ``role`` workers, in call order."""
        return [c for c in self.recorder.calls if c.role == role and c.method == method]

    def workers(self, role: str) -> list[Worker]:
        return [w for w in self.recorder.workers if w.role == role]


class InProcess:
    """Runs the real loops through a :class:`RecordingTransport` (one record per run)."""

    def __init__(self) -> None:
        self.recorder = Recorder()

    def run(self, algorithm: ModuleType, config: str | Path, overrides: list[str],
            transforms: dict[tuple[str, str], Callable[[Call, Any], Any]] | None = None) -> Run:
        """``algorithm.train`` (``grpo`` or ``sft``) on ``config`` with ``overrides``, recorded.

        ``generation.backend=hf`` is added first (an override of yours may name another engine:
        any engine worker runs in-process), and ``generation.refit_transport=object_store``:
        a broadcast needs its sender and receivers to run at once, and here the workers' calls
        run one after the other. These two are the harness's, not the run's: the run's check that
        every key set is read (``posttrain.algorithms.unread_keys``) leaves them out, unless an
        override of yours sets them too (a run without an engine reads neither).
        """
        schema = algorithm.GRPOMasterConfig if hasattr(algorithm, "GRPOMasterConfig") else algorithm.SFTMasterConfig
        cfg = load_config(config, [*HARNESS_OVERRIDES, *overrides], schema)
        record = record_of(cfg)
        for key in {o.split("=")[0] for o in HARNESS_OVERRIDES} - {o.split("=")[0] for o in overrides}:
            record.set_keys.pop(key, None)
        r = self.recorder
        for log in (r.calls, r.workers, r.ray_init, r.clusters, r.actor_calls, r.logged_at):
            log.clear()
        r.transforms = dict(transforms or {})
        started = time.perf_counter()
        with use_transport(RecordingTransport(r)), _logging_times(r.logged_at):
            metrics = algorithm.train(cfg)
        ended = time.perf_counter()
        return Run(cfg, metrics, Recorder(list(r.calls), list(r.workers), r.transforms, list(r.ray_init),
                                          list(r.clusters), list(r.actor_calls), dict(r.logged_at)),
                   started, ended, threading.get_ident())


def no_ray_actor(*args: Any, **kwargs: Any) -> None:
    """Patched over ``worker_group.RayActor.__init__`` by a test that must start no Ray actor."""
    raise AssertionError("a Ray actor was started under the in-process transport")


@contextlib.contextmanager
def _logging_times(logged_at: dict[int, float]) -> Iterator[None]:
    """Inside the block, every ``MetricsLogger.log`` call notes when it began, by step (the logger
    is the loop's own, built inside ``open_run``; it logs as before)."""
    log = MetricsLogger.log

    def timed(self: MetricsLogger, metrics: dict[str, float], step: int) -> None:
        logged_at[step] = time.perf_counter()
        log(self, metrics, step)

    MetricsLogger.log = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        MetricsLogger.log = log  # type: ignore[method-assign]
