"""Run the real training loops in this process, with every call to a worker recorded.

``grpo.train`` and ``sft.train`` run unchanged from a loaded config: the real
``setup_runtime``, the driver-side ``Policy`` and ``EngineGroup``, and the worker classes
(``HfPolicyWorkerImpl``, ``HfGenerationWorkerImpl``). Only the transport is replaced: Ray's
start-up and placement group become no-ops and a worker group calls its workers directly.
Arguments and results still cross the boundary as copies (a pickle round trip, as Ray's
serialization would make them), so a worker cannot reach into the driver's objects.

Why: a short run takes about a second instead of ~12 s of actor start-up, so a test can run
the loop many times, once per config value it varies, and read what the loop actually fed
its workers (prompts, sampling parameters, training batches, the loss object) next to the
weights each step started from. What Ray itself adds (serialization of real actors,
placement, refit through the object store or a broadcast) is tested with real Ray elsewhere
(``tests/unit/algorithms``, ``tests/integration/test_grpo_loop_refit.py``).

    def test_x(in_process):                      # fixture in tests/integration/conftest.py
        run = in_process.run(grpo, GRPO_YAML, ["grpo.num_steps=2", "generation.backend=hf"])
        run.metrics["train/loss"]; run.calls("generation", "generate")[0].args
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from posttrain.algorithms import runtime
from posttrain.config import load_config
from posttrain.models.generation import engine_group
from posttrain.models.generation.hf_generation_worker import HfGenerationWorker, HfGenerationWorkerImpl
from posttrain.models.policy import lm_policy
from posttrain.models.policy.hf_policy_worker import HfPolicyWorker, HfPolicyWorkerImpl
from posttrain.weight_sync import sender

# The Ray wrapper -> the class it wraps (the wrappers have no logic of their own), and its role.
IMPLS: dict[Any, tuple[type, str]] = {
    HfPolicyWorker: (HfPolicyWorkerImpl, "policy"),
    HfGenerationWorker: (HfGenerationWorkerImpl, "generation"),
}


# Methods a worker calls on itself inside a fused call (``train_step`` trains, then reports;
# ``put_weights`` and ``broadcast_weights`` score the probe; an engine's ``update_weights``
# reads its version back and scores the probe): recorded as calls of their own, so a test
# reads (and transforms) the loop's training and scoring however the driver batched its requests.
NESTED: dict[str, tuple[str, ...]] = {"policy": ("train", "get_logprobs"), "generation": ("weight_version", "score")}


def _copy(value: Any) -> Any:
    """A value as the other side of a Ray call would receive it: a deep copy through pickle."""
    return pickle.loads(pickle.dumps(value))


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
    """

    role: str
    rank: int
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    weights_before: dict[str, torch.Tensor] | None = None
    forward_rows: list[int] = field(default_factory=list)


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
    clusters: list[NoCluster] = field(default_factory=list)  # the reservations asked for


