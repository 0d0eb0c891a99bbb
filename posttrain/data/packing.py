"""Sequence packing: the real tokens of right-padded rows laid end to end in one row, with
position ids that restart at every sequence, and back.

A packed forward pass computes no padding. The attention must stay within each sequence: the
policy worker's model attends by the sequence offsets (``PackedRows.cu_seq_lens``, the varlen
convention; ``models.policy.varlen_attention``), and the position ids restart the rotary
positions of each sequence.
"""

from __future__ import annotations

import itertools
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
        cu_seq_lens: ``[N + 1]`` int32 on the batch's device, the sequences' offsets in the packed
            row, ``[0, l0, l0 + l1, ..., T]`` (N the batch's non-empty rows; flash-attention's
            varlen convention).
        seq_bounds: the same offsets as Python ints (read without a device sync).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]
    cu_seq_lens: torch.Tensor
    seq_bounds: tuple[int, ...]


def pack_rows(batch: TokenBatch) -> PackedRows:
    """The real tokens of ``batch`` (``attention_mask`` 1; right padding dropped) in one row.

    Raises:
        ValueError: a row is not right-padded (:meth:`TokenBatch.check_right_padded`), which
            packing would silently misplace.
    """
    batch.check_right_padded()
    mask = batch.attention_mask.bool()
    lengths = mask.sum(1)
    rows, cols = mask.nonzero(as_tuple=True)  # row-major: row 0's tokens first, in order
    sizes = [n for n in lengths.tolist() if n > 0]  # one read-back per forward, none per layer
    bounds = tuple(itertools.accumulate(sizes, initial=0))
    return PackedRows(batch.input_ids[rows, cols][None], cols[None], rows, cols, tuple(mask.shape),  # type: ignore[arg-type]
                      torch.tensor(bounds, dtype=torch.int32, device=mask.device), bounds)


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``[1, T, *F]`` per-token values of a packed forward pass back in the padded layout:
    ``[B, S, *F]``, zeros at the padding (differentiable: gradients flow to ``values``)."""
    out = values.new_zeros((*packed.shape, *values.shape[2:]))
    out[packed.rows, packed.cols] = values[0]
    return out
