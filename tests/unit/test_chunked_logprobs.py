"""``ops.chunked_completion_logprobs``: logprobs and entropies from hidden states and the output
layer, a chunk of tokens at a time, equal the full-logits path (``compute_logprobs_and_entropy``)
in value and in gradient (w.r.t. the hidden states and the output layer), at every chunk size
(1 token, uneven last chunk, one chunk for all), with temperature, top-k and top-p. fp32 on CPU.

The bound, normwise relative error 1e-5, is the rounding of matmuls of other shapes. Worst of 600
cases (40 seeds x 5 chunk sizes x 3 sampling settings; AMD EPYC, 2 cores): logprobs 1.6e-7,
entropies 2.1e-6, gradients 8.6e-7 (hidden states) and 7.3e-7 (output layer). The GPU host's
Intel Xeon pinned to 2 threads (Nov 27): 1.3e-7, 1.7e-6, 5.7e-7, 9.7e-7 (worst margin 4.8x). Broken chunking
is off by O(1): a chunk scored against another chunk's tokens, or a chunk left out.
(Elementwise bounds do not fit: gradient entries near zero have large relative errors.)"""

from __future__ import annotations

import pytest
import torch

from posttrain.ops import chunked_completion_logprobs, completion_logits, compute_logprobs_and_entropy

B, S, H, V = 3, 9, 16, 50
PROMPT_LENS = torch.tensor([2, 4, 1])
L = 5


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def full_path(hidden_seq, weight, input_ids, temperature, top_k, top_p):
    logits = hidden_seq @ weight.T  # [B, S, V]
    return compute_logprobs_and_entropy(logits, input_ids, PROMPT_LENS, L, temperature, top_k, top_p)


def chunked_path(hidden_seq, weight, input_ids, chunk, temperature, top_k, top_p):
    targets = input_ids.gather(1, (PROMPT_LENS[:, None] + torch.arange(L)).clamp(max=S - 1))
    hidden = completion_logits(hidden_seq, PROMPT_LENS, L)  # [B, L, H]
    return chunked_completion_logprobs(hidden, weight, targets, chunk, temperature, top_k, top_p, with_entropy=True)


@pytest.mark.parametrize("chunk", [1, 4, 7, B * L, 1000])
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8)])
def test_chunks_give_the_full_logits_values_and_gradients(chunk, temperature, top_k, top_p) -> None:
    gen = torch.Generator().manual_seed(chunk)
    hidden_seq = torch.randn(B, S, H, generator=gen) * 2
    weight = torch.randn(V, H, generator=gen)
    input_ids = torch.randint(0, V, (B, S), generator=gen)
    upstream = torch.randn(B, L, generator=gen)  # a loss that weighs every token differently
    results = []
    for path in ("full", "chunked"):
        h, w = hidden_seq.clone().requires_grad_(), weight.clone().requires_grad_()
        logp, entropy = (full_path(h, w, input_ids, temperature, top_k, top_p) if path == "full"
                         else chunked_path(h, w, input_ids, chunk, temperature, top_k, top_p))
        (logp * upstream).sum().backward()
        results.append((logp.detach(), entropy, h.grad, w.grad))
    (logp, entropy, h_grad, w_grad), (c_logp, c_entropy, c_h_grad, c_w_grad) = results
    assert c_logp.dtype == torch.float32 and c_logp.shape == (B, L)
    assert torch.isfinite(logp).all()
    assert rel(c_logp, logp) <= 1e-5 and rel(c_entropy, entropy) <= 1e-5
    assert h_grad.abs().sum() > 0 and w_grad.abs().sum() > 0
    assert rel(c_h_grad, h_grad) <= 1e-5 and rel(c_w_grad, w_grad) <= 1e-5

def test_without_entropy_none_comes_back_and_a_bad_chunk_size_is_one_line() -> None:
    hidden, weight, targets = torch.randn(2, 3, 4), torch.randn(6, 4), torch.zeros(2, 3, dtype=torch.long)
    logp, entropy = chunked_completion_logprobs(hidden, weight, targets, 2)
    assert entropy is None and logp.shape == (2, 3)
    with pytest.raises(ValueError, match=r"^chunk_tokens must be >= 1, got 0$"):
        chunked_completion_logprobs(hidden, weight, targets, 0)
    with pytest.raises(ValueError, match=r"^temperature must be > 0, got 0.0$"):
        chunked_completion_logprobs(hidden, weight, targets, 2, temperature=0.0)
