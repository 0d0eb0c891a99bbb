"""Model directories tests build from the tiny model."""

from __future__ import annotations

from pathlib import Path

import torch


def perturbed_copy(path: str, out: Path | str, scale: float = 0.02, seed: int = 1) -> str:
    """A copy of the Hugging Face model at ``path`` in ``out`` with every weight moved by
    ``scale`` times standard normal noise (its tokenizer too). The tiny model's q/k/v biases
    start at zero and its norms at one: a converter that dropped or swapped them would go
    unseen on the original."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return str(out)
