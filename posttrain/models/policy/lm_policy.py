"""Driver-side policy: fans calls out to the policy worker(s) on a virtual cluster.

``policy.backend`` picks the worker class: ``hf`` (one worker, or one per data-parallel rank)
or ``megatron`` (one worker per tensor-parallel rank, together one model). The driver code is
the same for both: every call goes to every worker, and rank 0's answer is the group's; only a
data-parallel train call hands each rank its own rows of every global batch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import ray
import torch

from posttrain.config import PolicyConfig, PolicyWorkerConfig
from posttrain.data.batch import TokenBatch
from posttrain.distributed.sharding import global_batch_shards
from posttrain.distributed.transport import Cluster, current_transport
from posttrain.distributed.worker_group import Pending
from posttrain.errors import ConfigError
from posttrain.models.placement import require_gpus
from posttrain.models.policy.hf_policy_worker import HfPolicyWorker
from posttrain.models.policy.interfaces import LossFn, TrainResult
from posttrain.models.policy.lora import check_adapter
from posttrain.weight_sync.refit import RefitTarget

MCORE_MISSING = ("policy.backend=megatron but megatron-core is not installed: run with `uv run --extra mcore ...`")


def num_policy_workers(cfg: PolicyConfig) -> int:
    """Workers (and bundles) the policy takes: the data-parallel size for hf, the tensor- times the
    pipeline-parallel size for megatron (one worker per model-parallel rank)."""
    if cfg.backend == "megatron":
        return cfg.megatron.tensor_model_parallel_size * cfg.megatron.pipeline_model_parallel_size
    return cfg.data_parallel_size


def check_backend(cfg: PolicyConfig, gpus_per_worker: float, gpus_found: int | None = None) -> None:
    """Fail before Ray starts when the policy backend cannot run here.

    Args:
        cfg: the ``policy`` section.
        gpus_per_worker: ``cluster.gpus_per_worker``.
        gpus_found: GPUs visible to this process (default: ``torch.cuda.device_count()``).

    Raises:
        ConfigError: megatron without megatron-core, without a GPU on this machine, or without
            GPUs for its workers; tensor- or data-parallel ranks that would share a GPU (Ray
            packs bundles of a fraction of a GPU onto one device, and NCCL refuses two ranks on
            one device).
    """
    if cfg.backend == "megatron":
        if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
            raise ConfigError(MCORE_MISSING)
        require_gpus("policy.backend=megatron", gpus_per_worker, gpus_found,
                     "megatron-core's forward pass runs on CUDA")
    # One rank per worker (TP x PP for megatron, DP for hf), each on a GPU of its own.
    ranks = num_policy_workers(cfg)
    if ranks > 1 and 0 < gpus_per_worker < 1:
        m = cfg.megatron
        if cfg.backend == "megatron" and m.pipeline_model_parallel_size == 1:
            what = f"policy.megatron.tensor_model_parallel_size={ranks}"
        elif cfg.backend == "megatron":
            what = (f"policy.megatron.tensor_model_parallel_size={m.tensor_model_parallel_size} x "
                    f"pipeline_model_parallel_size={m.pipeline_model_parallel_size} ({ranks} ranks)")
        else:
            what = f"policy.data_parallel_size={ranks}"
        raise ConfigError(f"{what} needs a whole GPU per rank, but cluster.gpus_per_worker={gpus_per_worker:g}")

class Policy:
    """A policy in Ray actors placed on ``cluster`` bundles ``bundle_indices``.

    Args:
        cluster: the virtual cluster to place the workers on.
        model_path: Hugging Face model directory to start from.
        cfg: the ``policy`` section plus the run's ``temperature`` and ``device``.
        seed: torch seed of the workers.
        bundle_indices: which bundles the workers take, one each (``num_policy_workers(cfg)`` of them).
    """

    def __init__(self, cluster: Cluster, model_path: str, cfg: PolicyWorkerConfig, seed: int,
                 bundle_indices: list[int] | None = None):
        indices = bundle_indices if bundle_indices is not None else [0]
        if len(indices) != num_policy_workers(cfg):
            raise ValueError(f"{len(indices)} bundles for {num_policy_workers(cfg)} policy workers")
        if cfg.backend == "megatron":
            from posttrain.models.policy.megatron_policy_worker import MegatronPolicyWorker

            self.group = current_transport().group(cluster, MegatronPolicyWorker, model_path, cfg, seed,
                                                   bundle_indices=indices,
                                                   init_method=cluster.rendezvous_address(indices[0]))
        else:
            rendezvous = cluster.rendezvous_address(indices[0]) if cfg.data_parallel_size > 1 else None
            self.group = current_transport().group(cluster, HfPolicyWorker, model_path, cfg, seed,
                                                   bundle_indices=indices, init_method=rendezvous)
        self.model_path = model_path
        self.data_parallel_size = cfg.data_parallel_size  # > 1 only for hf (the config refuses it with megatron)
        self.global_batch_size = cfg.train_global_batch_size
        self.backend = cfg.backend
        self.lora_cfg = cfg.lora
        # The version the workers reported with their last train step (None: ask them).
        self._version: int | None = None
        self._gpu: tuple[str | None] | None = None  # rank 0's GPU, once asked for
        self.broadcast_peer: RefitTarget | None = None  # the engines the broadcast group was set up with
        self.last_broadcast: tuple[int, int] | None = None  # (buckets, bytes) of the last broadcast refit

    def wait_ready(self) -> None:
        """Block until the workers are up (see :meth:`RayWorkerGroup.wait_ready`).

        Raises:
            WorkerStartError: a constructor raised (one line).
        """
        self.group.wait_ready(f"{self.backend} policy worker for '{self.model_path}'")

    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs under the sampling distribution (reference=True:
        of the frozen initial policy; whole_vocab=True: without top-k / top-p), see
        ``PolicyWorkerBase.get_logprobs``."""
        return self.group.run_all("get_logprobs", batch, reference=reference, whole_vocab=whole_vocab)[0]

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> TrainResult:
        """One training step (see ``PolicyWorkerBase.train``): rank 0's metrics, weight version
        and old logprobs, and the largest peak memory of the workers, in one :class:`TrainResult`.
        :attr:`weight_version` answers the new version afterwards without asking again."""
        if self.data_parallel_size > 1:
            return self._train_data_parallel(batch, extra, loss_fn)
        results = self.group.run_all("train_step", batch, extra, loss_fn)
        metrics, version, _, old_logprobs, timing = results[0]
        self._version = version
        return TrainResult(metrics, version, max(result[2] for result in results), old_logprobs, timing)

    def _train_data_parallel(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> TrainResult:
        """Each rank trains on its rows of every global batch (``global_batch_shards``); the
        workers reduce the metrics, and the old logprobs come back in the batch's row order.
        """
        shares = global_batch_shards(len(batch), self.global_batch_size, self.data_parallel_size)
        index = [torch.tensor(rows, dtype=torch.long) for rows, _ in shares]
        results = self.group.run_sharded(
            "train_step", [batch.select(i) for i in index], [{k: v[i] for k, v in extra.items()} for i in index],
            [loss_fn] * len(index), [steps for _, steps in shares], template=batch.select(slice(0, 1)))
        metrics, version = results[0][:2]
        old_logprobs = None
        if results[0][3] is not None:  # each rank's rows, back in the batch's order
            old_logprobs = torch.zeros(batch.completion_mask.shape)
            for i, result in zip(index, results, strict=True):
                old_logprobs[i] = result[3]
        self._version = version
        return TrainResult(metrics, version, max(result[2] for result in results), old_logprobs)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights (Hugging Face names, CPU tensors in the engine's dtype), fetched to
        the driver; a refit uses :meth:`put_weights` instead."""
        return self.group.run_all("get_weights")[0]

    def put_weights(self, probe: TokenBatch | None = None,
                    cuda_ipc: bool = False) -> tuple[ray.ObjectRef, torch.Tensor | None]:
        """The weights for a refit, left in Ray's object store by the worker: ``(reference,
        probe logprobs or None)`` (see ``PolicyWorkerBase.put_weights``; ``cuda_ipc``: only
        handles to the weights on the policy's GPU). Pass the reference to
        ``Generation.update_weights``; the driver never holds the tensors."""
        [ref], probe_logprobs = self.group.run_all("put_weights", probe, cuda_ipc=cuda_ipc)[0]
        return ref, probe_logprobs

    def gpu_uuid(self) -> str | None:
        """Rank 0's GPU (None on a CPU), asked for once: a refit's transport depends on it."""
        if self._gpu is None:
            self._gpu = (self.group.run_all("gpu_uuid")[0],)
        return self._gpu[0]

    def serve_weight_broadcast(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0 serves the store of a refit broadcast group: its ``(host, port)``
        (``WeightSender.serve_weight_broadcast``)."""
        return self.group.run_all("serve_weight_broadcast", timeout_s)[0]

    def start_joining_broadcast(self, world_size: int, timeout_s: float) -> Pending[None]:
        """Rank 0 joins the group it serves as the sender, started, not waited for (the engines
        join at the same time)."""
        return Pending(self.group.gather, self.group.submit_all("join_weight_broadcast", world_size, timeout_s),
                       "join_weight_broadcast", lambda _: None)

    def start_broadcast(self, bucket_bytes: int,
                        probe: TokenBatch | None = None) -> Pending[tuple[torch.Tensor | None, int, int]]:
        """Every worker sends its part of a broadcast refit (rank 0 sends; see
        ``WeightSender.broadcast_weights``), started, not waited for; rank 0's
        ``(probe logprobs, buckets, bytes)`` when waited for."""
        return Pending(self.group.gather, self.group.submit_all("broadcast_weights", bucket_bytes, probe),
                       "broadcast_weights", lambda answers: answers[0])

    @property
    def weight_version(self) -> int:
        """Completed training steps, as the workers reported them with their last step (asked
        for when none is known: at start and after a checkpoint load); refit passes it on to
        the generation engine."""
        if self._version is None:
            self._version = self.group.run_all("get_weight_version")[0]
        return self._version

    def save_checkpoint(self, path: str) -> None:
        """Write the training state to ``path``, atomically: the weights (a Hugging Face
        directory with the tokenizer; with LoRA the adapter alone), optimizer state, weight version."""
        self.group.run_all("save_checkpoint", path, tokenizer_path=self.model_path)

    def export(self, path: str) -> None:
        """Write the final model to ``path``, atomically: a Hugging Face directory with the
        tokenizer, loadable as a new ``model.path`` (with LoRA: the merged weights)."""
        self.group.run_all("export", path, tokenizer_path=self.model_path)

    def load_checkpoint(self, path: str) -> None:
        """Restore weights, optimizer state and weight version from ``save_checkpoint``'s ``path``.

        Raises:
            ConfigError: the checkpoint's LoRA adapter (or its absence) does not match ``policy.lora``.
        """
        check_adapter(Path(path), self.lora_cfg)
        self._version = None  # the checkpoint's version, asked for at the next read
        self.group.run_all("load_checkpoint", path)

    def parameter_counts(self) -> tuple[int, int]:
        """(trained, total) parameters of the model rank 0 holds (with LoRA: the adapters,
        and the base model plus the adapters)."""
        return self.group.run_all("parameter_counts")[0]

    def peak_memory_gib(self) -> float:
        """Peak resident memory of the policy worker processes, GiB (the largest), asked for now
        (a train call reports it too: ``TrainResult.peak_memory_gib``)."""
        return max(self.group.run_all("peak_memory_gib"))

    def node_ids(self) -> list[str]:
        """The node each policy worker runs on (Ray's node id), in rank order."""
        return self.group.node_ids()

    def config_reads(self) -> frozenset[str]:
        """The run's config keys the policy workers read so far (``posttrain.config_reads``)."""
        return frozenset().union(*self.group.run_all("config_reads"))

    def shutdown(self) -> None:
        self.group.shutdown()
