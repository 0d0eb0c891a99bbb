"""Policy worker on a Hugging Face causal LM (torch): logprobs, train step, weights, checkpoints.

``HfPolicyWorkerImpl`` is plain Python (unit tests construct it directly); ``HfPolicyWorker``
is the thin ``ray.remote`` wrapper the driver-side :class:`posttrain.models.policy.lm_policy.Policy`
places on a virtual cluster.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
import torch

from posttrain.config import PolicyWorkerConfig, engine_dtype
from posttrain.data.batch import TokenBatch
from posttrain.data.packing import pack_rows, unpack
from posttrain.errors import ConfigError
from posttrain.models.fused_norms import use_fused_rms_norm
from posttrain.models.policy import causal_attention, lora, varlen_attention
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase
from posttrain.models.policy.reference_timing import reference_forward_backward_seconds
from posttrain.models.precision import use_tf32_for_fp32
from posttrain.ops import chunked_completion_logprobs, completion_logits, completion_positions
from posttrain.utils.checkpoint import atomic_dir, check_written_by
from posttrain.weight_sync.transport import tensor_identity


def check_plain_output_layer(model: torch.nn.Module, key: str = "policy.logprob_chunk_tokens") -> None:
    """Refuse ``key`` (``policy.logprob_chunk_tokens`` or ``policy.sequence_packing``: both score
    from the output layer's weight) for a model whose logits are not ``hidden @ W.T`` (an output
    layer with a bias, or logit soft-capping / scaling in the model's forward), which the chunked
    scoring (``ops.chunked_completion_logprobs``) would silently leave out.

    Raises:
        ConfigError: naming the model's class and what it has.
    """
    head = model.get_output_embeddings()  # type: ignore[operator]
    extra = ("an output layer with a bias" if getattr(head, "bias", None) is not None
             else next((f"config.{key}={getattr(model.config, key)}"
                        for key in ("final_logit_softcapping", "logit_scale")
                        if getattr(model.config, key, None) not in (None, 1.0)), None))
    if head is None or extra:
        raise ConfigError(f"{key} needs logits = hidden @ W.T, but {type(model).__name__} has "
                          f"{extra or 'no output layer'}")

class HfPolicyWorkerImpl(PolicyWorkerBase):
    """Holds the trained model, a frozen reference copy (unless ``cfg.reference`` is false), and AdamW.

    With ``lora.rank`` > 0 the model is the base model plus LoRA adapters (peft; see
    :mod:`posttrain.models.policy.lora`): only the adapters train, sit in the optimizer and go
    into checkpoints; the reference is the base model (the adapters switched off) and the
    weights for refit and export are the merged ones.

    Precision (``cfg.precision``, see :func:`posttrain.config.resolve_precision`): ``fp32``
    holds and computes in float32 (TF32 matmuls on CUDA); ``bf16`` holds the weights, the
    gradients and AdamW's state in bfloat16; ``bf16-mixed`` holds float32 master weights and
    optimizer state and runs the forward pass under bfloat16 autocast. Logprobs, entropy and
    losses are computed in float32 from the logits in every mode. ``cfg.compile`` compiles the
    trained model's forward in place (``torch.compile``; the reference is not compiled). On a GPU
    the padded rows are attended causally without their padding mask (``causal_attention``: on
    right-padded rows it changes no real token's output, and sdpa's kernels skip the masked half).

    Args:
        model_path: Hugging Face model directory.
        cfg: the policy section plus the run's temperature and device ("cuda": the Ray actor
            of a GPU bundle sees its GPU as ``cuda:0``).
        seed: torch seed.
        rank: rank in the worker group.
        init_method: with ``cfg.data_parallel_size`` > 1, the rendezvous of the ranks'
            ``torch.distributed`` group (``tcp://host:port``).

    Data parallelism (``cfg.data_parallel_size`` = N > 1): N workers, one per rank, each hold the
    whole model loaded, then sharded with torch FSDP2 (``fully_shard`` on every decoder layer and
    on the model), so weights, gradients and AdamW's state are split over the ranks (gloo on CPU,
    NCCL on CUDA). The frozen reference stays whole on every rank. Each rank trains on its rows
    of every global batch (``PolicyWorkerBase.train``); their gradients are summed, not averaged,
    since each rank's loss is already its share of the global batch's token mean. Refit, export
    and checkpoints gather the whole state to rank 0 (a checkpoint holds the gathered model and
    optimizer state, so it resumes at the same N; another N is refused).

    Raises:
        ConfigError: a ``lora.target_modules`` entry the model does not have.
    """

    def __init__(self, model_path: str, cfg: PolicyWorkerConfig, seed: int = 0, rank: int = 0,
                 init_method: str | None = None):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(seed + rank)
        self.cfg = cfg
        self.rank = rank
        self.device = torch.device(cfg.device)
        self.precision = cfg.resolved_precision
        use_tf32_for_fp32(self.device, self.precision == "fp32" and cfg.tf32)
        self.param_dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        # transformers wraps PreTrainedModel.to in a decorator that mypy reads as unbound.
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.param_dtype).to(self.device)  # type: ignore[arg-type]
        if cfg.fused_rms_norm:  # before LoRA, the reference copy, FSDP2 and compile: they all see the swap
            use_fused_rms_norm(self.model)
        if cfg.logprob_chunk_tokens or cfg.sequence_packing:  # both score from the output layer's weight
            check_plain_output_layer(self.model, "policy.logprob_chunk_tokens" if cfg.logprob_chunk_tokens
                                     else "policy.sequence_packing")
        if cfg.sequence_packing:  # attention within each packed sequence (the reference copy below too)
            self.model.set_attn_implementation(varlen_attention.register())
        elif self.device.type == "cuda" and self.model.config._attn_implementation == "sdpa":
            # right-padded rows need no padding mask under causal attention, and without one sdpa's
            # kernels skip the masked half of the square (causal_attention). On a GPU only: a CPU
            # worker keeps transformers' masked sdpa, whose numbers the CPU tests are calibrated on.
            self.model.set_attn_implementation(causal_attention.register())
        self.use_lora = cfg.lora.rank > 0
        if self.use_lora:
            self.model = lora.apply_lora(self.model, cfg.lora)
            self.reference = None  # the base model: self.model with its adapters switched off
        elif cfg.reference:
            # The KL penalty is measured against the policy as it was at the start of training.
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        else:
            self.reference = None  # the run's loss has no KL term: no copy to hold
        self.data_parallel_size = cfg.data_parallel_size
        if self.data_parallel_size > 1:
            self._shard(init_method)
        if cfg.compile:
            # In place (nn.Module.compile): parameter names, state dicts and hooks stay the model's own.
            self.model.compile()
        self.model.train()
        # torch's fused AdamW kernel (CUDA and CPU): the same update as the per-tensor loop in one
        # kernel per dtype group (~5 ms less a step at 0.39B on an H100; 1.3 ms instead of 4.3
        # for the tiny arithmetic model on one CPU thread).
        self.optimizer = torch.optim.AdamW(
            self.trainable_parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(cfg.betas[0], cfg.betas[1]),
            fused=True,
        )
        warmup = cfg.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.weight_version = 0

    def _shard(self, init_method: str | None) -> None:
        """Join the ranks' group and shard the model over it (FSDP2)."""
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        if init_method is None:
            raise ValueError("a data-parallel policy worker needs the ranks' rendezvous (init_method)")
        dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", init_method=init_method,
                                rank=self.rank, world_size=self.data_parallel_size)
        mesh = init_device_mesh(self.device.type, (self.data_parallel_size,))
        for layer in self.model.model.layers:  # one all-gather per layer in the forward, not one for all
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        # Each rank's loss is its rows' share of the global batch's token mean, so the global
        # batch's gradient is the sum of the ranks' gradients; FSDP averages them (gloo has no
        # pre-multiplied sum to tell it otherwise), so each rank's backward is scaled by N.
        self.gradient_scale = float(self.data_parallel_size)

    def _across_ranks(self, values: list[float], op: str) -> list[float]:
        if self.data_parallel_size == 1:
            return values
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return tensor.tolist()

    def _full_state(self, with_optimizer: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """The gathered model (and optimizer) state dicts, on the CPU of rank 0 ({} on the others):
        a collective, every rank calls it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_state: dict[str, Any]
        optimizer_state: dict[str, Any] = {}
        if with_optimizer:
            model_state, optimizer_state = get_state_dict(self.model, self.optimizer, options=options)
        else:
            model_state = get_model_state_dict(self.model, options=options)
        # The gather copies a tied parameter once per name: tie the copies again, so a tied output
        # embedding is saved and sent once, as the unsharded model's state dict has it.
        names: dict[int, list[str]] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(param), []).append(name)
        for first, *tied in names.values():
            for name in tied:
                if first in model_state:
                    model_state[name] = model_state[first]
        return model_state, optimizer_state

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (all of them, or the LoRA adapters)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @contextlib.contextmanager
    def _scoring_model(self, reference: bool) -> Iterator[torch.nn.Module]:
        if reference and self.use_lora:
            with self.model.disable_adapter():
                yield self.model
        else:
            with super()._scoring_model(reference) as model:
                yield model

    def _autocast(self) -> contextlib.AbstractContextManager:
        # bf16-mixed: bf16 matmuls over the fp32 master weights (autocast casts per op).
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed")

    def _run(self, module: Any, batch: TokenBatch) -> Any:
        """``module`` (the model or its decoder) on ``batch``: padded rows with their attention
        mask (which transformers leaves out on a GPU: ``causal_attention``), or, with
        ``policy.sequence_packing``, the rows' real tokens packed into one row with per-sequence
        position ids (``data.packing``); returns ``(output, packed or None)``."""
        with self._autocast():
            if not self.cfg.sequence_packing:
                return module(input_ids=batch.input_ids, attention_mask=batch.attention_mask), None
            packed = pack_rows(batch)
            # the varlen attention reads the sequences' offsets (cu_seq_lens), never the position ids
            # (the rotary positions) nor a mask; use_cache=False: a training forward needs no KV cache
            return module(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                          cu_seq_lens=packed.cu_seq_lens, seq_bounds=packed.seq_bounds), packed

    def _forward_logits(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        out, packed = self._run(model, batch)
        return out.logits if packed is None else unpack(out.logits, packed)  # [B, S, V]

    def _completion_logprobs(self, model: torch.nn.Module, batch: TokenBatch, top_k: int, top_p: float,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        width, seq_len = batch.completion_mask.shape[1], batch.input_ids.shape[1]
        # with packing and no chunk size: the completion tokens in one chunk (the output layer on
        # them only, never on prompt or padding positions)
        chunk = self.cfg.logprob_chunk_tokens or (len(batch) * width if self.cfg.sequence_packing else 0)
        if not chunk:
            return super()._completion_logprobs(model, batch, top_k, top_p, with_entropy)
        # The decoder's final hidden states at the positions that predict the completion tokens,
        # then the output layer a chunk of tokens at a time: the [B, S, V] logits never exist.
        targets = batch.input_ids.gather(1, completion_positions(batch.prompt_lens, width, seq_len))  # [B, L]
        out, packed = self._run(model.get_decoder(), batch)  # type: ignore[operator]
        hidden = out.last_hidden_state if packed is None else unpack(out.last_hidden_state, packed)  # [B, S, H]
        head = model.get_output_embeddings()  # type: ignore[operator]
        compute_dtype = torch.bfloat16 if self.precision == "bf16-mixed" else None  # as autocast's lm_head
        return chunked_completion_logprobs(completion_logits(hidden, batch.prompt_lens, width), head.weight, targets,
                                           chunk, self.cfg.temperature, top_k, top_p, with_entropy, compute_dtype)

    def _reference_seconds(self, micro: list[TokenBatch]) -> float:
        # the reference is plain torch on the padded rows: sdpa with the padding mask, also when this
        # worker packs (its varlen attention refuses a call that is not packed) or attends causally
        attention = self.model.config._attn_implementation
        if attention in (varlen_attention.VARLEN, causal_attention.CAUSAL):
            self.model.set_attn_implementation("sdpa")
        try:
            return reference_forward_backward_seconds(self.model, micro, self._autocast,
                                                      list(self.trainable_parameters()))
        finally:
            self.model.set_attn_implementation(attention)

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _optimizer_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.cfg.max_grad_norm)
        # sharded gradients: the norm is a DTensor, the whole gradient's norm once made full
        grad_norm = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
        return grad_norm

    def _next_lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights, Hugging Face parameter names, detached CPU tensors in the
        generation engine's dtype (float32 for ``fp32``, else bfloat16; with LoRA: the merged
        weights, under the base model's names)."""
        return self._weights_in_engine_dtype(torch.device("cpu"))

    def _weights_in_engine_dtype(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The state dict copied to ``device`` in the engine's dtype. Names that share one
        tensor (a tied output embedding) share one copy: pickled once into the object store,
        one IPC handle's memory, and still tied when the engine receives them."""
        dtype = getattr(torch, engine_dtype(self.precision))
        state = self._refit_source()
        copies: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
        out = {}
        for name, tensor in state.items():
            key = tensor_identity(tensor)
            if key not in copies:
                # a data-parallel state is already a gathered copy of its own: not copied again
                copies[key] = tensor.detach().to(device, dtype, copy=self.data_parallel_size == 1)
            out[name] = copies[key]
        return out

    def _refit_weights(self, on_device: bool = False) -> dict[str, torch.Tensor]:
        """:meth:`get_weights`, on this worker's device with ``on_device``. Every name is sent
        (vLLM's CPU build keeps its own copy of a tied output embedding and must be given it),
        a tied one as the same tensor, so its bytes travel once."""
        return self._weights_in_engine_dtype(self.device if on_device else torch.device("cpu"))

    def _refit_source(self) -> dict[str, torch.Tensor]:
        """The model's own state dict, no copy (with LoRA: the merged weights); a broadcast
        converts each tensor to the engine's dtype as it packs it. Data-parallel: the gathered
        weights on rank 0, {} on the others (every rank must be called)."""
        if self.data_parallel_size > 1:
            return self._full_state()[0]
        return lora.merged_state_dict(self.model) if self.use_lora else self.model.state_dict()

    def save_checkpoint(self, path: str, tokenizer_path: str | None = None) -> None:
        """Atomically write the model (Hugging Face format, loadable as a new ``model.path``;
        with LoRA only the adapter, in peft's format), the optimizer state and the weight
        version to directory ``path``. Data-parallel: every rank gathers, rank 0 writes the whole
        model and the whole optimizer state (keyed by parameter name), and the ranks' count."""
        if self.data_parallel_size > 1:
            model_state, optimizer_state = self._full_state(with_optimizer=True)
            if self.rank == 0:
                with atomic_dir(Path(path)) as tmp:
                    self.model.save_pretrained(tmp, state_dict=model_state)
                    _save_tokenizer(tokenizer_path, tmp)
                    torch.save({"optimizer_by_name": optimizer_state, "scheduler": self.scheduler.state_dict(),
                                "weight_version": self.weight_version,
                                "data_parallel_size": self.data_parallel_size}, tmp / "trainer_state.pt")
            return
        with atomic_dir(Path(path)) as tmp:
            self.model.save_pretrained(tmp)
            _save_tokenizer(tokenizer_path, tmp)
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "weight_version": self.weight_version}, tmp / "trainer_state.pt")

    def export(self, path: str, tokenizer_path: str | None = None) -> None:
        """Atomically write the final model to ``path`` in Hugging Face format, loadable as a
        new ``model.path`` by any backend or engine: with LoRA the merged weights, and the
        adapter alone in ``path/adapter``; without, what :meth:`save_checkpoint` writes."""
        if not self.use_lora:
            return super().export(path, tokenizer_path)
        with atomic_dir(Path(path)) as tmp:
            merged = copy.deepcopy(self.model).merge_and_unload()
            merged.save_pretrained(tmp)
            _save_tokenizer(tokenizer_path, tmp)
            self.model.save_pretrained(tmp / "adapter")

    def load_checkpoint(self, path: str) -> None:
        """Restore model weights (with LoRA: the adapter), optimizer state and weight version
        from ``save_checkpoint``.

        Raises:
            ConfigError: the checkpoint was written by another ``policy.data_parallel_size``, or its
                adapter lacks a tensor of this policy's adapters or holds one it does not have.
        """
        if self.use_lora:
            from peft.utils import set_peft_model_state_dict
            from safetensors.torch import load_file

            adapter = load_file(str(Path(path) / lora.ADAPTER_WEIGHTS))
            result: Any = set_peft_model_state_dict(self.model, adapter)
            lora.check_adapter_tensors(Path(path), result.missing_keys, result.unexpected_keys)
        state = torch.load(Path(path) / "trainer_state.pt", weights_only=True)
        check_written_by(path, "policy.data_parallel_size", state.get("data_parallel_size", 1), self.data_parallel_size)
        if not self.use_lora:
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(path, dtype=self.param_dtype)
            if self.data_parallel_size > 1:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

                set_state_dict(self.model, self.optimizer, model_state_dict=loaded.state_dict(),
                               optim_state_dict=state["optimizer_by_name"],
                               options=StateDictOptions(full_state_dict=True))
            else:
                self.model.load_state_dict(loaded.state_dict())
        if self.data_parallel_size == 1:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.weight_version = state["weight_version"]


def _save_tokenizer(tokenizer_path: str | None, directory: Path) -> None:
    if tokenizer_path:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(directory)


@ray.remote
class HfPolicyWorker(HfPolicyWorkerImpl):
    """Ray actor wrapper of :class:`HfPolicyWorkerImpl` (no logic of its own)."""
