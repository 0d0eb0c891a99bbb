"""References a generation test compares an engine with: prompts of mixed lengths and Hugging Face
``generate``'s greedy completions (independent of every posttrain engine)."""

from __future__ import annotations

import torch


def mixed_prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """``n`` prompts of 1..12 ordinary tokens (ids 2.. : not pad or EOS)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=g).tolist()
    return [torch.randint(2, vocab, (k,), generator=g).tolist() for k in lengths]


def hf_greedy(model, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    """HF ``generate``'s greedy completions, each prompt alone (no padding), cut after EOS."""
    eos = model.config.eos_token_id
    out = []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=model.device)
        seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             do_sample=False, eos_token_id=eos, pad_token_id=model.config.pad_token_id)
        new = seq[0, len(prompt):].tolist()
        out.append(new[: new.index(eos) + 1] if eos in new else new)
    return out
