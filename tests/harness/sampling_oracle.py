"""The tokens a top-k-then-top-p sampler keeps, worked out by hand: the oracle the sampling
tests hold ``posttrain.ops.sampling_mask`` and the engines to (``tests/unit/test_ops.py``,
``tests/unit/models/generation/test_sampling_distribution.py``, the vLLM tier)."""

from __future__ import annotations

import torch


def kept_by_hand(scaled: torch.Tensor, top_k: int, top_p: float) -> list[int]:
    """The token ids a top-k-then-top-p sampler keeps at one position, in descending order.

    Walked one token at a time (independent of ``ops.sampling_mask``'s ascending cumulative
    sum): top-k keeps the k largest and any tie with the k-th; top-p then keeps a token while
    the renormalised mass (float64) of the more likely tokens kept before it is still below p,
    so the token that reaches p is kept.

    Args:
        scaled: ``[V]`` logits after the temperature.
        top_k: 0: no top-k (a k over V keeps all).
        top_p: in (0, 1]; 1.0: no top-p.
    """
    order = sorted(range(len(scaled)), key=lambda v: -float(scaled[v]))
    if top_k:
        kth = float(scaled[order[min(top_k, len(order)) - 1]])
        order = [v for v in order if float(scaled[v]) >= kth]
    probs = torch.softmax(scaled[order].double(), -1)
    kept, mass = [], 0.0
    for v, prob in zip(order, probs.tolist(), strict=True):
        if mass < top_p:
            kept.append(v)
        mass += prob
    return kept
