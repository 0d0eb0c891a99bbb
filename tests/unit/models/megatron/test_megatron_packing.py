"""``policy.sequence_packing`` on the Megatron backend (GPU, extra ``mcore``): a worker that runs
each forward pass on the rows' real tokens in one packed row (megatron-core's ``thd`` format,
its rotary embedding restarting per sequence, ``SDPACoreAttention`` attending within each
sequence by its offsets) scores and trains as the HF worker on padded rows: independent code
(model, optimizer, clipping, attention) on the same weights.

    uv run --extra mcore --group test bash tests/run_unit.sh --mcore-only

Rows of mixed lengths (prompts 1-9 tokens, completions 1-8), so most of a padded batch is padding.
fp32, TF32 off: the bounds are ``test_megatron_policy.py``'s for the padded Megatron worker against
the HF one. bf16-mixed: the packing worker against the padded Megatron worker (both bf16). Measured
on one H200 (Nov 27; the test prints them, ``pytest -s``); megatron-core runs on no CPU:

| check | bound | seeds 0-2, worst |
|---|---|---|
| fp32 logprobs, policy and reference (max abs gap) | 1e-5 | 4.8e-7 (21x margin) |
| fp32 train metrics (relative) | 1e-4 | 1.7e-6 (60x) |
| fp32 weights after the step, max abs gap / lr | 0.1 | 0.034 (2.9x) |
| bf16-mixed logprobs (max abs gap) | 2e-2 | 0 |

The bf16-mixed logprobs were bit-equal on the H200 (the same per-row GEMMs, and the flash kernel per
sequence as sdpa's on a padded row); the bound is bf16 rounding room (2^-8 relative on logits of
order 1, a few roundings deep), not a measured spread, for GPUs whose kernels split differently.

Seen failing on the H200: the mutants ``megatron_packed_attention_spans_the_row`` (the core attention
given one sequence spanning the packed row), ``megatron_packing_key_ignored`` (the worker runs padded
rows) and ``flash_varlen_not_causal`` (the bf16 test); the shared leak (``pack_rows`` giving one
offset span for the whole row, applied by hand) fails all four tests.
"""

from __future__ import annotations

import pytest
from harness import worker_parity
from harness.flash_kernel import count_flash_calls
from harness.policy_backends import make_worker
from harness.worker_parity import grpo_extra, max_gap

from posttrain.algorithms.loss_functions import ClippedPGLoss

pytestmark = [pytest.mark.mcore, pytest.mark.gpu(1)]
LR = 1e-3
POLICY = dict(lr=LR, train_global_batch_size=8, train_micro_batch_size=4, max_grad_norm=0.5)
BF16_LOGPROB_BOUND = 2e-2  # the table above


def mixed_batch(vocab: int, seed: int):
    return worker_parity.mixed_batch(vocab, seed=seed, prompt_lens=(1, 10), completion_lens=(1, 9))


@pytest.fixture
def packed_calls(monkeypatch) -> dict[str, list[int]]:
    """Counts, per packed core-attention call, the sequences it attended within, and per forward
    pass of ``models.megatron.model.packed_logits`` its packed tokens (the key reaches the code)."""
    from posttrain.models.megatron import model as mc
    from posttrain.models.megatron.attention import SDPACoreAttention

    calls: dict[str, list[int]] = {"attention": [], "forward": []}
    attend, forward = SDPACoreAttention._packed, mc.packed_logits

    def counted_attend(self, query, key, value, mask, params):
        calls["attention"].append(len(params.seq_bounds) - 1)
        return attend(self, query, key, value, mask, params)

    def counted_forward(model, packed, vocab_size):
        calls["forward"].append(packed.input_ids.shape[1])
        return forward(model, packed, vocab_size)

    monkeypatch.setattr(SDPACoreAttention, "_packed", counted_attend)
    monkeypatch.setattr(mc, "packed_logits", counted_forward)
    return calls


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_packing_megatron_worker_scores_and_trains_as_the_hf_worker(noisy_tiny, packed_calls, seed) -> None:
    hf = make_worker("hf", noisy_tiny, temperature=0.7, **POLICY)
    mc = make_worker("megatron", noisy_tiny, temperature=0.7, sequence_packing=True, **POLICY)
    batch = mixed_batch(hf.model.config.vocab_size, seed)
    mask = batch.completion_mask.bool()
    assert batch.attention_mask.sum() < 0.7 * batch.attention_mask.numel()  # mostly padding
    gaps = {}
    for reference in (False, True):
        gaps[f"logprobs reference={reference}"] = (
            hf.get_logprobs(batch, reference)[mask] - mc.get_logprobs(batch, reference)[mask]).abs().max().item()
    extra = grpo_extra(hf, batch, seed)
    logged_hf, logged_mc = hf.train(batch, extra, ClippedPGLoss(clip_eps=0.2, kl_coef=0.3)), mc.train(
        batch, extra, ClippedPGLoss(clip_eps=0.2, kl_coef=0.3))
    gaps["metrics"] = max(abs(logged_mc[k] - v) / max(abs(v), 1e-2) for k, v in logged_hf.items())
    gaps["weights / lr"] = max_gap(hf.get_weights(), mc.get_weights()) / LR
    print(f"megatron packing, seed {seed}: {gaps}")
    # the key reached the code: every forward pass (2 scoring, 2 micro-batches) packed, and every
    # layer of each attended within the batch's sequences
    layers = hf.model.config.num_hidden_layers
    tokens = int(batch.attention_mask.sum())
    forwards = packed_calls["forward"]  # policy, reference, then the train call's two micro-batches
    assert len(forwards) == 4 and forwards[:2] == [tokens, tokens] and sum(forwards[2:]) == tokens, forwards
    assert len(packed_calls["attention"]) == 4 * layers and min(packed_calls["attention"]) >= 2, packed_calls
    assert gaps["logprobs reference=False"] <= 1e-5 and gaps["logprobs reference=True"] <= 1e-5, gaps
    assert logged_hf.keys() == logged_mc.keys() and logged_hf["grad_norm"] > 0
    for key, value in logged_hf.items():
        assert logged_mc[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert gaps["weights / lr"] <= 0.1, gaps


def test_bf16_mixed_packing_runs_the_flash_kernel_and_scores_as_padded_rows(noisy_tiny, monkeypatch) -> None:
    """bf16-mixed (megatron's bf16 parameters): the packed attention is torch's flash varlen kernel,
    once per layer and forward, and the logprobs are the padded worker's to bf16 rounding."""
    flash = count_flash_calls(monkeypatch)
    padded, packing = (make_worker("megatron", noisy_tiny, precision="bf16-mixed", sequence_packing=on, **POLICY)
                       for on in (False, True))
    layers = padded.model_layout()["num_local_layers"]
    worst = 0.0
    for seed in range(3):
        batch = mixed_batch(padded.shape.vocab_size, seed)
        mask = batch.completion_mask.bool()
        worst = max(worst, (padded.get_logprobs(batch)[mask] - packing.get_logprobs(batch)[mask]).abs().max().item())
    print(f"megatron packing bf16-mixed: worst logprob gap {worst:.3g}")
    assert len(flash) == 3 * layers, flash
    assert worst <= BF16_LOGPROB_BOUND, worst
    extra = grpo_extra(padded, batch, 0)
    logged = packing.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
    assert logged["grad_norm"] > 0 and len(flash) == 5 * layers, (logged, len(flash))  # + 2 micro-batches
