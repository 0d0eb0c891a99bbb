"""``models.policy.causal_attention``: right-padded rows attended causally without their padding mask
score, train and step exactly as with transformers' masked sdpa, at every real token; what the
function refuses; and the right-padding check every policy worker runs on its batches.

The worker comparisons (``compare``) run two HF workers of the same weights over a padded batch of
mixed lengths, one attending by :data:`CAUSAL` (a GPU worker's default; switched on by hand on the
CPU, whose workers keep the mask) and one by transformers' sdpa with the padding mask: logprobs,
reference logprobs, the metrics of one optimizer step over 4 micro-batches, the weights after it.

Measured Nov 27 (the tiny model; the values are printed, ``pytest -s``):

| machine | precision | logprobs (bound) | metrics (bound) | weights / update (bound) |
|---|---|---|---|---|
| AMD EPYC, 2 cores, seeds 0-2 | fp32 | 0 (1e-5) | 0 (1e-5) | 0 (5e-3) |
| the H100 host's Xeon, pinned to 2 threads, seeds 0-2 | fp32 | 0 | 0 | 0 |
| H200 and H100 (the same values) | fp32, TF32 off | 5.5e-8 (1e-5) | 0 (1e-5) | 3.0e-5 (5e-3) |
| H200 and H100 | bf16-mixed | 0 (2e-2) | 6.9e-5 (2e-2) | 0.041 (0.5) |
| broken (``causal_attention_not_causal`` by hand), H100 | fp32 and bf16-mixed | 0.138 | 3.1e5 | 1.18-1.19 |

On the CPU the two are bit-equal: sdpa's causal path and its masked path round alike here, so
the CPU bounds are rounding room, not a measured spread. The bounds are those of the packing
comparison (``test_sequence_packing.py``), whose kernels differ the same way. Seen failing: the
mutant ``causal_attention_not_causal`` (is_causal=False: real tokens attend to later ones) moves
the logprobs by O(1); ``right_padding_unchecked`` fails the left-padded refusals (both on the CPU);
``causal_attention_off_on_gpu`` fails the GPU test (H100), and the non-causal function applied by
hand on the H100 fails both GPU cases by their bounds (the table's last row: 7x the bf16 bound).
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import make_worker
from harness.worker_parity import distance, mixed_batch, rel
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.batch import make_batch
from posttrain.models.policy import causal_attention
from posttrain.models.policy.causal_attention import CAUSAL, causal_attention_forward

# one optimizer step over 4 micro-batches, as test_sequence_packing.py
POLICY = dict(lr=1e-2, train_global_batch_size=8, train_micro_batch_size=2)


def attend(worker, implementation: str) -> None:
    """Switch ``worker``'s model and its reference copy to ``implementation``."""
    for model in (worker.model, worker.reference):
        if model is not None:
            model.set_attn_implementation(implementation)


def compare(model_path: str, seed: int = 0, **where: str) -> dict[str, object]:
    """A masked-sdpa worker and a causal one of the same weights over one padded batch: the worst
    relative gaps (logprobs, reference logprobs, metrics), the weights' distance over the update,
    and the number of calls of the causal function."""
    masked, causal = (make_worker("hf", model_path, 0.7, top_k=6, top_p=0.9, **POLICY, **where) for _ in range(2))
    attend(masked, "sdpa")
    attend(causal, causal_attention.register())
    calls: list[tuple[int, ...]] = []

    def counted(*args, **kwargs):
        calls.append(tuple(args[1].shape))  # the query
        return causal_attention_forward(*args, **kwargs)

    AttentionInterface.register(CAUSAL, counted)
    try:
        batch = mixed_batch(masked.model.config.vocab_size, seed=seed, prompt_lens=(1, 10), completion_lens=(1, 9))
        assert batch.attention_mask.float().mean() < 0.8  # padding to leave out
        mask = batch.completion_mask.bool()
        before = masked.get_weights()
        old = masked.get_logprobs(batch)
        out: dict[str, object] = {
            "logprobs": rel(causal.get_logprobs(batch), old, mask),
            "reference": rel(causal.get_logprobs(batch, reference=True), masked.get_logprobs(batch, reference=True),
                             mask)}
        g = torch.Generator().manual_seed(seed)
        extra = {"advantages": torch.randn(len(batch), generator=g), "old_logprobs": old - 0.05,
                 "ref_logprobs": old + 0.1}
        want = masked.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
        got = causal.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
        assert want.keys() == got.keys() and want["num_optimizer_steps"] == 1 and want["grad_norm"] > 0
        # relative, with metrics at 0 (e.g. a clip fraction) compared absolutely against 1e-6
        out["metrics"] = max(0.0 if abs(got[k] - v) <= 1e-6 else abs(got[k] - v) / max(abs(v), 1e-6)
                             for k, v in want.items())
        want_w = masked.get_weights()
        out["weights"] = distance(causal.get_weights(), want_w) / distance(want_w, before)
        out["calls"] = calls
        out["rows"] = len(batch)
        return out
    finally:
        AttentionInterface.register(CAUSAL, causal_attention_forward)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_causal_worker_scores_and_trains_as_the_masked_worker(tiny_model_path, seed) -> None:
    got = compare(tiny_model_path, seed)
    print(f"CPU causal vs masked, seed {seed}: " + ", ".join(f"{k} {got[k]:.3g}" for k in ("logprobs", "reference",
                                                                                          "metrics", "weights")))
    # the key reaches the code: every layer of every forward attended by the causal function
    # (2 logprob chunks' worth of rows and 4 train micro-batches: 12 calls of the trained model and
    # the reference copy's, each over every layer)
    layers = AutoConfig.from_pretrained(tiny_model_path).num_hidden_layers
    calls: list[tuple[int, ...]] = got["calls"]  # type: ignore[assignment]
    assert calls and len(calls) % layers == 0 and sum(c[0] for c in calls) >= 3 * got["rows"] * layers, calls
    assert got["logprobs"] <= 1e-5 and got["reference"] <= 1e-5, got
    assert got["metrics"] <= 1e-5, got
    assert got["weights"] <= 5e-3, got


