"""The megatron engine's per-step sampler on its own (CPU; no megatron-core needed): what it may
draw from a row of logits padded past the vocabulary, and the logprob it records.

The GPU tests (``test_megatron_generation.py``) compare whole generations with HF and the
trainer; a real model's padded logits (zero rows) hardly ever win against its real ones, so
the padding case is pinned here, with padded logits that would win.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.models.generation.interfaces import SamplingParams
from posttrain.models.megatron.inference import _StepSampler
from posttrain.ops import sampling_log_softmax

VOCAB, PADDED, ROWS = 17, 128, 64


def padded_logits(seed: int) -> torch.Tensor:
    """``[ROWS, PADDED]``: real logits ~N(0, 1), padded ones at +5 (they would take ~all the mass)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, PADDED, generator=g)
    logits[:, VOCAB:] = 5.0
    return logits


@pytest.mark.parametrize("kw", [dict(temperature=1.0), dict(temperature=0.7, top_k=5),
                                dict(temperature=1.3, top_p=0.8), dict(greedy=True)],
                         ids=["t1", "topk", "topp", "greedy"])
def test_no_padded_id_is_drawn_and_each_logprob_is_the_real_vocabularys(kw) -> None:
    params = SamplingParams(max_new_tokens=4, **kw)
    sampler = _StepSampler(params, VOCAB, torch.Generator().manual_seed(0))
    for step in range(4):
        logits = padded_logits(step)
        tokens = sampler(logits)
        assert tokens.shape == (ROWS,) and int(tokens.max()) < VOCAB
        real = logits[:, :VOCAB]
        if params.greedy:
            expected = torch.log_softmax(real, -1)
            assert torch.equal(tokens, real.argmax(-1))
        else:
            expected = sampling_log_softmax(real, params.temperature, params.top_k, params.top_p)
        torch.testing.assert_close(sampler.logprobs[step], expected.gather(-1, tokens[:, None]).squeeze(-1))
    assert len(sampler.tokens) == len(sampler.logprobs) == 4
