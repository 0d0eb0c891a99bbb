"""Losses: the clipped policy-gradient loss of GRPO and the masked NLL of SFT.

Notation: B sequences in a micro-batch, L completion window. Both losses aggregate at the
token level: the sum over unmasked tokens divided by ``num_tokens``, the number of unmasked
tokens in the whole *global* batch (all micro-batches of one optimizer step). Summing the
micro-batch losses then gives exactly the token mean of the global batch, whatever the
micro-batch split (Dr. GRPO, arXiv:2503.20783, Sec. 3.1, on why per-sequence length
normalization biases the gradient).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from posttrain.ops import masked_sum

Metrics = dict[str, float]


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref), always >= 0.

    ``k3 = exp(ref - logp) - (ref - logp) - 1`` (Schulman, "Approximating KL Divergence",
    2020; used by DeepSeekMath, arXiv:2402.03300, Eq. 4). The log-ratio is clamped to
    [-20, 20] so one far-off token cannot overflow to inf.

    Args:
        logprobs, ref_logprobs: ``[B, L]`` logprobs of the same tokens under the current
            and the reference policy.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return log_ratio.exp() - log_ratio - 1.0


@dataclass(frozen=True)
class ClippedPGLoss:
    """GRPO objective (DeepSeekMath, arXiv:2402.03300, Eq. 3) as a loss to minimize.

    Per token: ``ratio = exp(logp - logp_old)``,
    ``pg = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``, ``loss = pg + beta * k3``,
    with ``A`` the sequence's advantage broadcast over its tokens and ``k3`` from
    :func:`kl_k3` against the frozen reference policy.

    Off-policy samples (asynchronous GRPO): either ``old_logprobs`` are the behaviour
    policy's (the engine's, of the weights that sampled), so the ratio is taken against the
    policy that drew the tokens; or, with ``importance_weight_cap`` C, ``old_logprobs`` are
    the trainer's at the start of the step and each token's ``pg`` is multiplied by the
    truncated importance weight ``w = min(exp(logp_old - logp_behaviour), C)`` (no gradient)
    from ``data["behaviour_logprobs"]`` (truncated importance sampling: Espeholt et al., 2018,
    IMPALA, arXiv:1802.01561, Eq. 1; Yao et al., 2025, "Your Efficient RL Framework Secretly
    Brings You Off-Policy RL Training").

    Attributes:
        clip_eps: epsilon of the ratio clip (0.2 in PPO/GRPO).
        kl_coef: beta, weight of the KL penalty (at 0 the caller may leave out the reference
            logprobs: then neither the term nor the ``kl`` metric is computed).
        importance_weight_cap: C of the truncated importance weight (None: no weight).
    """

    # The ratio's denominator: a policy worker scores them itself when the caller sends none.
    uses_old_logprobs: ClassVar[bool] = True
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    importance_weight_cap: float | None = None

    def __call__(
        self, logprobs: torch.Tensor, data: dict[str, torch.Tensor], num_tokens: float
    ) -> tuple[torch.Tensor, Metrics]:
        """Loss of one micro-batch.

        Args:
            logprobs: ``[B, L]`` float32 current-policy logprobs (with grad).
            data: ``completion_mask [B, L]``, ``advantages [B]``, ``old_logprobs [B, L]``
                (the policy that sampled / started this step), ``ref_logprobs [B, L]``
                (required when ``kl_coef`` > 0; without it there is no KL term and no ``kl``
                metric); ``behaviour_logprobs [B, L]`` when ``importance_weight_cap`` is set.
            num_tokens: unmasked tokens in the global batch (> 0).

        Returns:
            (scalar loss, metrics summed over this micro-batch's tokens: ``loss``, ``kl`` (with
            ``ref_logprobs``), ``clip_fraction`` (and ``importance_weight`` with a cap), divided by ``num_tokens``;
            ``probs_ratio_min/max`` as min/max).

        Raises:
            KeyError: ``importance_weight_cap`` is set and ``data`` has no ``behaviour_logprobs``,
                or ``kl_coef`` > 0 and it has no ``ref_logprobs``.
        """
        mask = data["completion_mask"]
        advantages = data["advantages"][:, None]  # [B, 1]
        # Zero the log-ratio under the mask *before* exp: a padding token with a huge
        # log-ratio would give exp -> inf and 0 * inf = NaN in the backward pass.
        log_ratio = torch.where(mask > 0, logprobs - data["old_logprobs"], torch.zeros_like(logprobs))
        ratio = torch.exp(log_ratio)  # [B, L]
        clipped = ratio.clamp(1.0 - self.clip_eps, 1.0 + self.clip_eps)
        pg = -torch.minimum(ratio * advantages, clipped * advantages)
        weight = torch.ones_like(pg)
        if self.importance_weight_cap is not None:  # (the clamp at 20 only keeps exp finite)
            behaviour_gap = torch.where(mask > 0, data["old_logprobs"] - data["behaviour_logprobs"], 0.0)
            weight = behaviour_gap.detach().clamp(max=20.0).exp().clamp(max=self.importance_weight_cap)
            pg = pg * weight
        per_token = pg
        kl = None
        if "ref_logprobs" in data:
            kl = kl_k3(logprobs, torch.where(mask > 0, data["ref_logprobs"], logprobs.detach()))
            per_token = pg + self.kl_coef * kl
        elif self.kl_coef > 0:
            raise KeyError(f"kl_coef={self.kl_coef} needs data['ref_logprobs'] (the reference policy's logprobs)")
        loss = masked_sum(per_token, mask) / num_tokens
        with torch.no_grad():
            is_clipped = ((ratio * advantages) > (clipped * advantages)).float()
            real = mask > 0
            metrics = {
                "loss": loss.item(),
                "clip_fraction": (masked_sum(is_clipped, mask) / num_tokens).item(),
                "probs_ratio_min": ratio[real].min().item() if real.any() else 1.0,
                "probs_ratio_max": ratio[real].max().item() if real.any() else 1.0,
            }
            if kl is not None:
                metrics["kl"] = (masked_sum(kl, mask) / num_tokens).item()
            if self.importance_weight_cap is not None:
                metrics["importance_weight"] = (masked_sum(weight, mask) / num_tokens).item()
        return loss, metrics


@dataclass(frozen=True)
class NLLLoss:
    """Masked negative log-likelihood of the response tokens (SFT)."""

    uses_old_logprobs: ClassVar[bool] = False

    def __call__(
        self, logprobs: torch.Tensor, data: dict[str, torch.Tensor], num_tokens: float
    ) -> tuple[torch.Tensor, Metrics]:
        """Args as :meth:`ClippedPGLoss.__call__` (only ``completion_mask`` is read)."""
        loss = -masked_sum(logprobs, data["completion_mask"]) / num_tokens
        return loss, {"loss": loss.item()}
