"""Driver-side policy: fans calls out to the policy worker(s) on a virtual cluster.

One worker for now (data parallelism across workers needs a gradient all-reduce, which
arrives with the multi-GPU backends); the driver code does not change when it does.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.data.batch import TokenBatch
from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import RayWorkerGroup
from posttrain.models.policy.hf_policy_worker import HfPolicyWorker
from posttrain.models.policy.interfaces import LossFn, Metrics


class Policy:
    """A Hugging Face policy in a Ray actor placed on ``cluster`` bundle ``bundle_index``.

    Args:
        cluster: the virtual cluster to place the worker on.
        model_path: Hugging Face model directory to start from.
        cfg: the ``policy`` section of the config, as a dict.
        seed: torch seed of the worker.
        bundle_index: which bundle of the cluster the worker takes.
    """

    def __init__(self, cluster: RayVirtualCluster, model_path: str, cfg: dict[str, Any], seed: int,
                 bundle_index: int = 0):
        self.group = RayWorkerGroup(cluster, HfPolicyWorker, model_path, cfg, seed, bundle_indices=[bundle_index])
        self.model_path = model_path

    def wait_ready(self) -> None:
        """Block until the worker is up (see :meth:`RayWorkerGroup.wait_ready`).

        Raises:
            WorkerStartError: its constructor raised (one line).
        """
        self.group.wait_ready(f"policy worker for '{self.model_path}'")

    def get_logprobs(self, batch: TokenBatch, reference: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs (reference=True: the frozen initial policy)."""
        return self.group.run_all("get_logprobs", batch, reference=reference)[0]

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> Metrics:
        """One training step; see ``HfPolicyWorkerImpl.train``."""
        return self.group.run_all("train", batch, extra, loss_fn)[0]

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights for refit (Hugging Face names, CPU tensors)."""
        return self.group.run_all("get_weights")[0]

    @property
    def weight_version(self) -> int:
        """Completed training steps; refit passes it on to the generation engine."""
        return self.group.run_all("get_weight_version")[0]

    def save_checkpoint(self, path: str) -> None:
        """Write a Hugging Face directory (+ tokenizer, + optimizer state) to ``path``, atomically."""
        self.group.run_all("save_checkpoint", path, tokenizer_path=self.model_path)

    def peak_memory_gib(self) -> float:
        """Peak resident memory of the policy worker process, GiB."""
        return max(self.group.run_all("peak_memory_gib"))

    def shutdown(self) -> None:
        self.group.shutdown()
