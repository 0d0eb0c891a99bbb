"""Sequence packing: the real tokens of right-padded rows laid end to end in one row, with
position ids that restart at every sequence, and back.

A packed forward pass computes no padding. The attention must stay within each sequence: the
model is given the position ids, no attention mask and no KV cache (``use_cache=False``: with a
cache object transformers does not look for packed sequences), from which Hugging Face
transformers builds a block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``: a new
sequence starts wherever the position id does not grow by one; sdpa, eager and FlexAttention
on any device, flash-attention's varlen kernels where installed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.data.batch import TokenBatch


@dataclass
class PackedRows:
    """Rows of a :class:`TokenBatch` packed into one.

    Attributes:
        input_ids: ``[1, T]`` int64, T the batch's real tokens (``attention_mask.sum()``), row 0's
            first, then row 1's, ...
        position_ids: ``[1, T]`` int64, each token's position in its own row (0 at every start).
        rows, cols: ``[T]`` int64, where each packed token sits in the padded ``[B, S]`` batch.
        shape: ``(B, S)`` of the padded batch.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]


def pack_rows(batch: TokenBatch) -> PackedRows:
    """The real tokens of ``batch`` (``attention_mask`` 1; right padding dropped) in one row.

    Raises:
        ValueError: a row is not right-padded (a real token after padding), which packing would
            silently misplace.
    """
    mask = batch.attention_mask.bool()
    lengths = mask.sum(1)
    if not torch.equal(mask, torch.arange(mask.shape[1], device=mask.device) < lengths[:, None]):
        raise ValueError("pack_rows needs right-padded rows (every real token before the padding)")
    rows, cols = mask.nonzero(as_tuple=True)  # row-major: row 0's tokens first, in order
    return PackedRows(batch.input_ids[rows, cols][None], cols[None], rows, cols, tuple(mask.shape))  # type: ignore[arg-type]


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``[1, T, *F]`` per-token values of a packed forward pass back in the padded layout:
    ``[B, S, *F]``, zeros at the padding (differentiable: gradients flow to ``values``)."""
    out = values.new_zeros((*packed.shape, *values.shape[2:]))
    out[packed.rows, packed.cols] = values[0]
    return out
