"""Group-relative advantages for GRPO.

Rewards arrive flat, ``[N]`` with ``N = num_prompts * G``, where the G completions of a
prompt are contiguous (``rewards.view(num_prompts, G)`` gives one row per prompt group).
"""

from __future__ import annotations

from typing import Literal

import torch

AdvantageEstimator = Literal["grpo", "dr_grpo"]


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


def compute_group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: AdvantageEstimator = "grpo",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of each completion relative to the other completions of its prompt.

    - ``"grpo"``: ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` — outcome
      supervision of DeepSeekMath (Shao et al., 2024, arXiv:2402.03300, Sec. 4.1.2), with the
      unbiased (Bessel-corrected) standard deviation.
    - ``"dr_grpo"``: ``A_i = r_i - mean(r_group)`` — Dr. GRPO (Liu et al., 2025,
      "Understanding R1-Zero-Like Training", arXiv:2503.20783, Sec. 3.2) drops the std
      division, which over-weights groups whose rewards barely vary.

    Args:
        rewards: ``[N]`` float rewards, groups contiguous.
        group_size: G, completions per prompt.
        estimator: ``"grpo"`` or ``"dr_grpo"``.
        eps: added to the std so a zero-variance group gives 0, not NaN.

    Returns:
        ``[N]`` float32 advantages. A zero-variance group gets all-zero advantages.

    Raises:
        ValueError: rewards not 1-D, N not divisible by G, or an unknown estimator.
    """
    grouped = _grouped(rewards.float(), group_size)  # [P, G]
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if estimator == "dr_grpo":
        return centered.reshape(-1)
    if estimator != "grpo":
        raise ValueError(f"unknown advantage estimator {estimator!r} (use 'grpo' or 'dr_grpo')")
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centered[:, :1])
    return (centered / (std + eps)).reshape(-1)


def nonzero_variance_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which completions belong to a group whose rewards are not all equal.

    A group where every completion got the same reward has zero advantage everywhere and
    contributes no policy-gradient signal; dropping it keeps the token normalizer honest
    (as in DAPO's dynamic sampling, Yu et al., 2025, arXiv:2503.14476, Sec. 3.2).

    Returns:
        ``[N]`` bool, True for completions of groups with non-zero reward variance.
    """
    grouped = _grouped(rewards, group_size)  # [P, G]
    varied = (grouped != grouped[:, :1]).any(dim=1)  # [P]
    return varied.repeat_interleave(group_size)
