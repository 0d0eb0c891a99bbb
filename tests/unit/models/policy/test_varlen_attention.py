"""``models.policy.varlen_attention`` (over ``models.packed_attention``): causal attention within
each packed sequence equals sdpa with transformers' dense block-diagonal causal mask (the
reference), forward and backward, with GQA; a call that is not packed is refused, never run
unmasked. On a GPU the fp32 path (a dense block-diagonal mask built on the device) and the flash
varlen kernel (bf16) equal the CPU's per-sequence path, forward and backward, to fp32 and bf16
rounding.

Bounds (normwise relative), measured Nov 27 (the GPU values are printed by the GPU test, ``pytest -s``):

| check | bound | AMD EPYC, 2 cores (10 seeds) | Xeon pinned to 2 threads (10 seeds) | H200 (seed 0) |
|---|---|---|---|---|
| CPU path vs dense mask, output | 1e-6 | 7.4e-8 (13x margin) | 5.3e-8 (19x) | - |
| CPU path vs dense mask, gradients | 1e-5 | 5.3e-7 (19x) | 5.5e-7 (18x) | - |
| GPU fp32 mask path vs CPU path, output / gradients | 1e-4 | - | - | 8.8e-8 / 6.4e-7 |
| GPU flash (bf16; fp32 under bf16 autocast) vs CPU path, output / gradients | 2e-2 | - | - | 2.5e-3 / 5.0e-3 (4x) |

Both CPU sides are fp32 sdpa in another summation order, so the spread is fp32 rounding (~1e-7),
and the bounds sit one to two orders above it. bf16 rounds at 2^-8 = 3.9e-3 per element at most,
so 2e-2 is 5 of those. Seen failing: the mutant ``varlen_attention_not_causal`` fails the CPU check
(by O(1)); ``flash_varlen_not_causal`` (the kernel's window opened to later tokens) fails the GPU
flash check (H200, by hand and through the mutation runner). The GPU fp32 mask check has not been
seen failing on its own: the leak fails it one level up (the GPU worker tests of
``test_sequence_packing.py``), and no mutant of the mask line was run on a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from harness.flash_kernel import count_flash_calls

from posttrain.models.policy.varlen_attention import VARLEN, varlen_attention_forward

LENGTHS = [5, 1, 9, 3, 5, 1]  # T = 24: single-token sequences, and lengths shared by sequences apart


class Layer(torch.nn.Module):
    """What the function reads of an attention layer."""

    is_causal = True


def qkv(seed: int, heads: int = 4, kv_heads: int = 2, dim: int = 8, device: str = "cpu",
        dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    t = sum(LENGTHS)
    return tuple(torch.randn(1, h, t, dim, generator=g).to(device, dtype).requires_grad_()
                 for h in (heads, kv_heads, kv_heads))


def offsets(device: str = "cpu") -> dict:
    """The packed call's keywords (``data.packing.PackedRows``) for ``LENGTHS``."""
    bounds = (0, *torch.cumsum(torch.tensor(LENGTHS), 0).tolist())
    return {"cu_seq_lens": torch.tensor(bounds, dtype=torch.int32, device=device), "seq_bounds": bounds}


def block_diagonal_causal(device: str = "cpu") -> torch.Tensor:
    """``[T, T]`` bool: token i sees token j iff same sequence and j <= i (transformers' packed mask)."""
    seq = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS)).to(device)
    pos = torch.arange(len(seq), device=device)
    return (seq[:, None] == seq[None, :]) & (pos[None, :] <= pos[:, None])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("seed", range(3))
def test_attention_stays_within_each_sequence_as_the_dense_block_diagonal_mask(seed):
    q, k, v = qkv(seed)
    out, none = varlen_attention_forward(Layer(), q, k, v, None, scaling=0.3, **offsets())
    assert none is None and out.shape == (1, sum(LENGTHS), 4, 8)  # [1, T, H_q, D]
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=block_diagonal_causal(), scale=0.3,
                                          enable_gqa=True).transpose(1, 2)
    assert rel(out, want) <= 1e-6
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for got, ref in zip(grads, want_grads, strict=True):
        assert rel(got, ref) <= 1e-5


def test_a_call_without_sequence_offsets_is_refused_naming_the_implementation():
    q, k, v = qkv(0)
    with pytest.raises(ValueError, match=rf"^attn_implementation={VARLEN} attends within packed sequences and needs "
                                         r"the packed call's cu_seq_lens and seq_bounds"):
        varlen_attention_forward(Layer(), q, k, v, None)
    short = {"cu_seq_lens": torch.tensor([0, 5, 17], dtype=torch.int32), "seq_bounds": (0, 5, 17)}
    with pytest.raises(ValueError, match=r"offsets ending at T expected, got query \(1, 4, 24, 8\) and offsets "
                                         r"ending at 17"):
        varlen_attention_forward(Layer(), q, k, v, None, **short)


@pytest.mark.gpu(1)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs 1 GPU, found 0")
def test_on_a_gpu_the_flash_varlen_kernel_equals_the_per_sequence_path(monkeypatch):
    calls = count_flash_calls(monkeypatch)
    q, k, v = qkv(0, heads=8, kv_heads=2, dim=64, device="cuda")
    scale = 1 / math.sqrt(64)
    # the CPU's per-sequence path, the reference (same values, fp32)
    cpu = [t.detach().cpu().requires_grad_() for t in (q, k, v)]
    want, _ = varlen_attention_forward(Layer(), *cpu, None, scaling=scale, **offsets())
    want_grads = torch.autograd.grad(want.square().sum(), cpu)
    # fp32 on the GPU: the dense block-diagonal mask built on the device
    out32, _ = varlen_attention_forward(Layer(), q, k, v, None, scaling=scale, **offsets("cuda"))
    grads32 = torch.autograd.grad(out32.square().sum(), (q, k, v))
    gaps = {"fp32 output": rel(out32.cpu(), want),
            "fp32 gradients": max(rel(got.cpu(), ref) for got, ref in zip(grads32, want_grads, strict=True))}
    assert not calls and gaps["fp32 output"] <= 1e-4 and gaps["fp32 gradients"] <= 1e-4, gaps
    # the flash varlen kernel: bf16 tensors (precision bf16), and fp32 tensors under bf16 autocast
    # (bf16-mixed: the rotary embedding hands fp32 q and k to the attention)
    for autocast in (False, True):
        inputs = [t.detach().to(torch.float32 if autocast else torch.bfloat16).requires_grad_() for t in (q, k, v)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            out, _ = varlen_attention_forward(Layer(), *inputs, None, scaling=scale, **offsets("cuda"))
        grads = torch.autograd.grad(out.float().square().sum(), inputs)
        name = "bf16 autocast" if autocast else "bf16"
        gaps[f"{name} output"] = rel(out.cpu(), want)
        gaps[f"{name} gradients"] = max(rel(got.cpu(), ref) for got, ref in zip(grads, want_grads, strict=True))
        assert len(calls) == 1 + autocast and out.dtype == torch.bfloat16, (calls, out.dtype)
        assert gaps[f"{name} output"] <= 2e-2 and gaps[f"{name} gradients"] <= 2e-2, gaps
    print(f"varlen GPU gaps: {gaps}")  # the table above (pytest -s)
