"""Driver-side vLLM generation: one engine per Ray actor, prompts sharded across them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import get_unwrapped
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.generation.sharding import agreed_version, contiguous_shards, gather_outputs
from posttrain.models.generation.vllm.vllm_generation_worker import VllmGenerationWorker


@dataclass(frozen=True)
class EnginePlacement:
    """Where one engine actor goes: a bundle of the virtual cluster and what it reserves.

    Colocated engines sit on the policy's bundle and reserve nothing (``num_cpus=0``):
    the synchronous loop never generates and trains at once, so they share its CPUs.
    """

    bundle_index: int
    num_cpus: float
    num_gpus: float = 0.0


WHO = "vLLM engines"


class VllmGeneration:
    """``Generation`` backed by vLLM engines in Ray actors.

    Args:
        cluster: virtual cluster to place the engines on.
        model_path: Hugging Face model directory (initial weights).
        placements: one engine per placement.
        engine_cfg: see :class:`~posttrain.models.generation.vllm.vllm_generation_worker.VllmGenerationWorkerImpl`.

    Raises:
        EngineStartError, ConfigError: an engine did not start (one line, from the worker).
    """

    def __init__(self, cluster: RayVirtualCluster, model_path: str, placements: list[EnginePlacement],
                 engine_cfg: dict[str, Any]):
        self.workers = [
            VllmGenerationWorker.options(  # type: ignore[attr-defined]
                num_cpus=p.num_cpus, num_gpus=p.num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    cluster.placement_group, placement_group_bundle_index=p.bundle_index),
            ).remote(model_path, engine_cfg, rank=rank)
            for rank, p in enumerate(placements)
        ]
        try:
            get_unwrapped([w.start.remote() for w in self.workers])
        except BaseException:
            self.shutdown()
            raise

    def wait_ready(self) -> None:
        """Nothing to wait for: the constructor already waited for every engine to start."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Split ``prompts`` into contiguous shards, one per engine, and gather in order.

        Raises:
            StaleWeightsError: the engines report different weight versions, or an engine is
                labelled or stamped with another version than the one it was last given.
        """
        shards = contiguous_shards(prompts, len(self.workers))
        outs = get_unwrapped([w.generate.remote(s, params) for w, s in zip(self.workers, shards, strict=True)])
        return gather_outputs(outs, WHO)

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions``, sharded like :meth:`generate`."""
        n = len(self.workers)
        shards = zip(self.workers, contiguous_shards(prompts, n), contiguous_shards(completions, n), strict=True)
        refs = [w.score.remote(p, c, temperature) for w, p, c in shards]
        return [row for rows in get_unwrapped(refs) for row in rows]

    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Refit: put the weights in the object store once; every engine loads them in place."""
        ref = ray.put(weights)
        get_unwrapped([w.update_weights.remote(ref, version) for w in self.workers])

    def weight_version(self) -> int:
        """The engines' weight version.

        Raises:
            StaleWeightsError: the engines disagree.
        """
        return agreed_version(get_unwrapped([w.weight_version.remote() for w in self.workers]), WHO)

    def shutdown(self) -> None:
        """Kill every engine actor (their bundles stay with the cluster)."""
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
