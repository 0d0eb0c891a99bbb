"""Driver-side policy: fans calls out to the policy worker(s) on a virtual cluster.

``policy.backend`` picks the worker class: ``hf`` (one worker) or ``megatron`` (one worker per
tensor-parallel rank, together one model). The driver code is the same for both: every call
goes to every worker, and rank 0's answer is the group's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import ray
import torch

from posttrain.config import PolicyConfig, PolicyWorkerConfig
from posttrain.data.batch import TokenBatch
from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import RayWorkerGroup
from posttrain.errors import ConfigError
from posttrain.models.generation.interfaces import ProbeRequest, RefitReceipt
from posttrain.models.policy.hf_policy_worker import HfPolicyWorker
from posttrain.models.policy.interfaces import LossFn, TrainResult
from posttrain.models.policy.lora import check_adapter
from posttrain.models.weight_broadcast import BROADCAST_TIMEOUT_S

RefitTransport = Literal["cuda_ipc", "broadcast", "object_store"]

MCORE_MISSING = ("policy.backend=megatron but megatron-core is not installed: run with `uv run --extra mcore ...`")


def num_policy_workers(cfg: PolicyConfig) -> int:
    """Workers (and bundles) the policy takes: 1, or the tensor-parallel size for megatron."""
    return cfg.megatron.tensor_model_parallel_size if cfg.backend == "megatron" else 1


def check_backend(cfg: PolicyConfig, gpus_per_worker: float, gpus_found: int | None = None) -> None:
    """Fail before Ray starts when the policy backend cannot run here.

    Args:
        cfg: the ``policy`` section.
        gpus_per_worker: ``cluster.gpus_per_worker``.
        gpus_found: GPUs visible to this process (default: ``torch.cuda.device_count()``).

    Raises:
        ConfigError: megatron without megatron-core, without a GPU on this machine, without
            GPUs for its workers, or with tensor-parallel ranks that would share a GPU.
    """
    if cfg.backend != "megatron":
        return
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        raise ConfigError(MCORE_MISSING)
    found = torch.cuda.device_count() if gpus_found is None else gpus_found
    if found == 0:
        raise ConfigError("policy.backend=megatron needs 1 GPU, found 0 (megatron-core's forward pass runs on CUDA)")
    if gpus_per_worker <= 0:
        raise ConfigError("policy.backend=megatron needs GPUs for its workers: set cluster.gpus_per_worker > 0")
    tp = cfg.megatron.tensor_model_parallel_size
    if tp > 1 and gpus_per_worker < 1:
        raise ConfigError(f"policy.megatron.tensor_model_parallel_size={tp} needs a whole GPU per rank, "
                          f"but cluster.gpus_per_worker={gpus_per_worker:g}")


def choose_refit_transport(setting: str, policy_gpu: str | None, engine_gpus: list[str | None]) -> RefitTransport:
    """The refit transport for ``generation.refit_transport`` = ``setting`` ("auto" or
    "object_store"), the policy's GPU UUID and the engines' (None: a CPU).

    ``cuda_ipc`` when every engine holds the policy's GPU; ``broadcast`` when all of them are
    on CPUs, or each on a GPU of its own (NCCL cannot have two ranks on one GPU); else
    ``object_store`` (also whenever ``setting`` says so).
    """
    if setting == "object_store":
        return "object_store"
    if policy_gpu is not None and all(uuid == policy_gpu for uuid in engine_gpus):
        return "cuda_ipc"
    on_cpus = policy_gpu is None and all(uuid is None for uuid in engine_gpus)
    gpus = [policy_gpu, *engine_gpus]
    own_gpus = None not in gpus and len(set(gpus)) == len(gpus)
    return "broadcast" if on_cpus or own_gpus else "object_store"


class Policy:
    """A policy in Ray actors placed on ``cluster`` bundles ``bundle_indices``.

    Args:
        cluster: the virtual cluster to place the workers on.
        model_path: Hugging Face model directory to start from.
        cfg: the ``policy`` section plus the run's ``temperature`` and ``device``.
        seed: torch seed of the workers.
        bundle_indices: which bundles the workers take, one each (``num_policy_workers(cfg)`` of them).
    """

    def __init__(self, cluster: RayVirtualCluster, model_path: str, cfg: PolicyWorkerConfig, seed: int,
                 bundle_indices: list[int] | None = None):
        indices = bundle_indices if bundle_indices is not None else [0]
        if len(indices) != num_policy_workers(cfg):
            raise ValueError(f"{len(indices)} bundles for {num_policy_workers(cfg)} policy workers")
        if cfg.backend == "megatron":
            from posttrain.models.policy.megatron_policy_worker import MegatronPolicyWorker

            self.group = RayWorkerGroup(cluster, MegatronPolicyWorker, model_path, cfg, seed, bundle_indices=indices,
                                        init_method=cluster.rendezvous_address(indices[0]))
        else:
            self.group = RayWorkerGroup(cluster, HfPolicyWorker, model_path, cfg, seed, bundle_indices=indices)
        self.model_path = model_path
        self.backend = cfg.backend
        self.lora_cfg = cfg.lora
        # The version the workers reported with their last train step (None: ask them).
        self._version: int | None = None
        self._gpus: dict[int, tuple[str | None, list[str | None]]] = {}  # id(generation) -> (our GPU, theirs)
        self._broadcast_to: int | None = None  # id of the engine group the broadcast group was set up with
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
        results = self.group.run_all("train_step", batch, extra, loss_fn)
        metrics, version, _, old_logprobs = results[0]
        self._version = version
        return TrainResult(metrics, version, max(peak for _, _, peak, _ in results), old_logprobs)

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

    def refit_transport(self, generation: Any) -> RefitTransport:
        """How a refit reaches ``generation``'s engines (:func:`choose_refit_transport` of its
        ``refit_transport`` setting, rank 0's GPU and the engines'; the GPUs are asked for once
        per engine group). A ``generation`` without the setting (a test double) gets ``object_store``."""
        setting = getattr(generation, "refit_transport", "object_store")
        if setting == "object_store":
            return "object_store"
        key = id(generation)
        if key not in self._gpus:
            self._gpus[key] = (self.group.run_all("gpu_uuid")[0], generation.gpu_uuids())
        return choose_refit_transport(setting, *self._gpus[key])

    def broadcast_weights(self, generation: Any, version: int, probe: TokenBatch | None = None,
                          engine_probe: ProbeRequest | None = None) -> tuple[torch.Tensor | None, RefitReceipt]:
        """Refit ``generation``'s engines over a broadcast from the policy worker (NCCL or gloo,
        see ``posttrain.models.weight_broadcast``): the sender and the receivers run at once,
        the weights go device to device in buckets of ``generation.refit_bucket_bytes``. The
        group is set up at the first refit of an engine group. After the weights, each side
        scores its probe in the same call (the two at once).

        Returns:
            ``(trainer probe logprobs or None, the engines' receipt)``: the sender's
            ``[B, L]`` logprobs of ``probe``, and the version the engines read back with their
            scores of ``engine_probe`` (``EngineGroup.receipt``).

        Raises:
            StaleWeightsError: an engine could not load the weights (names or shapes differ).
            WorkerDiedError: a worker died on the way.
        """
        if self._broadcast_to != id(generation):
            host, port = self.group.run_all("serve_weight_broadcast", BROADCAST_TIMEOUT_S)[0]
            world_size = 1 + generation.num_engines
            mine = self.group.submit_all("join_weight_broadcast", world_size, BROADCAST_TIMEOUT_S)
            generation.gather(generation.submit("join_weight_broadcast", host, port, world_size, BROADCAST_TIMEOUT_S),
                              "join_weight_broadcast")
            self.group.gather(mine, "join_weight_broadcast")
            self._broadcast_to = id(generation)
        sending = self.group.submit_all("broadcast_weights", generation.refit_bucket_bytes, probe)
        receipt = generation.receipt(generation.submit_receive(version, engine_probe), "receive_weights")
        probe_logprobs, buckets, sent = self.group.gather(sending, "broadcast_weights")[0]
        self.last_broadcast = (buckets, sent)
        return probe_logprobs, receipt

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

    def shutdown(self) -> None:
        self.group.shutdown()
