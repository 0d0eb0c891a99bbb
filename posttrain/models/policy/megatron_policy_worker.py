"""Policy worker on a megatron-core ``GPTModel``: the HF worker's interface, Megatron's model,
DDP, optimizer and pipeline schedules, tensor and pipeline parallelism across the workers of
one group.

``MegatronPolicyWorkerImpl`` is plain Python; ``MegatronPolicyWorker`` is its thin
``ray.remote`` wrapper. A group of ``tensor_model_parallel_size * pipeline_model_parallel_size``
workers holds one model: every worker receives every call (the driver's ``run_all``) and takes
part in the collectives; rank 0's result is the group's. Every forward and backward pass runs
through megatron-core's own schedule (``get_forward_backward_func``: no pipelining for one
stage, 1F1B for several); the loss, logprobs and metrics are computed on the last stage and
broadcast to the earlier ones, so rank 0 (the first stage) answers for the group. Weights enter
and leave in Hugging Face names (``posttrain.models.megatron.conversion``), so refit, the
weight-sync probe and the final export are the same as with the HF backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch

from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import TokenBatch
from posttrain.data.packing import pack_rows
from posttrain.models.generation.megatron.in_place import InPlaceEngineMixin
from posttrain.models.megatron.conversion import (
    GPTShape,
    hf_to_megatron,
    megatron_to_hf,
    merge_pipeline_stages,
    read_hf_weights,
    split_pipeline_stage,
    stage_layers,
)
from posttrain.models.megatron.model import load_local_state, local_state
from posttrain.models.policy.base_policy_worker import MicroBatch, PolicyWorkerBase, reduce_metrics
from posttrain.models.policy.interfaces import LossFn, Metrics
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.utils.checkpoint import atomic_dir, check_written_by

# one file per model-parallel rank (rank = tp_rank + tp * pp_rank; the name predates pipelines)
OPTIMIZER_STATE = "megatron_optimizer_tp{rank}.pt"


class MegatronPolicyWorkerImpl(PolicyWorkerBase, InPlaceEngineMixin):
    """One model-parallel rank of a Megatron policy (a tensor-parallel shard of one pipeline
    stage): the trained ``GPTModel`` (in megatron-core DDP), a frozen reference copy, and
    megatron-core's Adam; with an in-place megatron engine it also generates from that model
    (``InPlaceEngineMixin``: the ``engine_*`` calls; one stage only).

    Args:
        model_path: Hugging Face Qwen2 directory; converted to megatron shards at start.
        cfg: the policy section plus the run's ``temperature`` and ``device`` (must be "cuda":
            megatron-core's forward calls ``torch.cuda.current_device()``); its ``megatron``
            entry holds ``tensor_model_parallel_size``, ``pipeline_model_parallel_size`` and
            ``layer_spec`` (:func:`~posttrain.models.megatron.model.gpt_layer_spec`), and
            ``precision`` (``fp32`` or ``bf16-mixed``: bf16 parameters and compute, fp32 master
            weights, fp32 gradient accumulation, fp32 logits).
        seed: torch seed (the same on every rank: the ranks hold one model).
        rank: model-parallel rank, ``tp_rank + tensor_model_parallel_size * pp_rank``
            (megatron-core's order).
        init_method: ``tcp://host:port`` where rank 0 gathers the group
            (:func:`posttrain.distributed.ray_cluster.rendezvous_address`).

    Raises:
        ConfigError: the model is not a Qwen2 the converter maps, the tensor-parallel size
            does not divide its heads, or the pipeline size its layers.
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
        self.tp, self.pp, self.rank = mcfg.tensor_model_parallel_size, mcfg.pipeline_model_parallel_size, rank
        self.tp_rank, self.pp_rank = rank % self.tp, rank // self.tp  # megatron-core's order: tp fastest
        # (bf16 without master weights is refused at config validation for this backend)
        self.precision: mc.Precision = "fp32" if cfg.resolved_precision == "fp32" else "bf16-mixed"
        use_tf32_for_fp32("cuda", self.precision == "fp32" and cfg.tf32)  # as the engines do
        self.shape = GPTShape.from_hf_config(AutoConfig.from_pretrained(model_path))
        self.shape.check_tensor_parallel(self.tp)
        stage_layers(self.shape, self.pp_rank, self.pp)  # the pipeline size divides the layers
        mc.init_parallel_state(init_method, rank, self.tp * self.pp, self.tp, seed, self.pp)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
        shard = self._local_shard(read_hf_weights(model_path))
        model = mc.build_gpt_model(self.shape, self.precision, self.tp, self.pp, mcfg.layer_spec)
        load_local_state(model, shard)
        self.reference = None  # a run whose loss has no KL term keeps no copy (cfg.reference)
        if cfg.reference:
            # The KL penalty is measured against the policy as it was at the start of training.
            self.reference = mc.build_gpt_model(self.shape, self.precision, self.tp, self.pp, mcfg.layer_spec)
            load_local_state(self.reference, shard)
            self.reference.eval().requires_grad_(False)
        self.model = mc.wrap_ddp(model)
        self.model.train()
        self.optimizer = mc.build_optimizer(self.model, cfg, self.precision)
        self.lr_steps = 0  # successful optimizer steps: the warmup schedule's position
        self.weight_version = 0

    def _local_shard(self, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's megatron weights (its tensor-parallel shard of its pipeline stage) of a
        Hugging Face state dict."""
        shard = hf_to_megatron(hf, self.shape, self.tp_rank, self.tp)
        return split_pipeline_stage(shard, self.shape, self.pp_rank, self.pp) if self.pp > 1 else shard

    def model_layout(self) -> dict[str, Any]:
        """Where this rank sits in the model, as megatron built it: ``tp_rank``, ``pp_rank``,
        ``layers`` (the global layer indices of its stage), ``num_local_layers`` (megatron's
        count of the layers it holds), ``embedding`` / ``output_layer`` (whether it holds them)
        and ``core_attention`` (the class name of its layers' core attention: the layer spec)."""
        from posttrain.models.megatron.model import unwrap

        gpt = unwrap(self.model)
        return {"tp_rank": self.tp_rank, "pp_rank": self.pp_rank,
                "layers": list(stage_layers(self.shape, self.pp_rank, self.pp)),
                "num_local_layers": len(gpt.decoder.layers), "embedding": bool(gpt.pre_process),
                "output_layer": bool(gpt.post_process),
                "core_attention": sorted({type(layer.self_attention.core_attention).__name__
                                          for layer in gpt.decoder.layers})}

    # -- the backend hooks of PolicyWorkerBase ------------------------------------------------

    def _forward_logits(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        # only the in-place engine's teacher-forced scoring calls this (the worker's own passes go
        # through _schedule, which packs): padded rows, the same numbers
        from posttrain.models.megatron.model import right_padded_logits

        return right_padded_logits(model, batch.input_ids, self.shape.vocab_size)

    def _schedule(self, model: torch.nn.Module, micro: list[MicroBatch], forward_only: bool,
                  reduce: Callable[[MicroBatch, torch.Tensor], tuple[torch.Tensor, dict[str, Any]]]) -> list[dict]:
        """Run ``micro`` through megatron-core's schedule for this layout (no pipelining for one
        stage, 1F1B for several), with a backward pass unless ``forward_only``.

        ``reduce(micro_batch, logits)`` runs on the last stage with the micro-batch's ``[b, S, V]``
        logits (cut to the true vocabulary) and returns ``(loss, outputs)``: the loss whose
        gradient this micro-batch adds, and what to keep. Returns the ``outputs`` in order on the
        last stage, ``[]`` on the others. megatron divides each loss by the number of
        micro-batches (it assumes per-micro-batch means); posttrain's losses are already shares of
        the global batch's token mean, so they are handed over multiplied back.
        """
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from posttrain.models.megatron.model import packed_logits

        vocab, n = self.shape.vocab_size, len(micro)

        def forward_step(data_iterator: Any, module: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
            mb = next(data_iterator)
            ids = mb.batch.input_ids
            if self.cfg.sequence_packing:  # one stage (config): the [B, S, V] logits, padding computed never
                output = packed_logits(module, pack_rows(mb.batch), vocab)
            else:
                positions = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
                output = module(ids, positions, None)  # right-padded rows: the causal mask suffices

            def loss_func(logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                loss, outputs = reduce(mb, logits[..., :vocab])
                return loss * n, outputs

            return output, loss_func

        rows = max(len(mb.batch) for mb in micro)
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro), model=[model], num_microbatches=n,
            seq_length=micro[0].batch.input_ids.shape[1], micro_batch_size=rows, forward_only=forward_only)

    def _from_last_stage(self, value: Any) -> Any:
        """``value`` as the last pipeline stage holds it, on every stage (a no-op for one stage)."""
        if self.pp == 1:
            return value
        import torch.distributed as dist
        from megatron.core import parallel_state

        box = [value]
        dist.broadcast_object_list(box, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                   group=parallel_state.get_pipeline_model_parallel_group())
        return box[0]

    def _completion_logprobs(self, model: torch.nn.Module, batch: TokenBatch, top_k: int, top_p: float,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Scoring (no gradient) through the forward-only schedule, on every stage."""

        def reduce(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logprobs, entropy = self._logprobs_from_logits(logits, mb.batch, top_k, top_p, with_entropy)
            return logits.new_zeros(()), {"logprobs": logprobs, "entropy": entropy}

        out = self._schedule(model, [MicroBatch(batch, {})], forward_only=True, reduce=reduce)
        if self.pp == 1:
            return out[0]["logprobs"], out[0]["entropy"]
        logprobs, entropy = self._from_last_stage((out[0]["logprobs"].cpu(), out[0]["entropy"]) if out else None)
        return logprobs.to(self.device), None if entropy is None else entropy.to(self.device)

    def _forward_backward(self, micro: list[MicroBatch], loss_fn: LossFn, num_tokens: float,
                          forward_old: list[torch.Tensor] | None) -> Metrics:
        """The base class's micro-batch loop, as megatron-core's schedule runs it: the same
        :meth:`_micro_loss` per micro-batch on the last stage; its metrics and the forward's old
        logprobs reach every stage."""
        start = len(forward_old) if forward_old is not None else 0

        def reduce(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logprobs, entropy = self._logprobs_from_logits(logits, mb.batch, self.cfg.top_k, self.cfg.top_p, True)
            loss, metrics = self._micro_loss(mb, logprobs, entropy, loss_fn, num_tokens, forward_old)
            return loss * self.gradient_scale, metrics

        outputs = self._schedule(self.model, micro, forward_only=False, reduce=reduce)
        step_metrics: Metrics = {}
        for metrics in outputs:  # the last stage's; [] on the others
            reduce_metrics(step_metrics, metrics)
        if self.pp > 1:  # what the last stage computed, on every stage
            old = None if forward_old is None else [t.cpu() for t in forward_old[start:]]
            step_metrics, old = self._from_last_stage((step_metrics, old))
            if forward_old is not None:
                forward_old[start:] = [t.to(self.device) for t in old]
        return step_metrics

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
        """Every rank takes part; rank 0 gets the Hugging Face state dict (CPU), others ``{}``.
        The tensor-parallel shards of each stage are gathered first (all-gather in the TP
        group), then the stages (an object all-gather in the pipeline group)."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        shards: list[dict[str, torch.Tensor]] = [{} for _ in range(self.tp)]
        for name, tensor in local_state(self.model).items():
            parts = [tensor.detach().clone()]
            if self.tp > 1:
                parts = [torch.empty_like(tensor) for _ in range(self.tp)]
                dist.all_gather(parts, tensor.detach().contiguous(),
                                group=parallel_state.get_tensor_model_parallel_group())
            for r, part in enumerate(parts):
                shards[r][name] = part.cpu()
        if self.pp > 1:  # stages[s][r]: stage s, tensor-parallel rank r
            stages: list[Any] = [None] * self.pp
            dist.all_gather_object(stages, shards, group=parallel_state.get_pipeline_model_parallel_group())
            if self.rank == 0:  # only rank 0 answers: the others skip the merge
                shards = [merge_pipeline_stages([stage[r] for stage in stages], self.shape) for r in range(self.tp)]
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
        states: list[Any] = [None] * (self.tp * self.pp)
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
        state (fp32 master weights included), the lr schedule and the weight version.

        Raises:
            ConfigError: the checkpoint holds the optimizer states of another number of ranks (tensor
                x pipeline parallel size): a rank would restore another layout's shard, or find none.
        """
        saved = len(list(Path(path).glob(OPTIMIZER_STATE.format(rank="*"))))
        check_written_by(path, "policy.megatron.tensor_model_parallel_size x pipeline_model_parallel_size", saved,
                         self.tp * self.pp)
        load_local_state(self.model, self._local_shard(read_hf_weights(path)))
        state = torch.load(Path(path) / OPTIMIZER_STATE.format(rank=self.rank), weights_only=False)
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_steps, self.weight_version = state["lr_steps"], state["weight_version"]


@ray.remote
class MegatronPolicyWorker(MegatronPolicyWorkerImpl):
    """Ray actor wrapper of :class:`MegatronPolicyWorkerImpl` (no logic of its own)."""
