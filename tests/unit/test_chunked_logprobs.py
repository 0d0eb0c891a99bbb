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


def test_the_defaults_are_the_plain_distribution_and_no_token_gives_empty_outputs() -> None:
    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(2, 3, 4, generator=gen), torch.randn(6, 4, generator=gen)
    targets = torch.randint(0, 6, (2, 3), generator=gen)
    plain, _ = chunked_completion_logprobs(hidden, weight, targets, 2, temperature=1.0, top_k=0, top_p=1.0)
    assert torch.equal(chunked_completion_logprobs(hidden, weight, targets, 2)[0], plain)
    logp, entropy = chunked_completion_logprobs(hidden[:, :0], weight, targets[:, :0], 2, with_entropy=True)
    assert logp.shape == (2, 0) and entropy is not None and entropy.shape == (2, 0)
    with pytest.raises(ValueError, match=r"^temperature must be > 0, got 0.0$"):  # no chunk to refuse it later
        chunked_completion_logprobs(hidden[:, :0], weight, targets[:, :0], 2, temperature=0.0)


def test_bf16_compute_scores_and_backpropagates_through_bf16_matmuls() -> None:
    """compute_dtype=bfloat16 (bf16-mixed): the logprobs and the hidden states' gradient are a bf16
    matmul's (measured equal, 0.0, on AMD EPYC), 1.5e-3 and 3.4e-3 from the fp32 ones: the cast is there."""
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 5, 16, generator=gen) * 2, torch.randn(50, 16, generator=gen)
    targets = torch.randint(0, 50, (2, 5), generator=gen)
    upstream = torch.randn(2, 5, generator=gen)

    def scored(path, dtype):  # logprobs and the hidden states' gradient
        h = hidden.clone().requires_grad_()
        logp = path(h, dtype)
        (logp * upstream).sum().backward()
        return logp.detach(), h.grad

    def full(h, dtype):
        logits = (h.to(dtype) @ weight.to(dtype).T).float()
        return torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)

    def chunked(h, dtype):
        return chunked_completion_logprobs(h, weight, targets, 3, compute_dtype=dtype)[0]

    got_logp, got_grad = scored(chunked, torch.bfloat16)
    bf16_logp, bf16_grad = scored(full, torch.bfloat16)
    fp32_logp, fp32_grad = scored(full, torch.float32)
    assert rel(got_logp, bf16_logp) <= 1e-5 and rel(got_grad, bf16_grad) <= 1e-5  # the module's bound
    assert rel(got_logp, fp32_logp) > 1e-4 and rel(got_grad, fp32_grad) > 1e-4
