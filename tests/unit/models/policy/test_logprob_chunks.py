"""``policy.logprob_chunk_tokens``: the HF worker that scores completions from the decoder's hidden
states and the output layer, a few tokens at a time (``ops.chunked_completion_logprobs``), scores
and trains as the worker that builds the full ``[B, S, V]`` logits: the policy's and the reference's
logprobs, a train call's metrics (two optimizer steps: the second sees the first's update) and
the weights after it; plain and LoRA, at temperature 1 and with temperature, top-k and top-p. The
keys it cannot serve, and a model whose logits are not ``hidden @ W.T``, are refused in one line.

Bounds and the worst of 24 cases (seeds 0-5 x plain/LoRA x two sampling settings; AMD EPYC,
2 cores, fp32):

| quantity | bound | worst seen |
|---|---|---|
| logprobs, policy and reference (normwise relative) | 1e-5 | 9.4e-8 |
| train metrics | 1e-5 relative or 1e-6 absolute | KL 4.2e-8 absolute on 5.2e-3; the rest < 1e-6 relative |
| weights after the step, distance / the step's own update | 2e-3 | 1.5e-4 |

The test's own cases also pass on the GPU host's Intel Xeon pinned to 2 threads (Nov 27; not swept
over seeds there).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness.policy_backends import make_worker
from harness.worker_parity import distance, mixed_batch, rel

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import load_config
from posttrain.errors import ConfigError
from posttrain.models.policy.hf_policy_worker import check_plain_output_layer

# one optimizer step over 4 accumulated micro-batches: Adam's first step is lr * sign(g) where a
# gradient is ~0, so rounding flips single weights by 2 lr; several steps compound it (the DP
# parity tests judge a step the same way, data_parallel_jobs.assert_same_step)
GRPO_YAML = str(Path(__file__).resolve().parents[4] / "examples" / "configs" / "grpo_arithmetic.yaml")
POLICY = dict(lr=1e-2, train_global_batch_size=8, train_micro_batch_size=2)


@pytest.mark.parametrize("backend", ["hf", "lora"])
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 6, 0.9)])
def test_a_chunked_worker_scores_and_trains_as_the_full_logits_worker(tiny_model_path, backend, temperature, top_k,
                                                                       top_p) -> None:
    full, chunked = (make_worker(backend, tiny_model_path, temperature, top_k=top_k, top_p=top_p,
                                 logprob_chunk_tokens=n, **POLICY) for n in (0, 3))
    # the key reaches the code: the chunked worker never runs its output layer's forward (it
    # multiplies by its weight a chunk at a time), the full-logits worker does
    head_calls = {"full": 0, "chunked": 0}
    for name, w in (("full", full), ("chunked", chunked)):
        w.model.get_output_embeddings().register_forward_hook(
            lambda *_, key=name: head_calls.__setitem__(key, head_calls[key] + 1))
    batch = mixed_batch(full.model.config.vocab_size)
    mask = batch.completion_mask.bool()
    before = full.get_weights()
    old = full.get_logprobs(batch)
    assert rel(chunked.get_logprobs(batch), old, mask) <= 1e-5
    assert rel(chunked.get_logprobs(batch, reference=True), full.get_logprobs(batch, reference=True), mask) <= 1e-5
    advantages = torch.randn(len(batch), generator=torch.Generator().manual_seed(1))
    extra = {"advantages": advantages, "old_logprobs": old - 0.05, "ref_logprobs": old + 0.1}
    logged_full = full.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
    logged_chunked = chunked.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
    assert logged_full["num_optimizer_steps"] == 1 and logged_full["grad_norm"] > 0
    for key, value in logged_full.items():
        assert logged_chunked[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert head_calls["full"] > 0 and head_calls["chunked"] == 0, head_calls
    want, got = full.get_weights(), chunked.get_weights()
    update = distance(want, before)
    assert update > 0 and distance(got, want) <= 2e-3 * update, distance(got, want) / update


def test_under_bf16_mixed_the_chunks_multiply_in_bf16_as_autocast_does(tiny_model_path) -> None:
    """bf16-mixed: the chunks' matmuls in bf16 (``compute_dtype``), as autocast runs the output
    layer. Before any update the two workers' logprobs are equal (0.0 at seeds 0-3 here); an
    output layer multiplied in fp32 instead is off by 4.0e-4 to 5.1e-4 (normwise), so the bound
    1e-5 tells them apart. After the step, bf16 rounding of the gradients moves them apart:
    metrics <= 2.0e-5 relative (bound 1e-3), weights 3.6e-3 to 5.2e-3 of the update (bound 5e-2).
    AMD EPYC, 2 cores; mutant ``logprob_chunks_in_fp32_under_bf16_mixed``."""
    full, chunked = (make_worker("hf", tiny_model_path, precision="bf16-mixed", logprob_chunk_tokens=n, **POLICY)
                     for n in (0, 3))
    batch = mixed_batch(full.model.config.vocab_size)
    mask = batch.completion_mask.bool()
    before = full.get_weights()
    old = full.get_logprobs(batch)
    assert rel(chunked.get_logprobs(batch), old, mask) <= 1e-5
    extra = {"advantages": torch.randn(len(batch), generator=torch.Generator().manual_seed(1)),
             "old_logprobs": old - 0.05, "ref_logprobs": old + 0.1}
    logged_full = full.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
    logged_chunked = chunked.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
    for key, value in logged_full.items():
        assert logged_chunked[key] == pytest.approx(value, rel=1e-3, abs=1e-5), key
    want = full.get_weights()
    assert distance(chunked.get_weights(), want) <= 5e-2 * distance(want, before)


CHUNKS = ("logprob_chunk_tokens=4", "logprob_chunk_tokens=0")
PACKING = ("sequence_packing=true", "sequence_packing=false")


@pytest.mark.parametrize(("on", "off", "keys", "other"), [
    # the hf backend's chunked logprobs and packing both run the output layer outside the model's forward
    *[(*key, keys, other) for key in (CHUNKS, PACKING) for keys, other in (
        ({"compile": True}, "compile=true"), ({"data_parallel_size": 2}, "data_parallel_size=2"))],
    (*CHUNKS, {"backend": "megatron"}, "backend=megatron"),
    # megatron packs in megatron-core's thd format: the torch layer spec's attention, one pipeline stage
    (*PACKING, {"backend": "megatron", "megatron.layer_spec": "local"}, "megatron.layer_spec=local"),
    (*PACKING, {"backend": "megatron", "megatron.pipeline_model_parallel_size": 2},
     "megatron.pipeline_model_parallel_size=2"),
])
def test_what_output_layer_scoring_cannot_serve_is_refused_in_one_line(keys, other, on, off) -> None:
    """Settings that chunked logprobs or sequence packing cannot serve are refused in one line naming
    both keys; with the key off, nothing is refused."""
    overrides = [f"policy.{key}={str(value).lower()}" for key, value in keys.items()]
    with pytest.raises(ConfigError, match=rf"{on} cannot be combined with {other}") as err:
        load_config(GRPO_YAML, [f"policy.{on}", *overrides], GRPOMasterConfig)
    assert "\n" not in str(err.value)
    load_config(GRPO_YAML, [f"policy.{off}", *overrides], GRPOMasterConfig)  # off: nothing refused


def test_the_megatron_backend_takes_packing_with_its_default_layout() -> None:
    cfg = load_config(GRPO_YAML, ["policy.sequence_packing=true", "policy.backend=megatron"], GRPOMasterConfig)
    assert cfg.policy.sequence_packing and cfg.policy.megatron.layer_spec == "torch"


def test_a_model_whose_logits_are_not_hidden_times_the_output_layer_is_refused(tiny_model_path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    check_plain_output_layer(model)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ConfigError, match=r"needs logits = hidden @ W.T, but Qwen2ForCausalLM has "
                                          r"config.final_logit_softcapping=30.0$"):
        check_plain_output_layer(model)
    model.config.final_logit_softcapping = None
    head = model.get_output_embeddings()
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features))
    with pytest.raises(ConfigError, match=r"has an output layer with a bias$"):
        check_plain_output_layer(model)
