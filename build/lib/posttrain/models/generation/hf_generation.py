"""Driver-side Hugging Face generation: shards prompts over generation workers."""

from __future__ import annotations

import torch

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import RayWorkerGroup
from posttrain.models.generation.hf_generation_worker import HfGenerationWorker
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.models.generation.sharding import agreed_version, contiguous_shards, gather_outputs

WHO = "generation workers"


class HfGeneration:
    """``Generation`` backed by ``transformers`` ``generate`` in Ray actors.

    Args:
        cluster: virtual cluster to place the workers on.
        model_path: Hugging Face model directory (initial weights).
        bundle_indices: one worker per listed bundle.
        num_threads: torch CPU threads per worker.
        device: "cpu", or "cuda" when the cluster's bundles hold a GPU.
    """

    def __init__(self, cluster: RayVirtualCluster, model_path: str, bundle_indices: list[int], num_threads: int = 1,
                 device: str = "cpu"):
        self.group = RayWorkerGroup(cluster, HfGenerationWorker, model_path, num_threads,
                                    bundle_indices=bundle_indices, device=device)
        self.model_path = model_path

    def wait_ready(self) -> None:
        """Block until every worker is up; ``WorkerStartError`` (one line) if one is not."""
        self.group.wait_ready(f"generation worker for '{self.model_path}'")

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Split ``prompts`` into contiguous shards, one per worker, and gather in order."""
        shards = contiguous_shards(prompts, len(self.group))
        return gather_outputs(self.group.run_sharded("generate", shards, params=params), WHO)

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs of ``completions`` (see ``Generation.score``), sharded like :meth:`generate`."""
        n = len(self.group)
        shards = self.group.run_sharded("score", contiguous_shards(prompts, n), contiguous_shards(completions, n),
                                        temperature=temperature)
        return [row for rows in shards for row in rows]

    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Refit: the weights go into the object store once; every worker loads them."""
        self.group.run_all("update_weights", weights, version)

    def weight_version(self) -> int:
        """The engine's weight version (all workers must agree)."""
        return agreed_version(self.group.run_all("weight_version"), WHO)

    def shutdown(self) -> None:
        self.group.shutdown()
