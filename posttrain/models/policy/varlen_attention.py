"""Variable-length (varlen) attention over packed sequences, for Hugging Face transformers models.

A packed row (``posttrain.data.packing``) holds several sequences end to end; each token may
attend only to the earlier tokens of its own sequence. transformers can express that as a
dense block-diagonal ``[T, T]`` mask, which sdpa computes in full: T^2 scores per head and
layer where the sequences need only the sum of their squared lengths (4.8x more for the 16
GSM8K-like rows of ``benchmarks/packing_bench.py``). This module registers an attention
function (:data:`VARLEN`, transformers' ``AttentionInterface``) that attends within each
sequence only, from the sequence boundaries the packed call passes (``cu_seq_lens``):

  - CUDA, bf16/fp16 (the tensors' dtype, or autocast's: bf16-mixed): torch's own flash varlen kernel,
    ``torch.nn.attention.varlen.varlen_attn`` (causal, GQA; forward and backward), one call
    for the whole packed row;
  - on the CPU: torch's ``scaled_dot_product_attention``, causal, once per distinct sequence
    length over the sequences of that length batched, and the outputs put back in packed order:
    exact, at each sequence's own length squared;
  - on a GPU in fp32 (or a torch without the kernel): one sdpa call with the dense
    block-diagonal causal mask, built on the device from the offsets (what transformers does).

Neither path reads the attention mask or the position ids: a call without ``cu_seq_lens``
(e.g. padded rows, whose padding mask transformers does not build for an attention function
it does not know) is refused, never run unmasked.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import Any

import torch
import torch.nn.functional as F

VARLEN = "posttrain_varlen"  # the attn_implementation name a model is switched to


def register() -> str:
    """Register :func:`varlen_attention_forward` with transformers as :data:`VARLEN` (idempotent);
    returns the name, for ``model.set_attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    return VARLEN


def _flash_varlen() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch before 2.9
        return None
    return varlen_attn


@functools.lru_cache(maxsize=16)
def _length_groups(seq_bounds: tuple[int, ...]) -> tuple[list[tuple[int, int, torch.Tensor]], torch.Tensor]:
    """The packed row's sequences grouped by length, once per packed call (every layer asks):
    ``[(n, L, index)]`` with ``index`` the ``[n * L]`` packed positions of the n sequences of length
    L, and the ``[T]`` permutation that puts the groups' concatenation back in packed order."""
    by_length: dict[int, list[int]] = {}
    for start, end in itertools.pairwise(seq_bounds):
        by_length.setdefault(end - start, []).append(start)
    groups = [(len(starts), length, (torch.tensor(starts)[:, None] + torch.arange(length)).flatten())
              for length, starts in by_length.items()]
    return groups, torch.argsort(torch.cat([index for *_, index in groups]))


@functools.cache
def _flash_options(kernel: Any) -> tuple[bool, bool]:
    """What ``kernel``'s signature takes: (a ``window_size``, else ``is_causal``: torch 2.9-2.10;
    ``enable_gqa``)."""
    params = inspect.signature(kernel).parameters
    return "window_size" in params, "enable_gqa" in params


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
    groups = query.shape[1] // key.shape[1]
    kernel = _flash_varlen()
    # under autocast (bf16-mixed) the rotary embedding hands over fp32 q and k: attention runs in the
    # autocast dtype, as autocast's own sdpa would
    dtype = (torch.get_autocast_dtype("cuda") if query.is_cuda and torch.is_autocast_enabled("cuda")
             else query.dtype)
    if kernel is not None and query.is_cuda and dtype in (torch.bfloat16, torch.float16):
        if dropout:
            raise ValueError(f"{VARLEN}: the flash varlen kernel has no dropout (got {dropout})")
        q, k, v = (t[0].transpose(0, 1).to(dtype) for t in (query, key, value))  # [T, H, D]
        windowed, gqa = _flash_options(kernel)
        options: dict[str, Any] = {"scale": scaling}
        options.update({"window_size": (-1, 0)} if windowed else {"is_causal": True})  # (-1, 0): causal
        if groups > 1 and gqa:
            options["enable_gqa"] = True
        elif groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        longest = max(end - start for start, end in itertools.pairwise(seq_bounds))
        out = kernel(q, k, v, cu_seq_lens, cu_seq_lens, longest, longest, **options)  # [T, H_q, D]
        return out[None], None
    if query.is_cuda:
        # fp32 on a GPU (no flash kernel): one sdpa call with the block-diagonal causal mask, built on
        # the device from the offsets (sequences one by one would cost a kernel launch each per layer)
        positions = torch.arange(query.shape[2], device=query.device)
        sequence = torch.bucketize(positions, cu_seq_lens[1:].to(positions.dtype), right=True)  # [T]
        mask = (sequence[:, None] == sequence[None, :]) & (positions[None, :] <= positions[:, None])
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling,
                                             enable_gqa=groups > 1)
        return out.transpose(1, 2).contiguous(), None
    # on the CPU, the sequences of each length in one causal sdpa call ([n, H, L, D]): their lengths
    # squared, not T^2, and one call per distinct length, not per sequence (a GRPO batch holds many
    # short sequences of few lengths)
    pieces = []
    length_groups, inverse = _length_groups(seq_bounds)
    for n, length, index in length_groups:
        q, k, v = (t[0].index_select(1, index).unflatten(1, (n, length)).transpose(0, 1)
                   for t in (query, key, value))  # [n, H, L, D]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scaling,
                                             enable_gqa=groups > 1)
        pieces.append(out.transpose(0, 1).flatten(1, 2))  # [H_q, n * L, D]
    # back to packed order: the token at packed position i is row inverse[i] of the concatenation
    return torch.cat(pieces, dim=1).index_select(1, inverse).transpose(0, 1)[None].contiguous(), None  # [1, T, H_q, D]
