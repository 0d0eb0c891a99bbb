"""``policy.precision`` on the Hugging Face policy worker and the engine that follows it,
in-process on CPU (bf16 arithmetic runs on any CPU; the speed is measured on a GPU by
benchmarks/train_step_bench.py).

Each mode is checked by what it must do, not by a flag: the dtype of the weights and of the
optimizer state, whether the forward pass really computed in bf16 (its logprobs differ from
fp32's by bf16 rounding, and by no more), that master weights stay fp32 and move, what a
refit sends (the engine's dtype, a tied embedding once) and what the engine then serves.
"""

from __future__ import annotations

import pytest
import torch
from harness.policy_backends import make_worker

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.refit_probe import PROBE_BOUNDS, RefitProbe
from posttrain.config import (
    GenerationConfig,
    GenerationWorkerConfig,
    PolicyConfig,
    PolicyWorkerConfig,
    RefitProbeConfig,
    engine_dtype,
    resolve_precision,
)
from posttrain.data.batch import make_batch
from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl
from posttrain.models.policy import base_policy_worker


def batch(seed: int = 0, rows: int = 4):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, 17, (5,), generator=g).tolist() for _ in range(rows)]
    comps = [torch.randint(2, 17, (3,), generator=g).tolist() for _ in range(rows)]
    return make_batch(prompts, comps, pad_id=0)


def train_once(worker, seed: int = 0) -> dict:
    b = batch(seed)
    old = worker.get_logprobs(b)
    extra = {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]), "old_logprobs": old}
    return worker.train(b, extra, ClippedPGLoss())


def worker(path: str, precision: str):
    return make_worker("hf", path, lr=1e-2, precision=precision, train_global_batch_size=4, train_micro_batch_size=4)


def test_auto_is_bf16_mixed_on_cuda_and_fp32_on_cpu_and_the_engine_follows() -> None:
    assert resolve_precision("auto", "cpu") == "fp32" and resolve_precision("auto", "cuda") == "bf16-mixed"
    assert resolve_precision("bf16", "cpu") == "bf16"
    for device, dtype in (("cpu", "float32"), ("cuda", "bfloat16")):
        resolved = PolicyWorkerConfig.of(PolicyConfig(), 1.0, device).resolved_precision
        assert engine_dtype(resolved) == dtype
    assert [engine_dtype(p) for p in ("fp32", "bf16", "bf16-mixed")] == ["float32", "bfloat16", "bfloat16"]
    from posttrain.config import ClusterConfig

    assert GenerationWorkerConfig.of(GenerationConfig(), ClusterConfig(), 0, "bf16-mixed").dtype == "bfloat16"
    assert GenerationWorkerConfig.of(GenerationConfig(), ClusterConfig(), 0).dtype == "float32"


def test_bad_precisions_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="precision"):
        PolicyConfig.model_validate({"precision": "fp16"})
    with pytest.raises(ValueError, match="precision=bf16 needs backend=hf"):
        PolicyConfig.model_validate({"backend": "megatron", "precision": "bf16"})


def test_fp32_holds_and_computes_in_float32(tiny_model_path) -> None:
    w = worker(tiny_model_path, "fp32")
    assert {p.dtype for p in w.model.parameters()} == {torch.float32}
    train_once(w)
    assert {s["exp_avg"].dtype for s in w.optimizer.state.values()} == {torch.float32}
    assert {v.dtype for v in w.get_weights().values()} == {torch.float32}


def test_bf16_holds_weights_and_optimizer_state_in_bfloat16_and_learns(tiny_model_path) -> None:
    w = worker(tiny_model_path, "bf16")
    assert {p.dtype for p in w.model.parameters()} == {torch.bfloat16}
    before = {k: v.clone() for k, v in w.model.state_dict().items()}
    metrics = train_once(w)
    assert {s["exp_avg"].dtype for s in w.optimizer.state.values()} == {torch.bfloat16}
    assert max((w.model.state_dict()[k].float() - v.float()).abs().max().item() for k, v in before.items()) > 0
    assert metrics["grad_norm"] > 0 and w.get_logprobs(batch()).dtype == torch.float32
    assert {v.dtype for v in w.get_weights().values()} == {torch.bfloat16}


