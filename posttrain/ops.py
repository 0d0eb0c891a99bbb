"""Logprob, entropy and masking kernels on plain tensors.

Notation: B batch (sequences), S padded sequence length, L padded completion length,
V vocabulary size. Sequences are right-padded: prompt tokens, then completion tokens,
then padding (see ``posttrain.data.batch.make_batch``).
"""

from __future__ import annotations

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
        logits: ``[B, S, V]`` model output.
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


def compute_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_lens: torch.Tensor,
    completion_len: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Per-token log-probabilities of the completion tokens under ``logits / temperature``.

    ``out[b, j] = log_softmax(logits[b, p_b + j - 1] / T)[input_ids[b, p_b + j]]`` with
    ``p_b = prompt_lens[b]``. Computed in float32 (log_softmax of large logits stays finite).

    Args:
        logits: ``[B, S, V]`` model output for ``input_ids``.
        input_ids: ``[B, S]`` int64 token ids (prompt, completion, padding).
        prompt_lens: ``[B]`` int64.
        completion_len: L, the completion window (``TokenBatch.completion_mask.shape[1]``).
        temperature: the sampling temperature the tokens were drawn with (> 0).

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
    return torch.log_softmax(selected, dim=-1).gather(-1, targets[:, :, None]).squeeze(-1)


def compute_logprobs_and_entropy(logits: torch.Tensor, input_ids: torch.Tensor, prompt_lens: torch.Tensor,
                                 completion_len: int, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_logprobs` (with grad) and :func:`compute_entropy` (without) from one
    ``log_softmax`` over the completion positions: a train step needs both, and the
    ``[B, L, V]`` float32 pass is the largest memory-bound op of a step at a large vocabulary.

    Returns:
        ``([B, L] logprobs, [B, L] entropies)``, float32, as the two functions return them.

    Raises:
        ValueError: as :func:`compute_logprobs`.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(completion_logits(logits, prompt_lens, completion_len).float() / temperature, dim=-1)
    targets = input_ids.gather(1, completion_positions(prompt_lens, completion_len, input_ids.shape[1]))
    with torch.no_grad():
        entropy = _entropy(logp)
    return logp.gather(-1, targets[:, :, None]).squeeze(-1), entropy


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    """``-sum_v p_v log p_v`` over the last dimension of log-probabilities ``logp``."""
    return -(logp.exp() * logp).sum(-1)


def compute_entropy(logits: torch.Tensor, prompt_lens: torch.Tensor, completion_len: int,
                    temperature: float = 1.0) -> torch.Tensor:
    """Entropy (nats) of the sampling distribution ``softmax(logits / T)`` at each completion
    position: the distribution the completion tokens were drawn from and that
    :func:`compute_logprobs` scores.

    Args:
        logits: ``[B, S, V]``; prompt_lens: ``[B]``; completion_len: L.
        temperature: the sampling temperature (> 0).

    Returns:
        ``[B, L]`` float32 entropies ``-sum_v p_v log p_v``; entries past a sequence's
        completion are meaningless and must be masked.

    Raises:
        ValueError: bad ``prompt_lens`` (see :func:`completion_logits`) or temperature <= 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logp = torch.log_softmax(completion_logits(logits, prompt_lens, completion_len).float() / temperature, dim=-1)
    return _entropy(logp)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1 (same shape; mask is 0/1, any dtype)."""
    return (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is 1; 0.0 when the mask is empty."""
    return masked_sum(values, mask) / mask.sum().clamp(min=1)
