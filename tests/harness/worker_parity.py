"""What the tests that compare two policy workers of the same weights share: a batch of mixed
lengths and the distances they are judged by."""

from __future__ import annotations

import torch

from posttrain.data.batch import TokenBatch, make_batch


def mixed_batch(vocab: int, rows: int = 8, seed: int = 0, prompt_lens: tuple[int, int] = (2, 8),
                completion_lens: tuple[int, int] = (1, 7)) -> TokenBatch:
    """Right-padded rows: prompts of ``prompt_lens`` tokens and completions of ``completion_lens``
    (``[low, high)`` each), ids 2..vocab-1."""
    g = torch.Generator().manual_seed(seed)
    p_lens, c_lens = torch.randint(*prompt_lens, (rows,), generator=g), torch.randint(*completion_lens, (rows,),
                                                                                        generator=g)
    prompts = [torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in p_lens]
    comps = [torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in c_lens]
    return make_batch(prompts, comps, pad_id=0)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The L2 distance between two state dicts of the same names (float64)."""
    return sum(((a[k].double() - b[k].double()) ** 2).sum().item() for k in a) ** 0.5


def grpo_extra(worker, batch: TokenBatch, seed: int = 0) -> dict[str, torch.Tensor]:
    """A GRPO train call's inputs for ``batch``: random advantages, and old and reference logprobs
    near ``worker``'s own (so the ratio is clipped somewhere and the KL term is not zero)."""
    g = torch.Generator().manual_seed(seed)
    old = worker.get_logprobs(batch)
    return {"advantages": torch.randn(len(batch), generator=g), "old_logprobs": old - 0.05,
            "ref_logprobs": old + 0.1}


def max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts of the same names."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:5]
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def rel(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor) -> float:
    """Normwise relative error of ``got`` against ``want`` at ``mask``."""
    return ((got - want)[mask].norm() / want[mask].norm()).item()
