"""Causal attention within each of several sequences packed end to end (varlen attention).

A packed row (``posttrain.data.packing``) holds several sequences one after another; each token
may attend only to the earlier tokens of its own sequence. A dense block-diagonal ``[T, T]``
mask computes T^2 scores per head and layer where the sequences need only the sum of their
squared lengths (4.8x fewer for the 16 GSM8K-like rows of ``benchmarks/packing_bench.py``).
:func:`packed_causal_attention` attends by the sequence offsets (``cu_seq_lens``, the varlen
convention) in the ``[T, heads, D]`` (thd) layout that both policy backends hand it
(``models.policy.varlen_attention`` for transformers, ``models.megatron.attention`` for
megatron-core):

  - CUDA, bf16/fp16 (the tensors' dtype, or autocast's: the HF worker's bf16-mixed): torch's own
    flash varlen kernel, ``torch.nn.attention.varlen.varlen_attn`` (causal, GQA; forward and
    backward), one call for the whole packed row;
  - on the CPU: torch's ``scaled_dot_product_attention``, causal, once per distinct sequence
    length over the sequences of that length batched, and the outputs put back in packed order:
    exact, at each sequence's own length squared;
  - on a GPU in fp32 (or a torch without the kernel): one sdpa call with the dense
    block-diagonal causal mask, built on the device from the offsets.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from typing import Any

import torch
import torch.nn.functional as F


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


@functools.lru_cache(maxsize=16)
def longest_sequence(seq_bounds: tuple[int, ...]) -> int:
    """The longest sequence's length, from the offsets ``[0, l_0, l_0 + l_1, ..., T]``: once per
    packed call (every layer asks)."""
    return max(end - start for start, end in itertools.pairwise(seq_bounds))


@functools.cache
def _flash_options(kernel: Any) -> tuple[bool, bool]:
    """What ``kernel``'s signature takes: (a ``window_size``, else ``is_causal``: torch 2.9-2.10;
    ``enable_gqa``)."""
    params = inspect.signature(kernel).parameters
    return "window_size" in params, "enable_gqa" in params


def packed_causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor,
                            seq_bounds: tuple[int, ...], scale: float | None = None,
                            dropout: float = 0.0) -> torch.Tensor:
    """Causal softmax attention (Vaswani et al. 2017, eq. 1) of each packed sequence over itself.

    Args:
        query: ``[T, H_q, D]``; key, value: ``[T, H_kv, D]`` (H_q a multiple of H_kv: grouped-query
            attention), T the packed tokens.
        cu_seq_lens: ``[N + 1]`` int32 sequence offsets into T on the query's device,
            ``[0, l_0, l_0 + l_1, ..., T]``, and
        seq_bounds: the same offsets as Python ints, so that no layer reads a device tensor back
            (a host sync per layer).
        scale: the softmax scale (default ``1 / sqrt(D)``).
        dropout: attention dropout probability (not on the flash path).

    Returns:
        ``[T, H_q, D]`` in the attention's dtype: the inputs', or the autocast dtype under CUDA
        autocast (the rotary embedding of a bf16-mixed transformers model hands over fp32 q and
        k; attention runs in bf16 there, as autocast's own sdpa would).

    Raises:
        ValueError: offsets that do not end at T, or dropout on the flash path.
    """
    tokens = query.shape[0]
    if seq_bounds[-1] != tokens or key.shape[0] != tokens:
        raise ValueError(f"packed attention: offsets ending at {seq_bounds[-1]} for query {tuple(query.shape)} and "
                         f"key {tuple(key.shape)}; both must hold the T = {seq_bounds[-1]} packed tokens")
    groups = query.shape[1] // key.shape[1]
    kernel = _flash_varlen()
    dtype = (torch.get_autocast_dtype("cuda") if query.is_cuda and torch.is_autocast_enabled("cuda")
             else query.dtype)
    if kernel is not None and query.is_cuda and dtype in (torch.bfloat16, torch.float16):
        if dropout:
            raise ValueError(f"packed attention: the flash varlen kernel has no dropout (got {dropout})")
        q, k, v = (t.to(dtype) for t in (query, key, value))
        windowed, gqa = _flash_options(kernel)
        options: dict[str, Any] = {"scale": scale}
        options.update({"window_size": (-1, 0)} if windowed else {"is_causal": True})  # (-1, 0): causal
        if groups > 1 and gqa:
            options["enable_gqa"] = True
        elif groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        longest = longest_sequence(seq_bounds)
        return kernel(q, k, v, cu_seq_lens, cu_seq_lens, longest, longest, **options)  # [T, H_q, D]
    if query.is_cuda:
        # fp32 on a GPU (no flash kernel): one sdpa call with the block-diagonal causal mask, built on
        # the device from the offsets (sequences one by one would cost a kernel launch each per layer)
        positions = torch.arange(tokens, device=query.device)
        sequence = torch.bucketize(positions, cu_seq_lens[1:].to(positions.dtype), right=True)  # [T]
        mask = (sequence[:, None] == sequence[None, :]) & (positions[None, :] <= positions[:, None])
        q, k, v = (t.transpose(0, 1)[None] for t in (query, key, value))  # [1, H, T, D]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale,
                                             enable_gqa=groups > 1)
        return out[0].transpose(0, 1)  # [T, H_q, D]
    # on the CPU, the sequences of each length in one causal sdpa call ([n, H, L, D]): their lengths
    # squared, not T^2, and one call per distinct length, not per sequence (a GRPO batch holds many
    # short sequences of few lengths)
    pieces = []
    length_groups, inverse = _length_groups(seq_bounds)
    for n, length, index in length_groups:
        q, k, v = (t.index_select(0, index).unflatten(0, (n, length)).transpose(1, 2)
                   for t in (query, key, value))  # [n, H, L, D]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scale,
                                             enable_gqa=groups > 1)
        pieces.append(out.transpose(1, 2).flatten(0, 1))  # [n * L, H_q, D]
    # back to packed order: the token at packed position i is row inverse[i] of the concatenation
    return torch.cat(pieces).index_select(0, inverse)  # [T, H_q, D]
