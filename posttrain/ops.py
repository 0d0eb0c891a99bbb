"""Logprob, entropy and masking kernels on plain tensors.

Notation: B batch (sequences), S padded sequence length, L padded completion length,
V vocabulary size. Sequences are right-padded: prompt tokens, then completion tokens,
then padding (see ``posttrain.data.batch.make_batch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def completion_positions(prompt_lens: torch.Tensor, completion_len: int, seq_len: int) -> torch.Tensor:
    """Index of completion token ``j`` of sequence ``b`` in the padded sequence.

    Args:
        prompt_lens: ``[B]`` int64, number of prompt tokens of each sequence.
        completion_len: L, width of the completion window.
        seq_len: S, padded sequence length (indices are clamped to ``S - 1``; the clamped
            positions lie beyond the completion and must be masked by the caller).

    Returns:
        ``[B, L]`` int64 positions ``prompt_lens[b] + j``.
    """
    offsets = torch.arange(completion_len, device=prompt_lens.device)
    return (prompt_lens[:, None] + offsets[None, :]).clamp(max=seq_len - 1)


def completion_logits(logits: torch.Tensor, prompt_lens: torch.Tensor, completion_len: int) -> torch.Tensor:
    """Select the logits that predict each completion token.

    A causal LM's logits at position ``t`` predict token ``t + 1``, so completion token ``j``
    (at position ``prompt_lens[b] + j``) is scored by the logits at ``prompt_lens[b] + j - 1``.

    Args:
        logits: ``[B, S, V]`` model output (or ``[B, S, H]`` final hidden states: any last
            dimension; :func:`chunked_completion_logprobs` selects those).
        prompt_lens: ``[B]`` int64, each >= 1 (a completion needs a token to condition on).
        completion_len: L.

    Returns:
        ``[B, L, V]`` the predicting logits, same dtype as ``logits``.

    Raises:
        ValueError: a prompt length is < 1 or > S - 1.
    """
    seq_len = logits.shape[1]
    if prompt_lens.numel() and (prompt_lens.min() < 1 or prompt_lens.max() > seq_len - 1):
        raise ValueError(f"prompt_lens must lie in [1, {seq_len - 1}], got {prompt_lens.tolist()}")
    positions = completion_positions(prompt_lens, completion_len, seq_len) - 1  # [B, L]
    index = positions[:, :, None].expand(-1, -1, logits.shape[-1])  # [B, L, V]
    return logits.gather(1, index)


def sampling_mask(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The tokens top-k and then top-p sampling keep, as vLLM (``apply_top_k_top_p``) and Hugging
    Face (``TopKLogitsWarper``, ``TopPLogitsWarper``) decide them: top-k keeps every token whose
    logit is at least the k-th largest (ties kept); top-p then sorts the remaining tokens'
    renormalised probabilities in ascending order and drops those whose cumulative sum is
    ``<= 1 - top_p``, keeping at least the most likely token.

    Args:
        logits: ``[..., V]`` the logits the engine samples from, after the temperature
            (top-p depends on it; top-k does not).
        top_k: 0 (or >= V): no top-k.
        top_p: in (0, 1]; 1.0: no top-p.

    Returns:
        ``[..., V]`` bool, True for a kept token; no gradient.
    """
    with torch.no_grad():
        keep = torch.ones_like(logits, dtype=torch.bool)
        if 0 < top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
            keep = logits >= kth
        if top_p < 1.0:
            ranked, order = logits.masked_fill(~keep, float("-inf")).sort(dim=-1)  # ascending
            tail = ranked.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p  # [..., V], sorted order
            tail[..., -1] = False  # the most likely token always stays
            keep = keep & ~torch.zeros_like(tail).scatter(-1, order, tail)
    return keep


