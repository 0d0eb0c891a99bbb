"""``make_batch``: turn token lists into padded tensors with sequence-length bucketing.

Notation: B batch, S padded sequence length, L padded completion length.

Bucketing pads S and L up to the smallest bucket that fits, so the shapes a model sees
come from a small set (fewer recompilations and allocator misses on accelerators, and
batches of similar length waste little padding).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Quarter steps between powers of two (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...): a batch is
# padded by at most a quarter of its longest sequence (GRPO on 2-digit addition: 10 tokens stay
# 10, where half steps padded them to 12 and powers of two to 16; every forward and backward
# pass pays for the padding), while the shapes a model sees stay few (4 per octave; multiples
# of 8 from 32 up).
DEFAULT_SEQ_LEN_BUCKETS = (8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256,
                           320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048)
DEFAULT_COMPLETION_LEN_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


@dataclass
class TokenBatch:
    """Right-padded prompt+completion sequences.

    Attributes:
        input_ids: ``[B, S]`` int64; prompt tokens, completion tokens, then ``pad_id``.
        attention_mask: ``[B, S]`` int64; 1 on prompt and completion tokens, 0 on padding.
        prompt_lens: ``[B]`` int64 number of prompt tokens.
        completion_lens: ``[B]`` int64 number of completion tokens (after any clamping).
        completion_mask: ``[B, L]`` float32; 1 on real completion tokens, 0 on padding.
            This is the loss mask: position ``j`` is token ``prompt_lens[b] + j``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lens: torch.Tensor
    completion_lens: torch.Tensor
    completion_mask: torch.Tensor

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: torch.Tensor | slice) -> TokenBatch:
        """Rows ``index`` of every field (a view for slices)."""
        return TokenBatch(*(getattr(self, f)[index] for f in self.__dataclass_fields__))

    def masked(self) -> TokenBatch:
        """The same rows with no completion token in the loss (``completion_mask`` all 0)."""
        return TokenBatch(self.input_ids, self.attention_mask, self.prompt_lens, self.completion_lens,
                          torch.zeros_like(self.completion_mask))

    def check_right_padded(self) -> None:
        """Check that each row's attention mask covers its prompt and completion tokens and then
        only padding (what :func:`make_batch` builds): the policy workers attend causally without
        a padding mask (``models.policy.causal_attention``, the Megatron backend), which is exact
        only on such rows.

        Raises:
            ValueError: naming the first row whose mask is anything else (left padding, a gap, a
                mask longer or shorter than ``prompt_lens + completion_lens``).
        """
        lengths = self.prompt_lens + self.completion_lens  # [B]
        positions = torch.arange(self.attention_mask.shape[1], device=self.attention_mask.device)
        wrong = (positions < lengths[:, None]) != self.attention_mask.bool()  # [B, S]
        if wrong.any():
            row, position = (int(i) for i in wrong.nonzero()[0])
            raise ValueError(f"row {row} of the batch is not right-padded: its attention mask is "
                             f"{int(self.attention_mask[row, position])} at position {position}, but the row has "
                             f"{int(self.prompt_lens[row])} prompt and {int(self.completion_lens[row])} completion "
                             "tokens (expected: those first, then only padding)")

    def to(self, device: torch.device | str) -> TokenBatch:
        """Every field on ``device`` (no copy when already there)."""
        return TokenBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))


def bucket(length: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= ``length``; the largest bucket if none fits."""
    i = bisect.bisect_left(buckets, length)
    return buckets[min(i, len(buckets) - 1)]


def make_batch(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    seq_len_buckets: Sequence[int] = DEFAULT_SEQ_LEN_BUCKETS,
    completion_len_buckets: Sequence[int] = DEFAULT_COMPLETION_LEN_BUCKETS,
) -> TokenBatch:
    """Pad prompt+completion token lists into a :class:`TokenBatch`.

    S is the smallest sequence bucket that fits the longest prompt+completion, L the
    smallest completion bucket that fits the longest completion (capped at S). A sequence
    longer than the largest sequence bucket keeps its whole prompt and has its completion
    clamped to fit; ``completion_lens`` reports the clamped length.

    Args:
        prompts: B token-id lists, each non-empty.
        completions: B token-id lists (may be empty: that row's mask is all zero).
        pad_id: token id written into padding positions.
        seq_len_buckets, completion_len_buckets: ascending bucket sizes.

    Returns:
        The padded batch (CPU tensors).

    Raises:
        ValueError: mismatched list lengths, an empty batch, an empty prompt, unsorted
            buckets, or a prompt that alone fills the largest sequence bucket.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not prompts:
        raise ValueError("make_batch needs at least one sequence")
    for name, b in (("seq_len_buckets", seq_len_buckets), ("completion_len_buckets", completion_len_buckets)):
        if not b or list(b) != sorted(set(b)) or b[0] < 1:
            raise ValueError(f"{name} must be ascending positive sizes, got {list(b)}")
    max_seq = seq_len_buckets[-1]
    prompt_lens, completion_lens = [], []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if len(p) >= max_seq:
            raise ValueError(f"prompt {i} has {len(p)} tokens; the largest sequence bucket is {max_seq}")
        prompt_lens.append(len(p))
        completion_lens.append(min(len(c), max_seq - len(p)))
    seq_len = bucket(max(p + c for p, c in zip(prompt_lens, completion_lens, strict=True)), seq_len_buckets)
    longest = max(max(completion_lens), 1)
    # never narrower than the longest completion, even past the largest completion bucket
    completion_len = min(max(bucket(longest, completion_len_buckets), longest), seq_len)

    # One tensor from padded Python lists and the masks from lengths: per-row tensor writes
    # cost ~5 ms for a 128-row GRPO batch, a tenth of a tiny model's forward.
    rows = [[*p, *c[:n_c], *([pad_id] * (seq_len - n_p - n_c))]
            for p, c, n_p, n_c in zip(prompts, completions, prompt_lens, completion_lens, strict=True)]
    input_ids = torch.tensor(rows, dtype=torch.long)
    p_lens = torch.tensor(prompt_lens, dtype=torch.long)
    c_lens = torch.tensor(completion_lens, dtype=torch.long)
    attention_mask = (torch.arange(seq_len) < (p_lens + c_lens)[:, None]).long()
    completion_mask = (torch.arange(completion_len) < c_lens[:, None]).float()
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        prompt_lens=p_lens,
        completion_lens=c_lens,
        completion_mask=completion_mask,
    )