def test_bf16_mixed_computes_in_bf16_over_fp32_master_weights(tiny_model_path) -> None:
    """The forward pass is bf16 (its logprobs differ from fp32's on the same weights, by bf16
    rounding only), while the weights, their update and AdamW's state stay fp32."""
    mixed, full = worker(tiny_model_path, "bf16-mixed"), worker(tiny_model_path, "fp32")
    assert {p.dtype for p in mixed.model.parameters()} == {torch.float32}
    b = batch()
    gap = (mixed.get_logprobs(b) - full.get_logprobs(b))[b.completion_mask > 0].abs().max().item()
    assert 0 < gap < 0.2, gap  # 0: autocast is off; large: not the same weights
    assert mixed.get_logprobs(b).dtype == torch.float32
    before = {k: v.clone() for k, v in mixed.model.state_dict().items()}
    train_once(mixed)
    assert {s["exp_avg"].dtype for s in mixed.optimizer.state.values()} == {torch.float32}
    # AdamW's first step moves a weight by lr (1e-2) exactly, in fp32; weights held in bf16
    # would move by multiples of their bf16 spacing (2^-8 of their size), not by 1e-2
    moved = [(mixed.model.state_dict()[k] - v).abs().max().item() for k, v in before.items()]
    assert moved and all(abs(m - 1e-2) < 1e-5 for m in moved), moved
    assert {v.dtype for v in mixed.get_weights().values()} == {torch.bfloat16}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-mixed"])
def test_a_refit_sends_the_engine_dtype_and_a_tied_embedding_once(tiny_model_path, precision, monkeypatch) -> None:
    """What ``put_weights`` hands the object store is what the engine loads: its dtype, the
    tied output embedding as the very tensor of the input embedding (pickled once), and after
    loading the engine scores the probe within the precision's bound while a stale engine
    does not."""
    monkeypatch.setattr(base_policy_worker, "object_store_put", lambda value: value)
    w = worker(tiny_model_path, precision)
    engine = HfGenerationWorkerImpl(tiny_model_path, GenerationWorkerConfig(dtype=engine_dtype(precision)))
    assert w.model.config.tie_word_embeddings
    train_once(w)
    probe = RefitProbe(RefitProbeConfig(), _Tokenizer(), 1.0, precision)
    stale = probe.measure(w, engine)["train/refit_logprob_error"]
    [weights], trainer_probe = w.put_weights(probe.batch)
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]  # one storage: pickled once
    assert {v.dtype for v in weights.values()} == {getattr(torch, engine_dtype(precision))}
    engine.update_weights(weights, 1)
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    torch.testing.assert_close(engine.model.model.embed_tokens.weight, weights["model.embed_tokens.weight"],
                               rtol=0, atol=0)
    healthy = probe.measure(w, engine, trainer_probe)["train/refit_logprob_error"]
    assert healthy <= probe.bound < stale, (healthy, probe.bound, stale)


def test_the_probe_bound_follows_the_precision_unless_given() -> None:
    for precision, bound in PROBE_BOUNDS.items():
        assert RefitProbe(RefitProbeConfig(), _Tokenizer(), 1.0, precision).bound == bound
    assert PROBE_BOUNDS["fp32"] < PROBE_BOUNDS["bf16-mixed"]
    assert RefitProbe(RefitProbeConfig(max_logprob_error=0.5), _Tokenizer(), 1.0, "fp32").bound == 0.5
    assert RefitProbe(RefitProbeConfig(max_logprob_error=None), _Tokenizer(), 1.0, "bf16").bound is None


class _Tokenizer:
    """The probe's view of a tokenizer: 17 ids (the tiny arithmetic model's), 0 the pad."""

    all_special_ids = [0, 1]
    pad_token_id = 0

    def __len__(self) -> int:
        return 17
