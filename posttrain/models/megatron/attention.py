"""Core attention for megatron-core's ``GPTModel`` through torch's fused attention kernels.

megatron-core's local layer spec computes attention with its own ``DotProductAttention``:
the ``[B, heads, S, S]`` scores materialised by ``baddbmm``, a softmax and a second ``bmm``.
Its fused kernels (Transformer Engine's attention, Apex's masked softmax) cannot be installed
on the machines this project runs on. :class:`SDPACoreAttention` keeps megatron's module in
every respect (constructor, parameters: none, the ``[S, B, heads, head_dim]`` layout in and
``[S, B, heads * head_dim]`` out) and replaces the arithmetic with
``torch.nn.functional.scaled_dot_product_attention`` (Vaswani et al. 2017, eq. 1), which runs
FlashAttention-2 (Dao 2023) on a GPU in bf16, the memory-efficient kernel in fp32, and the math
fallback on a CPU: the scores are never stored for the backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from posttrain.models.packed_attention import packed_causal_attention

# What a masked score becomes. Large enough that a real score added to it rounds away (a fully
# masked row then averages its values, as megatron's softmax does), small enough that the CUDA
# kernels' rescaling by log2(e) stays finite: with the dtype's minimum, the memory-efficient kernel
# returned zeros for a fully masked row on an H100 (megatron averages the values there).
MASKED = -1e30


class SDPACoreAttention(DotProductAttention):
    """megatron-core's ``DotProductAttention`` computed by torch's ``scaled_dot_product_attention``.

    Masks keep megatron's meaning: ``attention_mask`` is boolean, broadcastable to
    ``[B, heads, S_q, S_k]``, ``True`` where a query must *not* attend (megatron's inference
    loop passes one); ``None`` means the layer's own mask type, causal for a GPT layer
    (training and the scoring passes). A masked position's score becomes :data:`MASKED`, not
    ``-inf``, so a row with every key masked averages its values as megatron's softmax does
    instead of turning into NaN.

    Raises:
        ValueError (at construction): attention dropout, sliding windows or a softmax other
            than the vanilla one, which this module does not implement.
    """

    def __init__(self, config: Any, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: float | None = None, **kwargs: Any):
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout, **kwargs)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout != 0.0 or config.window_size is not None or config.softmax_type != "vanilla":
            raise ValueError(f"SDPACoreAttention supports no attention dropout (got {dropout}), no sliding window "
                             f"(got {config.window_size}) and the vanilla softmax only (got {config.softmax_type!r})")

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params: Any = None) -> torch.Tensor:
        """Attention of ``query`` ``[S_q, B, heads, D]`` over ``key``/``value`` ``[S_k, B, groups, D]``
        (grouped-query: ``heads`` a multiple of ``groups``); returns ``[S_q, B, heads * D]`` in
        the inputs' dtype.

        Packed sequences (``packed_seq_params`` in megatron's ``thd`` format: ``query`` ``[T, heads, D]``,
        ``key``/``value`` ``[T, groups, D]``, the batch dimension squeezed) attend causally within
        each sequence by its offsets (:func:`~posttrain.models.packed_attention.packed_causal_attention`);
        returns ``[T, heads * D]``.

        Raises:
            ValueError: an attention bias (megatron's TE attention only); packed sequences not in the
                ``thd`` format, or with a mask, or in a layer that is not causal; no mask for a causal
                layer whose query and key lengths differ (a decode step must bring the inference
                loop's mask).
        """
        if attention_bias is not None:
            raise ValueError("SDPACoreAttention takes no attention bias")
        if packed_seq_params is not None:
            return self._packed(query, key, value, attention_mask, packed_seq_params)
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        # [S, B, n, D] -> [B, n, S, D]; keys and values repeated per query group (a copy of the
        # small [S, B, groups, D] tensors, which every sdpa backend accepts, unlike enable_gqa)
        q = query.permute(1, 2, 0, 3)
        k = key.repeat_interleave(groups, dim=2).permute(1, 2, 0, 3) if groups > 1 else key.permute(1, 2, 0, 3)
        v = value.repeat_interleave(groups, dim=2).permute(1, 2, 0, 3) if groups > 1 else value.permute(1, 2, 0, 3)
        mask, causal = None, False
        if attention_mask is not None:
            mask = torch.zeros(attention_mask.shape, dtype=q.dtype, device=q.device)
            mask.masked_fill_(attention_mask, MASKED)
        elif self.attn_mask_type == AttnMaskType.causal and q.shape[2] > 1:
            if q.shape[2] != k.shape[2]:
                raise ValueError(f"a causal layer without a mask needs equal query and key lengths, got "
                                 f"{q.shape[2]} and {k.shape[2]}")
            causal = True
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.softmax_scale)
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], self.hidden_size_per_partition)

    def _packed(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, params: Any) -> torch.Tensor:
        """The ``thd`` branch of :meth:`forward`."""
        if params.qkv_format != "thd" or attention_mask is not None or self.attn_mask_type != AttnMaskType.causal:
            raise ValueError(f"SDPACoreAttention packs causal self-attention in the thd format without a mask, got "
                             f"qkv_format={params.qkv_format!r}, a mask: {attention_mask is not None}, "
                             f"attn_mask_type={self.attn_mask_type.name}")
        # the offsets as Python ints, set by models.megatron.model.packed_logits; read back otherwise
        bounds = getattr(params, "seq_bounds", None) or tuple(params.cu_seqlens_q.tolist())
        out = packed_causal_attention(query, key, value, params.cu_seqlens_q, bounds, scale=self.softmax_scale)
        return out.reshape(query.shape[0], self.hidden_size_per_partition)  # [T, heads * D]
