"""Causal attention without a padding mask, for right-padded rows of Hugging Face transformers models.

A policy worker's rows are right-padded (``data.batch.TokenBatch``): each row's prompt and
completion tokens come first, its padding last. Under causal attention a real token attends only
to the positions before it, and those are all real tokens, so the padding mask changes no output
at a real position; only the padding positions' own outputs differ, and no logprob, loss or
gradient reads them. Yet transformers builds a dense ``[B, 1, S, S]`` mask whenever a row has
padding, and under ``torch.compile`` for every batch (it cannot look at the mask's values while
tracing); sdpa then runs its kernel with an arbitrary mask, which computes every block of the
``S x S`` square, where ``is_causal=True`` lets the flash and cuDNN kernels skip the blocks above
the diagonal, half of them. Measured on an H200 (0.39B Qwen2 shape, 8 x 1024 tokens, bf16-mixed):
the attention's backward kernel took 7.0 ms a step with the mask (compiled) and 3.2 ms causal (eager,
where transformers leaves the mask out of a batch without padding).

This module registers an attention function (:data:`CAUSAL`, transformers' ``AttentionInterface``)
that transformers builds no mask for (it builds masks only for the implementations it knows), and
that runs transformers' own sdpa attention with ``is_causal=True``. It is only correct on
right-padded rows; the policy workers check that of every batch they are given
(:meth:`posttrain.data.batch.TokenBatch.check_right_padded`).
"""

from __future__ import annotations

from typing import Any

import torch

CAUSAL = "posttrain_causal"  # the attn_implementation name a model is switched to


def register() -> str:
    """Register :func:`causal_attention_forward` with transformers as :data:`CAUSAL` (idempotent);
    returns the name, for ``model.set_attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(CAUSAL, causal_attention_forward)
    return CAUSAL


def causal_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal self-attention of whole right-padded rows, no mask (transformers' attention-function signature).

    Args:
        module: the attention layer (its ``is_causal`` must not be False).
        query: ``[B, H_q, S, D]``; key, value: ``[B, H_kv, S, D]`` (H_q a multiple of H_kv: GQA), the
            same S: a forward over whole rows, no KV cache.
        attention_mask: must be None (transformers builds none for this implementation).
        dropout: attention dropout probability (transformers passes 0 outside training).
        scaling: the softmax scale (default ``1 / sqrt(D)``).

    Returns:
        ``([B, S, H_q, D]`` in the attention's dtype, ``None``), as transformers' attention functions do.

    Raises:
        ValueError: a mask was passed, the keys are not the queries' positions (a cached decoding
            step), or the layer is not causal.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None:
        raise ValueError(f"attn_implementation={CAUSAL} attends causally without a mask, but was given a mask of shape "
                         f"{tuple(attention_mask.shape)}")
    if query.shape[2] != key.shape[2]:
        raise ValueError(f"{CAUSAL}: a forward over whole rows expected (as many keys as queries), got "
                         f"{query.shape[2]} queries and {key.shape[2]} keys (a KV cache?)")
    if getattr(module, "is_causal", True) is False:
        raise ValueError(f"{CAUSAL} is causal; {type(module).__name__} is not")
    return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, is_causal=True)
