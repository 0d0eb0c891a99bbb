"""Variable-length (varlen) attention over packed sequences, for Hugging Face transformers models.

A packed row (``posttrain.data.packing``) holds several sequences end to end; each token may
attend only to the earlier tokens of its own sequence. transformers can express that as a
dense block-diagonal ``[T, T]`` mask, which sdpa computes in full: T^2 scores per head and
layer. This module registers an attention function (:data:`VARLEN`, transformers'
``AttentionInterface``) that attends within each sequence only, from the sequence boundaries
the packed call passes (``cu_seq_lens``), by :func:`~posttrain.models.packed_attention.packed_causal_attention`
(torch's flash varlen kernel on a GPU in bf16 and bf16-mixed; sdpa per sequence length on a CPU;
a block-diagonal mask on a GPU in fp32).

It reads neither the attention mask nor the position ids: a call without ``cu_seq_lens`` (e.g.
padded rows, whose padding mask transformers does not build for an attention function it does
not know) is refused, never run unmasked.
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.models.packed_attention import packed_causal_attention

VARLEN = "posttrain_varlen"  # the attn_implementation name a model is switched to


def register() -> str:
    """Register :func:`varlen_attention_forward` with transformers as :data:`VARLEN` (idempotent);
    returns the name, for ``model.set_attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    return VARLEN


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             cu_seq_lens: torch.Tensor | None = None, seq_bounds: tuple[int, ...] | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed sequence (transformers' attention-function signature).

    Args:
        module: the attention layer (``is_causal`` must not be False).
        query: ``[1, H_q, T, D]``; key, value: ``[1, H_kv, T, D]`` (H_q a multiple of H_kv: GQA).
        attention_mask: ignored (None for a function transformers does not know).
        dropout: attention dropout probability (not on the flash path).
        scaling: the softmax scale (default ``1 / sqrt(D)``).
        cu_seq_lens: ``[N + 1]`` int32 sequence offsets into T on the query's device, and
        seq_bounds: the same offsets as Python ints (``data.packing.PackedRows``): given by the
            packed call so that no layer reads a device tensor back (a host sync per layer).

    Returns:
        ``([1, T, H_q, D]`` in the attention's dtype (the autocast dtype under autocast), ``None``), as
        transformers' attention functions do.

    Raises:
        ValueError: no offsets (a call that is not packed), more than one row, offsets that do not
            end at T, a non-causal layer, or dropout on the flash path.
    """
    if cu_seq_lens is None or seq_bounds is None:
        raise ValueError(f"attn_implementation={VARLEN} attends within packed sequences and needs the packed call's "
                         "cu_seq_lens and seq_bounds (posttrain.data.packing); this call passed none (padded rows?)")
    if query.shape[0] != 1 or seq_bounds[-1] != query.shape[2]:
        raise ValueError(f"{VARLEN}: one packed row of T tokens with offsets ending at T expected, got query "
                         f"{tuple(query.shape)} and offsets ending at {seq_bounds[-1]}")
    if getattr(module, "is_causal", True) is False:
        raise ValueError(f"{VARLEN} is causal; {type(module).__name__} is not")
    out = packed_causal_attention(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                                  cu_seq_lens, seq_bounds, scale=scaling, dropout=dropout)  # [T, H_q, D]
    return out[None].contiguous(), None
