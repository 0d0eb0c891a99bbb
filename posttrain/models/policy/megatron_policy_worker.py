"""Policy worker on a megatron-core ``GPTModel``: the HF worker's interface, Megatron's model,
DDP and optimizer, tensor parallelism across the workers of one group.

``MegatronPolicyWorkerImpl`` is plain Python; ``MegatronPolicyWorker`` is its thin
``ray.remote`` wrapper. A group of ``tensor_model_parallel_size`` workers holds one model:
every worker receives every call (the driver's ``run_all``) and takes part in the
collectives; rank 0's result is the group's. Weights enter and leave in Hugging Face names
(``posttrain.models.megatron.conversion``), so refit, the weight-sync probe and the final
export are the same as with the HF backend.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ray
import torch

from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import TokenBatch
from posttrain.models.generation.megatron.in_place import InPlaceEngineMixin
from posttrain.models.megatron.conversion import GPTShape, hf_to_megatron, megatron_to_hf, read_hf_weights
from posttrain.models.megatron.model import load_local_state, local_state
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.utils.checkpoint import atomic_dir

OPTIMIZER_STATE = "megatron_optimizer_tp{rank}.pt"


class MegatronPolicyWorkerImpl(PolicyWorkerBase, InPlaceEngineMixin):
    """One tensor-parallel rank of a Megatron policy: the trained ``GPTModel`` (in megatron-core
    DDP), a frozen reference copy, and megatron-core's Adam; with an in-place megatron engine
    it also generates from that model (``InPlaceEngineMixin``: the ``engine_*`` calls).

    Args:
        model_path: Hugging Face Qwen2 directory; converted to megatron shards at start.
        cfg: the policy section plus the run's ``temperature`` and ``device`` (must be "cuda":
            megatron-core's forward calls ``torch.cuda.current_device()``); its ``megatron``
            entry holds ``tensor_model_parallel_size`` and ``precision`` (``fp32`` or
            ``bf16-mixed``: bf16 parameters and compute, fp32 master weights, fp32 gradient
            accumulation, fp32 logits).
        seed: torch seed (the same on every rank: tensor-parallel ranks hold one model).
        rank: tensor-parallel rank.
        init_method: ``tcp://host:port`` where rank 0 gathers the group
            (:func:`posttrain.distributed.ray_cluster.rendezvous_address`).

    Raises:
        ConfigError: the model is not a Qwen2 the converter maps, or the tensor-parallel size
            does not divide its heads.
    """

    def __init__(self, model_path: str, cfg: PolicyWorkerConfig, seed: int = 0, rank: int = 0, *, init_method: str):
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        from posttrain.models.megatron import model as mc

        hf_logging.disable_progress_bar()
        torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(seed)
        self.cfg, self.model_path = cfg, model_path
        mcfg = cfg.megatron
        self.tp, self.rank = mcfg.tensor_model_parallel_size, rank
        # (bf16 without master weights is refused at config validation for this backend)
        self.precision: mc.Precision = "fp32" if cfg.resolved_precision == "fp32" else "bf16-mixed"
        use_tf32_for_fp32("cuda", self.precision == "fp32" and cfg.tf32)  # as the engines do
        self.shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(model_path))
        self.shape.check_tensor_parallel(self.tp)
        mc.init_parallel_state(init_method, rank, self.tp, self.tp, seed)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        shard = hf_to_megatron(read_hf_weights(model_path), self.shape, rank, self.tp)
        model = mc.build_gpt_model(self.shape, self.precision, self.tp)
        load_local_state(model, shard)
        self.reference = None  # a run whose loss has no KL term keeps no copy (cfg.reference)
        if cfg.reference:
            # The KL penalty is measured against the policy as it was at the start of training.
            self.reference = mc.build_gpt_model(self.shape, self.precision, self.tp)
            load_local_state(self.reference, shard)
            self.reference.eval().requires_grad_(False)
        self.model = mc.wrap_ddp(model)
        self.model.train()
        self.optimizer = mc.build_optimizer(self.model, cfg, self.precision)
        self.lr_steps = 0  # successful optimizer steps: the warmup schedule's position
        self.weight_version = 0

    # -- the backend hooks of PolicyWorkerBase ------------------------------------------------

    def _forward_logits(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        from posttrain.models.megatron.model import right_padded_logits

        return right_padded_logits(model, batch.input_ids, self.shape.vocab_size)

    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _optimizer_step(self) -> float:
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])  # data-parallel / tied-embedding reductions
        self.optimizer.prepare_grads()
        # megatron's norm counts tensor-parallel shards once and duplicated weights once
        grad_norm = float(self.optimizer.clip_grad_norm(self.cfg.max_grad_norm))
        if math.isfinite(grad_norm):
            for group in self.optimizer.param_groups:
                group["lr"] = self._next_lr()
            self.optimizer.step_with_ready_grads()
            self.lr_steps += 1
        return grad_norm

    def _next_lr(self) -> float:
        # The HF worker's schedule: linear warmup over `warmup_steps` successful steps, then flat.
        warmup = self.cfg.warmup_steps
        return self.cfg.lr * (min(1.0, (self.lr_steps + 1) / warmup) if warmup else 1.0)

    # -- weights ------------------------------------------------------------------------------

    def _gather_hf(self) -> dict[str, torch.Tensor]:
        """Every rank takes part; rank 0 gets the Hugging Face state dict (CPU), others ``{}``."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        local = local_state(self.model)
        if self.tp == 1:
            return megatron_to_hf([{k: v.detach().cpu().clone() for k, v in local.items()}], self.shape)
        group = parallel_state.get_tensor_model_parallel_group()
        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tp)]
        for name, tensor in local.items():
            parts = [torch.empty_like(tensor) for _ in range(self.tp)]
            dist.all_gather(parts, tensor.detach().contiguous(), group=group)
            for r, part in enumerate(parts):
                shards[r][name] = part.cpu()
        return megatron_to_hf(shards, self.shape) if self.rank == 0 else {}

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights in Hugging Face names and shapes, CPU tensors in the parameters'
        dtype (fp32, or bf16 for ``bf16-mixed``: what the forward pass uses), on rank 0
        (``{}`` on other ranks; every rank must be called)."""
        return self._gather_hf()

    def save_checkpoint(self, path: str, tokenizer_path: str | None = None) -> None:
        """Atomically write a Hugging Face directory (loadable as ``model.path`` by either
        backend, fp32), each rank's optimizer state and the weight version to ``path``."""
        import torch.distributed as dist
        from transformers import AutoConfig, AutoModelForCausalLM

        weights = self._gather_hf()
        state = {"optimizer": self.optimizer.state_dict(), "lr_steps": self.lr_steps,
                 "weight_version": self.weight_version}
        states: list[Any] = [None] * self.tp
        dist.all_gather_object(states, state)
        if self.rank != 0:
            return
        config = AutoConfig.from_pretrained(tokenizer_path or self.model_path)
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        hf.load_state_dict({k: v.float() for k, v in weights.items()})
        with atomic_dir(Path(path)) as tmp:
            hf.save_pretrained(tmp)
            if tokenizer_path:
                from transformers import AutoTokenizer

                AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(tmp)
            for r, rank_state in enumerate(states):
                torch.save(rank_state, tmp / OPTIMIZER_STATE.format(rank=r))

    def load_checkpoint(self, path: str) -> None:
        """Restore weights (from the checkpoint's Hugging Face files), this rank's optimizer
        state (fp32 master weights included), the lr schedule and the weight version."""
        load_local_state(self.model, hf_to_megatron(read_hf_weights(path), self.shape, self.rank, self.tp))
        state = torch.load(Path(path) / OPTIMIZER_STATE.format(rank=self.rank), weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_steps, self.weight_version = state["lr_steps"], state["weight_version"]


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    """Ray actor wrapper of :class:`MegatronPolicyWorkerImpl` (no logic of its own)."""
