"""Build the megatron-core pieces of a Megatron policy: parallel state, ``GPTModel``, DDP, optimizer.

Everything here imports megatron-core lazily, so ``posttrain`` imports without the ``mcore``
extra. megatron-core's forward pass calls ``torch.cuda.current_device()``: these functions
are meant to run in a process that owns a GPU.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from posttrain.config import PolicyConfig
from posttrain.data.packing import PackedRows, unpack
from posttrain.models.megatron.conversion import GPTShape

Precision = Literal["fp32", "bf16-mixed"]
LayerSpec = Literal["torch", "local"]


def init_parallel_state(init_method: str, rank: int, world_size: int, tensor_parallel: int, seed: int,
                        pipeline_parallel: int = 1) -> None:
    """Join the worker group's ``torch.distributed`` group and set megatron-core's parallel state.

    In a process that already has both (several single-rank workers in one test process),
    the existing ones are reused when their tensor- and pipeline-parallel sizes are the same.

    Args:
        init_method: ``tcp://host:port`` of rank 0 (every rank passes the same).
        rank, world_size: this worker's rank and the group size (= ``tensor_parallel *
            pipeline_parallel``: one model replica, no data parallelism). megatron-core orders
            ranks tensor-parallel fastest: rank = tp_rank + tensor_parallel * pp_rank.
        tensor_parallel: tensor-model-parallel size.
        seed: seeds megatron's model-parallel RNG tracker (dropout inside TP regions);
            dropout is off, but megatron's attention forks the tracker regardless.
        pipeline_parallel: pipeline stages.

    Raises:
        RuntimeError: this process already has megatron parallel state of other sizes.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if dist.is_initialized() and parallel_state.model_parallel_is_initialized():
        current = (parallel_state.get_tensor_model_parallel_world_size(),
                   parallel_state.get_pipeline_model_parallel_world_size())
        if current != (tensor_parallel, pipeline_parallel) or dist.get_world_size() != world_size:
            raise RuntimeError(f"this process already has megatron parallel state (tp, pp) = {current}, "
                               f"asked for {(tensor_parallel, pipeline_parallel)}")
        model_parallel_cuda_manual_seed(seed)
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(0)  # a Ray GPU actor sees only its own GPU, as device 0
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tensor_parallel,
                                             pipeline_model_parallel_size=pipeline_parallel)
    model_parallel_cuda_manual_seed(seed)


def transformer_config(shape: GPTShape, precision: Precision, tensor_parallel: int,
                       pipeline_parallel: int = 1, layer_spec: LayerSpec = "torch") -> Any:
    """megatron-core ``TransformerConfig`` of a Qwen2 model: GQA, RMSNorm, SwiGLU, q/k/v bias
    only, no dropout, and none of the kernels that need Apex or Transformer Engine. With the
    ``torch`` layer spec the SwiGLU is megatron's fused one (``bias_activation_fusion``:
    ``torch.compile``d, its input alone kept for the backward); the ``local`` spec keeps
    megatron's unfused reference. Between pipeline stages the activations travel in the
    parameters' dtype, their shapes sent first (``variable_seq_lengths``: the batches' length
    buckets and last micro-batches differ)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    bf16 = precision == "bf16-mixed"
    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tensor_parallel,
        pipeline_model_parallel_size=pipeline_parallel,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        variable_seq_lengths=pipeline_parallel > 1,
        # megatron's config check ties variable lengths to the MoE all-to-all token dispatcher,
        # also for a dense model (no MoE layer is built: the setting is read by none)
        moe_token_dispatcher_type="alltoall",
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        bf16=bf16,
        # The weights come from the HF checkpoint, but initialisation must stay on: it is what
        # tags each weight as tensor-parallel (`tensor_model_parallel`); without the tag
        # megatron's grad norm drops every rank's shard but rank 0's from the clipping norm.
        perform_initialization=True,
        masked_softmax_fusion=False,
        bias_activation_fusion=layer_spec == "torch",
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def gpt_layer_spec(layer_spec: LayerSpec) -> Any:
    """The transformer-layer ``ModuleSpec`` of ``policy.megatron.layer_spec``.

    ``local``: megatron-core's local spec as it is (its own ``DotProductAttention``: the
    ``[B, heads, S, S]`` scores in memory). ``torch``: the same modules (so the same weights,
    names and tensor-parallel splits) with the core attention replaced by
    :class:`~posttrain.models.megatron.attention.SDPACoreAttention` (torch's fused attention:
    FlashAttention on a GPU in bf16). Transformer Engine's spec is not offered: its fused
    norm-linear modules rename the weights the converter maps, and it cannot be installed
    where this project is tested.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")  # a new spec object on every call
    if layer_spec == "torch":
        from posttrain.models.megatron.attention import SDPACoreAttention

        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec


def build_gpt_model(shape: GPTShape, precision: Precision, tensor_parallel: int,
                    pipeline_parallel: int = 1, layer_spec: LayerSpec = "torch") -> torch.nn.Module:
    """A ``GPTModel`` (the layers of :func:`gpt_layer_spec`) on the current device; wrapped in ``Float16Module``
    for ``bf16-mixed`` (bf16 parameters and compute, fp32 logits out). With
    ``pipeline_parallel`` > 1 it is this rank's stage (megatron's parallel state says which):
    the embedding on the first, the final norm and output layer on the last, the layers of
    :func:`~posttrain.models.megatron.conversion.stage_layers` in between.

    Its forward takes ``(input_ids [B, S], position_ids [B, S], attention_mask=None)`` (None:
    causal) and returns ``[B, S, V_padded]`` logits gathered over tensor-parallel ranks (the
    last stage; an earlier stage returns its ``[S, B, H]`` hidden states).
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    config = transformer_config(shape, precision, tensor_parallel, pipeline_parallel, layer_spec)
    first = pipeline_parallel == 1 or parallel_state.is_pipeline_first_stage()
    last = pipeline_parallel == 1 or parallel_state.is_pipeline_last_stage()
    model = GPTModel(
        config,
        transformer_layer_spec=gpt_layer_spec(layer_spec),
        vocab_size=shape.padded_vocab_size(tensor_parallel),
        max_sequence_length=shape.max_position_embeddings,
        pre_process=first,
        post_process=last,
        parallel_output=False,  # full-vocabulary logits on every rank: logprobs need the whole softmax
        share_embeddings_and_output_weights=shape.tied,
        position_embedding_type="rope",
        rotary_base=int(shape.rope_theta),
    )
    # megatron's parallel linears allocate on the current CUDA device; its torch norms and
    # the rotary buffers on the default device: move everything to the GPU.
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    if config.bf16:
        return Float16Module(config, model)
    return model


def wrap_ddp(model: torch.nn.Module) -> Any:
    """megatron-core ``DistributedDataParallel`` around ``model``: gradients accumulate in fp32
    ``main_grad`` buffers (what megatron's optimizer reads), reduced over data-parallel ranks."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def build_optimizer(model: Any, cfg: PolicyConfig, precision: Precision) -> Any:
    """megatron-core's Adam (decoupled weight decay: AdamW) over ``model``'s parameters, with
    fp32 master weights for ``bf16-mixed``. Clipping is done by the caller (it must see the
    norm before deciding to step). Weight decay skips biases and norm weights (megatron's
    default parameter groups).

    Without Transformer Engine or Apex, megatron-core builds torch's ``AdamW`` with its default
    (``foreach``) kernels; on a GPU it is switched to torch's fused kernel (the same update in
    one launch for all tensors) before its first step, when its state does not exist yet. Its
    gradient norm, clipping and master-weight copies run torch's foreach kernels instead of
    megatron's Python-loop fallbacks (:mod:`~posttrain.models.megatron.multi_tensor`)."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from posttrain.models.megatron import multi_tensor

    multi_tensor.install()

    bf16 = precision == "bf16-mixed"
    config = OptimizerConfig(
        optimizer="adam", lr=cfg.lr, weight_decay=cfg.weight_decay, adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1], adam_eps=1e-8, clip_grad=cfg.max_grad_norm, bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, use_distributed_optimizer=False,
    )
    optimizer = get_megatron_optimizer(config, [model])
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_adam = inner.optimizer
        if type(torch_adam) in (torch.optim.AdamW, torch.optim.Adam) and all(
                p.is_cuda for group in torch_adam.param_groups for p in group["params"]):
            for group in torch_adam.param_groups:
                group["foreach"], group["fused"] = False, True
    return optimizer


def right_padded_logits(model: torch.nn.Module, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, S, V]`` logits of right-padded rows ``input_ids`` (``[B, S]`` int64), cut to the true
    vocabulary ``V`` (megatron pads it). No attention mask: with the padding right of every real
    token, the causal mask alone gives each real token the context HF's padding mask gives it;
    logits at padding positions are never read."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return model(input_ids, positions, None)[..., :vocab_size]


def packed_logits(model: torch.nn.Module, packed: PackedRows, vocab_size: int) -> torch.Tensor:
    """``[B, S, V]`` logits of the right-padded rows that ``packed`` holds (``data.packing.pack_rows``),
    from one forward pass over their real tokens only: megatron-core's packed (``thd``) format,
    whose rotary embedding restarts at each sequence's offset, and the model's core attention
    within each sequence (:class:`~posttrain.models.megatron.attention.SDPACoreAttention`, the
    ``torch`` layer spec). Logits at padding positions are zeros and never read.

    The offsets travel to every layer in megatron's ``PackedSeqParams`` (``cu_seqlens_q/kv``) and, as
    Python ints, in its extra attribute ``seq_bounds`` (no host sync per layer for the attention).
    """
    from megatron.core.packed_seq_params import PackedSeqParams

    from posttrain.models.packed_attention import longest_sequence

    longest = longest_sequence(packed.seq_bounds)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=packed.cu_seq_lens, cu_seqlens_kv=packed.cu_seq_lens,
                             max_seqlen_q=longest, max_seqlen_kv=longest)
    params.seq_bounds = packed.seq_bounds
    logits = model(packed.input_ids, packed.position_ids, None, packed_seq_params=params)  # [1, T, V_padded]
    return unpack(logits[..., :vocab_size], packed)


def unwrap(model: Any) -> Any:
    """The ``GPTModel`` inside DDP / ``Float16Module`` wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """This rank's megatron state dict without megatron's ``_extra_state`` placeholders."""
    return {k: v for k, v in unwrap(model).state_dict().items() if not k.endswith("_extra_state")}


def load_local_state(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Copy ``weights`` (megatron names, this rank's shard) into ``model``'s parameters.

    Raises:
        KeyError: ``weights`` and the model disagree on the set of names.
        ValueError: a shape differs.
    """
    params = local_state(model)
    if set(params) != set(weights):
        raise KeyError(f"megatron weights do not match the model: missing {sorted(set(params) - set(weights))[:3]}, "
                       f"unexpected {sorted(set(weights) - set(params))[:3]}")
    with torch.no_grad():
        for name, target in params.items():
            if target.shape != weights[name].shape:
                raise ValueError(f"{name}: model has {tuple(target.shape)}, weights have {tuple(weights[name].shape)}")
            target.copy_(weights[name])