def sampling_log_softmax(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                         targets: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probabilities of the distribution an engine samples from: ``logits / T`` restricted to
    :func:`sampling_mask`'s tokens and renormalised over them (``-inf`` elsewhere). Computed in
    float32 whatever the logits' dtype.

    Args:
        logits: ``[..., V]``.
        temperature: > 0.
        top_k, top_p: as :func:`sampling_mask` (0 and 1.0: the whole vocabulary).
        targets: ``[...]`` int64, the tokens that were sampled: each is kept in its own
            position's set even where this side's mask drops it. Two sides rounding a
            boundary token differently (an engine in bf16, the trainer in fp32; the reference
            policy, which never sampled) would otherwise score a sampled token at ``-inf``,
            and its ratio and KL at NaN.

    Returns:
        ``[..., V]`` float32.

    Raises:
        ValueError: temperature <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits.float() / temperature
    if top_k > 0 or top_p < 1.0:
        keep = sampling_mask(scaled, top_k, top_p)
        if targets is not None:
            keep = keep.scatter(-1, targets[..., None], True)
        scaled = scaled.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def compute_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_lens: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probabilities of the completion tokens under the sampling distribution:
    ``logits / temperature``, restricted to the top-k / top-p tokens and renormalised
    (:func:`sampling_log_softmax`; the sampled token is always in its position's set).

    ``out[b, j] = log_softmax(logits[b, p_b + j - 1] / T)[input_ids[b, p_b + j]]`` with
    ``p_b = prompt_lens[b]`` (without top-k / top-p). Computed in float32 (log_softmax of
    large logits stays finite; the logits of a bf16 model are upcast first).

    Args:
        logits: ``[B, S, V]`` model output for ``input_ids``.
        input_ids: ``[B, S]`` int64 token ids (prompt, completion, padding).
        prompt_lens: ``[B]`` int64.
        completion_len: L, the completion window (``TokenBatch.completion_mask.shape[1]``).
        temperature: the sampling temperature the tokens were drawn with (> 0).
        top_k, top_p: the truncation they were drawn with (0 and 1.0: none).

    Returns:
        ``[B, L]`` float32 logprobs; entries past a sequence's completion are meaningless
        and must be masked with the completion mask.

    Raises:
        ValueError: bad ``prompt_lens`` (see :func:`completion_logits`) or temperature <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    selected = completion_logits(logits, prompt_lens, completion_len).float() / temperature
    targets = input_ids.gather(1, completion_positions(prompt_lens, completion_len, input_ids.shape[1]))
    logp = sampling_log_softmax(selected, 1.0, top_k, top_p, targets)  # [B, L, V]
    return logp.gather(-1, targets[:, :, None]).squeeze(-1)


def compute_logprobs_and_entropy(logits: torch.Tensor, input_ids: torch.Tensor, prompt_lens: torch.Tensor,
                                 completion_len: int, temperature: float = 1.0, top_k: int = 0,
                                 top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_logprobs` (with grad) and :func:`compute_entropy` (without) from one
    ``log_softmax`` over the completion positions: a train step needs both, and the
    ``[B, L, V]`` float32 pass is the largest memory-bound op of a step at a large vocabulary.

    Returns:
        ``([B, L] logprobs, [B, L] entropies)``, float32, as the two functions return them.

    Raises:
        ValueError: as :func:`compute_logprobs`.
    """
    targets = input_ids.gather(1, completion_positions(prompt_lens, completion_len, input_ids.shape[1]))
    logp = sampling_log_softmax(completion_logits(logits, prompt_lens, completion_len), temperature, top_k, top_p,
                                targets)
    with torch.no_grad():
        entropy = _entropy(logp)
    return logp.gather(-1, targets[:, :, None]).squeeze(-1), entropy


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log p_v`` over the last dimension of log-probabilities ``logp``;
    ``torch.special.entr`` is 0 at p = 0, so a token outside the top-k / top-p set (``logp =
    -inf``) adds 0, not ``0 * -inf``, with no extra ``[..., V]`` temporary for a clamp."""
    return torch.special.entr(logp.exp()).sum(-1)


def compute_entropy(logits: torch.Tensor, prompt_lens: torch.Tensor, completion_len: int,
                    temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of the sampling distribution at each completion position: ``softmax(logits
    / T)`` over the top-k / top-p tokens (:func:`sampling_log_softmax`), the distribution the
    completion tokens were drawn from and that :func:`compute_logprobs` scores.

    Args:
        logits: ``[B, S, V]``; prompt_lens: ``[B]``; completion_len: L.
        temperature: the sampling temperature (> 0).
        top_k, top_p: the sampling truncation (0 and 1.0: none).

    Returns:
        ``[B, L]`` float32 entropies ``-sum_v p_v log p_v``; entries past a sequence's
        completion are meaningless and must be masked.

    Raises:
        ValueError: bad ``prompt_lens`` (see :func:`completion_logits`) or temperature <= 0.
    """
    return _entropy(sampling_log_softmax(completion_logits(logits, prompt_lens, completion_len), temperature,
                                         top_k, top_p))


class _ChunkedLogprobs(torch.autograd.Function):
    """The chunked logprobs with a backward pass of its own: each chunk's logits are recomputed,
    the gradient ``d logp / d logits = onehot(target) - softmax`` (over the kept tokens; 0 for
    the dropped ones) is formed for that chunk only, and the output layer's gradient is added
    into one ``[V, H]`` buffer in place (``addmm_``): autograd's per-chunk gradients would hold
    a ``[V, H]`` temporary per chunk, as large as the logits at a large vocabulary."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int,
                temperature: float, top_k: int, top_p: float, compute_dtype: torch.dtype, with_entropy: bool
                ) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.save_for_backward(hidden, weight, targets)
        ctx.settings = (chunk_tokens, temperature, top_k, top_p, compute_dtype)
        w = weight.to(compute_dtype)  # once per call (no copy when the dtypes agree)
        logps, entropies = [], []
        for rows in _chunks(len(targets), chunk_tokens):
            logp = _chunk_log_softmax(hidden[rows].to(compute_dtype), w, targets[rows], temperature, top_k, top_p)
            logps.append(logp.gather(-1, targets[rows, None]).squeeze(-1))
            if with_entropy:
                entropies.append(_entropy(logp))
        empty = hidden.new_zeros(0, dtype=torch.float32)
        entropy = torch.cat(entropies) if entropies else empty
        ctx.mark_non_differentiable(entropy)
        return (torch.cat(logps) if logps else empty), entropy

    @staticmethod
    def backward(ctx: Any, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, targets = ctx.saved_tensors
        chunk_tokens, temperature, top_k, top_p, compute_dtype = ctx.settings
        w = weight.to(compute_dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for rows in _chunks(len(targets), chunk_tokens):
            h = hidden[rows].to(compute_dtype)
            probs = _chunk_log_softmax(h, w, targets[rows], temperature, top_k, top_p).exp_()  # [C, V], 0 if dropped
            # d(sum_i g_i logp_i)/d logits_i = g_i (onehot_i - p_i) / T
            grad_logits = probs.neg_().scatter_add_(-1, targets[rows, None], torch.ones_like(probs[:, :1]))
            grad_logits = grad_logits.mul_(grad_logp[rows, None] / temperature).to(compute_dtype)  # [C, V]
            if grad_hidden is not None:
                grad_hidden[rows] = grad_logits @ w
            if grad_weight is not None:  # in place: one [V, H] buffer for every chunk
                grad_weight.addmm_(grad_logits.T.float(), h.float())
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype),
                None, None, None, None, None, None, None)


def _chunks(n: int, size: int) -> Iterator[slice]:
    return (slice(start, start + size) for start in range(0, n, size))


def _chunk_log_softmax(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                       top_k: int, top_p: float) -> torch.Tensor:
    """``[C, V]`` float32 :func:`sampling_log_softmax` of one chunk's logits, ``linear(hidden,
    weight)``: the output layer's own op, so that the chunks round as the model's head does."""
    return sampling_log_softmax(torch.nn.functional.linear(hidden, weight), temperature, top_k, top_p, targets)


def chunked_completion_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                chunk_tokens: int, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                                with_entropy: bool = False, compute_dtype: torch.dtype | None = None
                                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`compute_logprobs` (and :func:`compute_entropy`) from the hidden states that predict
    the completion tokens and the output layer, ``chunk_tokens`` tokens at a time, so that the
    ``[B, L, V]`` logits never exist at once: forward and backward each hold one chunk's
    ``[chunk_tokens, V]`` float32 logits and the output layer's ``[V, H]`` gradient, which the
    chunks add into in place. The backward pass recomputes each chunk's logits (a second
    output-layer matmul per chunk, the price of the memory) and uses the log-softmax gradient
    ``onehot(target) - softmax`` directly.

    ``out[b, j] = log_softmax(hidden[b, j] @ weight.T / T)[targets[b, j]]`` under the sampling
    distribution (:func:`sampling_log_softmax`); the same as :func:`compute_logprobs` on the
    full logits up to the rounding of matmuls of other shapes.

    Args:
        hidden: ``[B, L, H]`` the final hidden states at the positions that predict the
            completion tokens (``completion_logits`` of the decoder's output).
        weight: ``[V, H]`` the output layer (a linear layer without bias or logit scaling).
        targets: ``[B, L]`` int64 completion tokens.
        chunk_tokens: tokens per chunk (> 0).
        temperature, top_k, top_p: the sampling distribution, as :func:`compute_logprobs`.
        with_entropy: also return the ``[B, L]`` entropies (no grad), as :func:`compute_entropy`.
        compute_dtype: the matmuls' dtype (bf16 under bf16-mixed; default the weight's); the
            log-softmax is float32 whatever it is.

    Returns:
        ``([B, L] float32 logprobs, [B, L] float32 entropies or None)``.

    Raises:
        ValueError: ``chunk_tokens`` < 1 or temperature <= 0.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp, entropy = _ChunkedLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1),
                                           chunk_tokens, temperature, top_k, top_p, compute_dtype or weight.dtype,
                                           with_entropy)
    return logp.reshape(targets.shape), entropy.reshape(targets.shape) if with_entropy else None


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (same shape; mask is 0/1, any dtype)."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is 1; 0.0 when the mask is empty."""
    return masked_sum(values, mask) / mask.sum().clamp(min=1)