class LocalWorkerGroup:
    """``RayWorkerGroup``'s interface, calling the wrapped worker classes in this process."""

    recorder: Recorder  # set by InProcess.install

    def __init__(self, cluster: Any, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
                 reserve: bool = True, **kwargs: Any):
        impl_cls, self.role = IMPLS[actor_cls]
        self.name = impl_cls.__name__
        indices = list(bundle_indices) if bundle_indices is not None else list(range(cluster.num_bundles))
        threads = torch.get_num_threads()
        self.workers = []
        for rank, _ in enumerate(indices):
            impl = impl_cls(*_copy(args), rank=rank, **_copy(kwargs))
            for name in NESTED.get(self.role, ()):
                recorded = functools.partial(self._record, impl, rank, name, getattr(impl, name))
                setattr(impl, name, recorded)  # an instance attribute: the worker's own calls go through it
            if self.role == "policy":
                # with LoRA the reference is the trained model with its adapters off (None here)
                for model in (m for m in (impl.model, impl.reference) if m is not None):
                    model.register_forward_pre_hook(self._count_rows, with_kwargs=True)
            self.workers.append(impl)
            self.recorder.workers.append(Worker(impl, self.role, rank, torch.get_num_threads()))
            torch.set_num_threads(threads)  # a worker sets its own threads; keep the test process's

    def _count_rows(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook: the rows of this forward pass, on the call being executed."""
        calls = self.recorder.calls
        if calls:
            ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
            calls[-1].forward_rows.append(int(ids.shape[0]))

    def wait_ready(self, who: str) -> None:
        """Constructors ran in ``__init__``: an error there already surfaced."""

    def __len__(self) -> int:
        return len(self.workers)

    def _call(self, rank: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        worker = self.workers[rank]
        fn = getattr(worker, method)
        if isinstance(fn, functools.partial):  # a NESTED method: it records itself
            return fn(*_copy(args), **_copy(kwargs))
        return self._record(worker, rank, method, fn, *args, **kwargs)

    def _record(self, worker: Any, rank: int, method: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        call = Call(self.role, rank, method, _copy(args), _copy(kwargs))
        if self.role == "policy" and method == "train":
            call.weights_before = worker.get_weights()
        self.recorder.calls.append(call)
        result = _copy(fn(*call.args, **call.kwargs))
        transform = self.recorder.transforms.get((self.role, method))
        call.result = transform(call, result) if transform else result
        return _copy(call.result)  # the driver gets its own copy, the record stays as received

    def run_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return [self._call(rank, method, args, kwargs) for rank in range(len(self.workers))]

    def submit_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Runs the calls now; :meth:`gather` hands their results back."""
        return self.run_all(method, *args, **kwargs)

    def gather(self, results: list[Any], method: str) -> list[Any]:
        return results

    def share(self, value: Any) -> Any:
        """No object store: every call gets its own copy anyway."""
        return value

    def run_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        for shard_list in shards:
            if len(shard_list) != len(self.workers):
                raise ValueError(f"{len(shard_list)} shards for {len(self.workers)} workers")
        return [self._call(rank, method, tuple(s[rank] for s in shards), kwargs) for rank in range(len(self.workers))]

    def submit_sharded(self, method: str, *shards: Sequence[Any], **kwargs: Any) -> list[Any]:
        """Runs the calls now; :meth:`gather` hands their results back."""
        return self.run_sharded(method, *shards, **kwargs)

    def shutdown(self) -> None:
        self.workers = []


class NoCluster:
    """``RayVirtualCluster``'s interface without Ray: remembers the bundles it was asked for."""

    recorder: Recorder  # set by InProcess

    def __init__(self, num_bundles: int, num_cpus: float = 1.0, num_gpus: float = 0.0, **_: Any):
        self.num_bundles = num_bundles
        self.bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        self.recorder.clusters.append(self)

    def shutdown(self) -> None:
        pass


@dataclass
class Run:
    """One finished in-process run: the config it ran with, its logged metrics, what the loop did."""

    cfg: Any  # the validated GRPOMasterConfig / SFTMasterConfig
    metrics: dict[str, dict[str, float]]
    recorder: Recorder

    def calls(self, role: str, method: str) -> list[Call]:
        """The recorded calls of ``method`` on ``role`` workers, in call order."""
        return [c for c in self.recorder.calls if c.role == role and c.method == method]

    def workers(self, role: str) -> list[Worker]:
        return [w for w in self.recorder.workers if w.role == role]


class InProcess:
    """Installed on a ``MonkeyPatch``: while it lives, runtimes are built in this process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.recorder = Recorder()
        group = type("RecordingGroup", (LocalWorkerGroup,), {"recorder": self.recorder})
        cluster = type("RecordingCluster", (NoCluster,), {"recorder": self.recorder})
        real_resolve = runtime.resolve_backend

        def hf_only(backend: str) -> str:
            resolved = real_resolve(backend)
            if resolved != "hf":
                raise AssertionError(f"in-process runs drive the hf backend only, got {resolved!r}")
            return resolved

        monkeypatch.setattr(runtime, "init_ray", lambda **kwargs: self.recorder.ray_init.append(kwargs))
        monkeypatch.setattr(runtime, "RayVirtualCluster", cluster)
        monkeypatch.setattr(runtime, "resolve_backend", hf_only)
        monkeypatch.setattr(lm_policy, "RayWorkerGroup", group)
        monkeypatch.setattr(engine_group, "RayWorkerGroup", group)
        # No object store: a refit's "reference" is the weights themselves (Ray would resolve it
        # to them at the engine).
        monkeypatch.setattr(sender, "object_store_put", lambda value: value)

    def run(self, algorithm: ModuleType, config: str | Path, overrides: list[str],
            transforms: dict[tuple[str, str], Callable[[Call, Any], Any]] | None = None) -> Run:
        """``algorithm.train`` (``grpo`` or ``sft``) on ``config`` with ``overrides``, recorded.

        ``generation.backend=hf`` is added first (a later override cannot change it to vLLM),
        and ``generation.refit_transport=object_store``: a broadcast needs its sender and
        receivers to run at once, and here the workers' calls run one after the other.
        """
        schema = algorithm.GRPOMasterConfig if hasattr(algorithm, "GRPOMasterConfig") else algorithm.SFTMasterConfig
        cfg = load_config(config, ["generation.backend=hf", "generation.refit_transport=object_store", *overrides],
                          schema)
        for log in (self.recorder.calls, self.recorder.workers, self.recorder.ray_init, self.recorder.clusters):
            log.clear()
        self.recorder.transforms = dict(transforms or {})
        metrics = algorithm.train(cfg)
        r = self.recorder
        return Run(cfg, metrics,
                   Recorder(list(r.calls), list(r.workers), r.transforms, list(r.ray_init), list(r.clusters)))
