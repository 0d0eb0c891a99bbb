"""The matmul precision every process of a run shares, so trainer and engine compute alike."""

from __future__ import annotations

import torch


def use_tf32_for_fp32(device: torch.device | str, enabled: bool) -> None:
    """On CUDA, run float32 matmuls and convolutions on TF32 tensor cores (``enabled``: the
    model is float32 and ``policy.tf32`` is on) or in full fp32; on a CPU nothing. The policy
    worker and the engines all call it with the same answer: a trainer on TF32 and an engine
    on full fp32 disagree by ~1e-3 nats on the weight-sync probe (measured on an H100, 0.39B),
    which checks that both sides compute the same numbers."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