def test_the_padding_mask_is_left_out_and_no_real_token_moves(tiny_model_path) -> None:
    """The model's logits with the causal function equal masked sdpa's at every real token, and
    differ at padding positions (there the mask did make a difference: it was not built)."""
    masked = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    causal = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    causal.set_attn_implementation(causal_attention.register())
    batch = make_batch([[5, 6, 7], [8, 9], [4]], [[10, 11, 12, 13, 14], [15], [3, 3, 3, 3]], pad_id=0)
    real = batch.attention_mask.bool()
    assert not real.all()
    want = masked(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    got = causal(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert (got - want)[real].abs().max() <= 1e-5
    assert (got - want)[~real].abs().max() > 1e-3


class Layer(torch.nn.Module):
    """What the function reads of an attention layer."""

    is_causal = True
    num_key_value_groups = 2  # 4 query heads over 2 key-value heads


def test_the_function_refuses_a_mask_a_kv_cache_and_a_non_causal_layer() -> None:
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"^attn_implementation=posttrain_causal attends causally without a mask, "
                                         r"but was given a mask of shape \(1, 1, 5, 5\)$"):
        causal_attention_forward(Layer(), q, k, k, torch.ones(1, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"got 5 queries and 7 keys \(a KV cache\?\)$"):
        causal_attention_forward(Layer(), q, torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8), None)
    layer = Layer()
    layer.is_causal = False  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"^posttrain_causal is causal; Layer is not$"):
        causal_attention_forward(layer, q, k, k, None)
    out, weights = causal_attention_forward(Layer(), q, k, k, None)
    assert out.shape == (1, 5, 4, 8) and weights is None


def left_padded():
    batch = make_batch([[5, 6], [7, 8, 9]], [[4], [3]], pad_id=0)  # 4 columns, row 0 padded
    batch.attention_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).flip(1)  # row 0 padded on the left
    return batch


def test_a_batch_that_is_not_right_padded_is_refused_naming_the_row() -> None:
    make_batch([[5, 6], [7]], [[4, 4, 4], []], pad_id=0).check_right_padded()  # make_batch's rows pass
    with pytest.raises(ValueError, match=r"^row 0 of the batch is not right-padded: its attention mask is 0 at "
                                         r"position 0, but the row has 2 prompt and 1 completion tokens \(expected: "
                                         r"those first, then only padding\)$"):
        left_padded().check_right_padded()
    gap = make_batch([[5, 6], [7, 8, 9]], [[4, 4], [3]], pad_id=0)
    gap.attention_mask[1, 1] = 0  # a hole inside row 1
    with pytest.raises(ValueError, match=r"^row 1 of the batch is not right-padded: its attention mask is 0 at "
                                         r"position 1,"):
        gap.check_right_padded()
    short = make_batch([[5, 6]], [[4, 4]], pad_id=0)
    short.completion_lens = short.completion_lens + 1  # more tokens than the mask covers
    with pytest.raises(ValueError, match=r"^row 0 of the batch is not right-padded: its attention mask is 0 at "
                                         r"position 4,"):
        short.check_right_padded()


def test_a_worker_refuses_a_left_padded_batch_and_trains_nothing(tiny_model_path) -> None:
    worker = make_worker("hf", tiny_model_path, **POLICY)
    before = worker.get_weights()
    batch = left_padded()
    with pytest.raises(ValueError, match=r"^row 0 of the batch is not right-padded"):
        worker.get_logprobs(batch)
    extra = {"advantages": torch.ones(2), "old_logprobs": torch.zeros(batch.completion_mask.shape),
             "ref_logprobs": torch.zeros(batch.completion_mask.shape)}
    with pytest.raises(ValueError, match=r"^row 0 of the batch is not right-padded"):
        worker.train(batch, extra, ClippedPGLoss())
    after = worker.get_weights()
    assert all(torch.equal(before[k], after[k]) for k in before) and worker.weight_version == 0


def test_a_cpu_worker_keeps_the_masked_sdpa(tiny_model_path) -> None:
    assert make_worker("hf", tiny_model_path).model.config._attn_implementation == "sdpa"


@pytest.mark.gpu(1)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs 1 GPU, found 0")
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_on_a_gpu_a_worker_attends_causally_and_as_the_masked_worker(tiny_model_path, precision) -> None:
    """A GPU worker attends by :data:`CAUSAL` by default; it matches a masked-sdpa worker: fp32
    (TF32 off) within the CPU's bounds, bf16-mixed (flash/cuDNN causal kernels against the masked
    kernel) within bf16 rounding room."""
    assert make_worker("hf", tiny_model_path, device="cuda").model.config._attn_implementation == CAUSAL
    got = compare(tiny_model_path, 0, device="cuda", precision=precision)
    print(f"GPU causal vs masked {precision}: " + ", ".join(f"{k} {got[k]:.3g}" for k in ("logprobs", "reference",
                                                                                          "metrics", "weights")))
    assert got["calls"], "the causal function never ran"
    bounds = {"fp32": {"logprobs": 1e-5, "metrics": 1e-5, "weights": 5e-3},
              "bf16-mixed": {"logprobs": 2e-2, "metrics": 2e-2, "weights": 0.5}}[precision]
    assert got["reference"] <= bounds["logprobs"], got
    for key, bound in bounds.items():
        assert got[key] <= bound, (key, got)
