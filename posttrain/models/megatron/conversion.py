"""Hugging Face Qwen2 <-> megatron-core ``GPTModel`` (local layer spec) weights.

Pure tensor reshuffling, no megatron import: the round trip is tested on CPU.

Layouts (``H`` hidden, ``F`` ffn, ``n_q`` query heads, ``n_kv`` key/value heads ("query
groups"), ``d`` head dim, ``t`` tensor-parallel size, rank ``r``):

- ``linear_qkv`` is ``[(n_q + 2 n_kv) d, H]`` grouped per key/value head: for each group
  ``g`` its ``n_q / n_kv`` query heads, then ``k_g``, then ``v_g`` (megatron-core
  ``Attention.get_query_key_value_tensors`` splits it this way). Rank ``r`` holds groups
  ``[r n_kv / t, (r + 1) n_kv / t)``: a contiguous slice of rows. The bias follows the weight.
- ``linear_fc1`` is SwiGLU's ``[gate; up]`` (``[2F, H]``; megatron chunks the output in two
  and applies the activation to the first half). Rank ``r`` holds ``[gate_r; up_r]``.
- ``linear_proj`` (attention output) and ``linear_fc2`` are row-parallel: rank ``r`` holds
  columns ``r``-th ``1/t`` of the input dimension.
- ``word_embeddings`` (and an untied ``output_layer``) are vocab-parallel: rows, with the
  vocabulary padded to a multiple of ``t`` by zero rows (logits of pad rows are sliced off
  before any softmax, so they never receive probability mass or gradient).
- Norm weights are replicated on every rank.

Pipeline stages (``p`` stages, stage ``s``; :func:`split_pipeline_stage`,
:func:`merge_pipeline_stages`): stage ``s`` holds layers ``[s L / p, (s + 1) L / p)``, numbered
from 0 in its own state dict (``decoder.layers.0`` is global layer ``s L / p``); the embedding
lives on the first stage, the final norm and the output layer on the last. With tied embeddings
and ``p > 1`` the last stage holds its own copy of the embedding as ``output_layer.weight``
(megatron-core keeps the two equal by all-reducing their gradients over the embedding group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.errors import ConfigError

_HF_LAYER = "model.layers.{i}."
_MC_LAYER = "decoder.layers.{i}."


@dataclass(frozen=True)
class GPTShape:
    """The architecture numbers both sides agree on, read from a Hugging Face config.

    Attributes:
        num_layers, hidden_size, ffn_hidden_size: transformer sizes.
        num_attention_heads: query heads n_q; num_query_groups: key/value heads n_kv.
        head_dim: d (``hidden_size / num_attention_heads`` unless the config says otherwise).
        vocab_size: the model's vocabulary V (rows of the embedding).
        tied: input embedding and output layer share one matrix.
        qkv_bias: q/k/v projections have a bias (Qwen2: yes); the output projection never does.
        rms_norm_eps, rope_theta, max_position_embeddings: as in the HF config.
    """

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tied: bool
    qkv_bias: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, config: Any) -> GPTShape:
        """Read a ``Qwen2Config``.

        Raises:
            ConfigError: a model type or feature the converter does not map (another
                architecture, rope scaling, sliding-window attention, an activation other
                than SiLU).
        """
        model_type = getattr(config, "model_type", None)
        if model_type != "qwen2":
            raise ConfigError(f"policy.backend=megatron converts Qwen2 models only, got model_type '{model_type}'")
        rope = dict(getattr(config, "rope_parameters", None) or {})
        theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
        if rope.get("rope_type", "default") != "default" or theta is None:
            raise ConfigError(f"policy.backend=megatron supports plain RoPE only, got rope parameters {rope}")
        if getattr(config, "use_sliding_window", False):
            raise ConfigError("policy.backend=megatron does not support sliding-window attention (use_sliding_window)")
        if config.hidden_act != "silu":
            raise ConfigError(f"policy.backend=megatron supports SwiGLU (hidden_act silu), got '{config.hidden_act}'")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            ffn_hidden_size=config.intermediate_size,
            num_attention_heads=config.num_attention_heads,
            num_query_groups=config.num_key_value_heads,
            head_dim=head_dim,
            vocab_size=config.vocab_size,
            tied=bool(config.tie_word_embeddings),
            qkv_bias=True,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=config.max_position_embeddings,
        )

    def padded_vocab_size(self, tp: int) -> int:
        """V rounded up to a multiple of ``tp`` (megatron's vocab-parallel layers split it evenly)."""
        return math.ceil(self.vocab_size / tp) * tp

    def check_tensor_parallel(self, tp: int) -> None:
        """Raises ``ConfigError`` unless ``tp`` divides the heads, groups and ffn size."""
        for name, value in (("num_attention_heads", self.num_attention_heads),
                            ("num_key_value_heads", self.num_query_groups),
                            ("intermediate_size", self.ffn_hidden_size)):
            if value % tp:
                raise ConfigError(
                    f"policy.megatron.tensor_model_parallel_size={tp} does not divide the model's {name} ({value})"
                )


def _qkv(hf: dict[str, torch.Tensor], prefix: str, kind: str, s: GPTShape) -> torch.Tensor:
    """The full (unsharded) megatron ``linear_qkv`` weight or bias, grouped per key/value head."""
    q, k, v = (hf[f"{prefix}self_attn.{p}_proj.{kind}"] for p in "qkv")
    per_group = s.num_attention_heads // s.num_query_groups
    tail = q.shape[1:]
    q = q.reshape(s.num_query_groups, per_group * s.head_dim, *tail)
    k = k.reshape(s.num_query_groups, s.head_dim, *tail)
    v = v.reshape(s.num_query_groups, s.head_dim, *tail)
    return torch.cat([q, k, v], dim=1).reshape(-1, *tail)


def _split_qkv(qkv: torch.Tensor, s: GPTShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    per_group = s.num_attention_heads // s.num_query_groups
    tail = qkv.shape[1:]
    grouped = qkv.reshape(s.num_query_groups, (per_group + 2) * s.head_dim, *tail)
    q, k, v = grouped.split([per_group * s.head_dim, s.head_dim, s.head_dim], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] == rows:
        return weight
    return torch.cat([weight, weight.new_zeros(rows - weight.shape[0], *weight.shape[1:])])


def hf_to_megatron(hf: dict[str, torch.Tensor], shape: GPTShape, tp_rank: int = 0,
                   tp_size: int = 1) -> dict[str, torch.Tensor]:
    """Tensor-parallel rank ``tp_rank``'s shard of a megatron ``GPTModel`` state dict.

    Args:
        hf: a Hugging Face Qwen2 state dict (``model.layers.<i>....``, ``lm_head.weight``).
        shape: the architecture (:meth:`GPTShape.from_hf_config`).
        tp_rank, tp_size: which shard.

    Returns:
        megatron names -> tensors (views or fresh tensors; dtypes as in ``hf``), without the
        ``_extra_state`` entries.

    Raises:
        KeyError: a weight the architecture needs is missing from ``hf``.
    """
    shape.check_tensor_parallel(tp_size)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=0)[tp_rank]

    def cols(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=1)[tp_rank]

    vocab = shape.padded_vocab_size(tp_size)
    out = {"embedding.word_embeddings.weight": rows(_pad_rows(hf["model.embed_tokens.weight"], vocab)),
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not shape.tied:
        out["output_layer.weight"] = rows(_pad_rows(hf["lm_head.weight"], vocab))
    for i in range(shape.num_layers):
        h, m = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        out[f"{m}input_layernorm.weight"] = hf[f"{h}input_layernorm.weight"]
        out[f"{m}pre_mlp_layernorm.weight"] = hf[f"{h}post_attention_layernorm.weight"]
        out[f"{m}self_attention.linear_qkv.weight"] = rows(_qkv(hf, h, "weight", shape))
        if shape.qkv_bias:
            out[f"{m}self_attention.linear_qkv.bias"] = rows(_qkv(hf, h, "bias", shape))
        out[f"{m}self_attention.linear_proj.weight"] = cols(hf[f"{h}self_attn.o_proj.weight"])
        gate, up = rows(hf[f"{h}mlp.gate_proj.weight"]), rows(hf[f"{h}mlp.up_proj.weight"])
        out[f"{m}mlp.linear_fc1.weight"] = torch.cat([gate, up])
        out[f"{m}mlp.linear_fc2.weight"] = cols(hf[f"{h}mlp.down_proj.weight"])
    return out


def megatron_to_hf(shards: list[dict[str, torch.Tensor]], shape: GPTShape) -> dict[str, torch.Tensor]:
    """Merge the tensor-parallel shards of a ``GPTModel`` state dict into Hugging Face names.

    Args:
        shards: ``shards[r]`` is rank ``r``'s megatron state dict (``_extra_state`` entries
            are ignored); one shard for ``tp_size`` 1.
        shape: the architecture.

    Returns:
        The Hugging Face Qwen2 state dict, with the same keys as ``Qwen2ForCausalLM.state_dict()``
        (``lm_head.weight`` is the embedding itself when tied), vocabulary padding removed.

    Raises:
        KeyError: a weight is missing from a shard.
    """
    def rows(name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in shards], dim=0)

    def cols(name: str) -> torch.Tensor:
        return torch.cat([s[name] for s in shards], dim=1)

    first = shards[0]
    embed = rows("embedding.word_embeddings.weight")[: shape.vocab_size]
    out = {"model.embed_tokens.weight": embed}
    for i in range(shape.num_layers):
        h, m = _HF_LAYER.format(i=i), _MC_LAYER.format(i=i)
        for kind in ("weight", "bias") if shape.qkv_bias else ("weight",):
            # each rank's rows are whole groups: merging ranks' groups gives the full grouped tensor
            q, k, v = _split_qkv(rows(f"{m}self_attention.linear_qkv.{kind}"), shape)
            out[f"{h}self_attn.q_proj.{kind}"] = q
            out[f"{h}self_attn.k_proj.{kind}"] = k
            out[f"{h}self_attn.v_proj.{kind}"] = v
        out[f"{h}self_attn.o_proj.weight"] = cols(f"{m}self_attention.linear_proj.weight")
        halves = [s[f"{m}mlp.linear_fc1.weight"].chunk(2, dim=0) for s in shards]
        out[f"{h}mlp.gate_proj.weight"] = torch.cat([g for g, _ in halves])
        out[f"{h}mlp.up_proj.weight"] = torch.cat([u for _, u in halves])
        out[f"{h}mlp.down_proj.weight"] = cols(f"{m}mlp.linear_fc2.weight")
        out[f"{h}input_layernorm.weight"] = first[f"{m}input_layernorm.weight"]
        out[f"{h}post_attention_layernorm.weight"] = first[f"{m}pre_mlp_layernorm.weight"]
    out["model.norm.weight"] = first["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = embed if shape.tied else rows("output_layer.weight")[: shape.vocab_size]
    return out


def stage_layers(shape: GPTShape, pp_rank: int, pp_size: int) -> range:
    """The global layer indices pipeline stage ``pp_rank`` of ``pp_size`` holds (an even split, as
    megatron-core makes it without per-stage layer counts).

    Raises:
        ConfigError: ``pp_size`` does not divide the model's layers, or ``pp_rank`` is not a stage.
    """
    if pp_size < 1 or shape.num_layers % pp_size:
        raise ConfigError(f"policy.megatron.pipeline_model_parallel_size={pp_size} does not divide the model's "
                          f"num_hidden_layers ({shape.num_layers})")
    if not 0 <= pp_rank < pp_size:
        raise ConfigError(f"pipeline stage {pp_rank} of {pp_size}: expected 0 .. {pp_size - 1}")
    per_stage = shape.num_layers // pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def _renumbered(state: dict[str, torch.Tensor], layers: range, to_local: bool) -> dict[str, torch.Tensor]:
    """The ``decoder.layers.<i>.`` entries of ``layers`` (global indices), keyed local-from-0
    (``to_local``) or global (state keyed local)."""
    out = {}
    for local, i in enumerate(layers):
        src, dst = (i, local) if to_local else (local, i)
        prefix = _MC_LAYER.format(i=src)
        out.update({_MC_LAYER.format(i=dst) + k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    return out


def split_pipeline_stage(state: dict[str, torch.Tensor], shape: GPTShape, pp_rank: int,
                         pp_size: int) -> dict[str, torch.Tensor]:
    """Pipeline stage ``pp_rank``'s part of one tensor-parallel rank's whole-model state dict
    (:func:`hf_to_megatron`'s output): its layers renumbered from 0, the embedding on the first
    stage, the final norm and the output layer (the embedding's copy when tied) on the last.

    Raises:
        ConfigError: see :func:`stage_layers`.
    """
    out = _renumbered(state, stage_layers(shape, pp_rank, pp_size), to_local=True)
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = state["embedding.word_embeddings.weight"]
    if pp_rank == pp_size - 1:
        out["decoder.final_layernorm.weight"] = state["decoder.final_layernorm.weight"]
        if not shape.tied:
            out["output_layer.weight"] = state["output_layer.weight"]
        elif pp_size > 1:
            out["output_layer.weight"] = state["embedding.word_embeddings.weight"].clone()
    return out


def merge_pipeline_stages(stages: list[dict[str, torch.Tensor]], shape: GPTShape) -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's stage state dicts (``stages[s]``, local layer numbers) as the
    whole model's (global numbers): what :func:`megatron_to_hf` merges across ranks.

    Raises:
        ConfigError: the number of stages does not divide the layers.
        ValueError: tied embeddings whose last-stage copy differs from the first stage's embedding
            (the embedding group's gradient all-reduce did not run: the model trains two
            different matrices that the export would hide).
    """
    pp_size = len(stages)
    out: dict[str, torch.Tensor] = {}
    for pp_rank, stage in enumerate(stages):
        out.update(_renumbered(stage, stage_layers(shape, pp_rank, pp_size), to_local=False))
    embedding, last = stages[0]["embedding.word_embeddings.weight"], stages[-1]
    out["embedding.word_embeddings.weight"] = embedding
    out["decoder.final_layernorm.weight"] = last["decoder.final_layernorm.weight"]
    if not shape.tied:
        out["output_layer.weight"] = last["output_layer.weight"]
    elif pp_size > 1 and not torch.equal(last["output_layer.weight"], embedding):
        gap = (last["output_layer.weight"].float() - embedding.float()).abs().max().item()
        raise ValueError(f"tied embeddings: the last pipeline stage's output layer differs from the first stage's "
                         f"embedding by up to {gap:.3g}: their gradients were not all-reduced over the embedding group")
    return out


def read_hf_weights(model_path: str) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict of ``model_path`` (fp32, CPU), tied weights under both names:
    what :func:`hf_to_megatron` converts."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
