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
from posttrain.distributed.transport import InProcessTransport, use_transport
from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl
from posttrain.weight_sync.probe import PROBE_BOUNDS, RefitProbe


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
def test_a_refit_sends_the_engine_dtype_and_a_tied_embedding_once(tiny_model_path, precision) -> None:
    """What ``put_weights`` hands the object store is what the engine loads: its dtype, the
    tied output embedding as the very tensor of the input embedding (pickled once), and after
    loading the engine scores the probe within the precision's bound while a stale engine
    does not. In-process (no object store): the put hands back the weights themselves."""
    with use_transport(InProcessTransport()):
        _check_refit_dtype_and_tied_embedding(tiny_model_path, precision)


def _check_refit_dtype_and_tied_embedding(tiny_model_path: str, precision: str) -> None:
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


# --- precision contracts (issue 31, class 4) ----------------------------------------------------


class RecordingLoss:
    """``ClippedPGLoss`` that records what each micro-batch's loss got: the logprobs and ``data``."""

    uses_old_logprobs = True

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []

    def __call__(self, logprobs, data, num_tokens):
        self.calls.append((logprobs.detach().clone(), {k: v.detach().clone() for k, v in data.items()}))
        return ClippedPGLoss()(logprobs, data, num_tokens)


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_the_loss_math_runs_in_fp32_on_a_bf16_models_logits(tiny_model_path, precision) -> None:
    """Log-softmax, logprobs, the ratio and the entropy are float32 whatever the model computes
    in: the numbers of float32 math on the model's own bf16 logits (bf16 math is ~1e-2 off), in
    the train step and in ``get_logprobs``; a one-step call's ratio is exactly 1 (its denominator
    the same float32 numbers, not a bf16 copy)."""
    w = make_worker("hf", tiny_model_path, temperature=0.7, lr=1e-2, precision=precision,
                    train_global_batch_size=4, train_micro_batch_size=4)
    b = batch()
    with torch.no_grad():
        logits = w._forward_logits(w.model, b)  # [B, S, V], the model's own
    assert logits.dtype == torch.bfloat16
    mask = b.completion_mask.bool()
    expected = torch.zeros(b.completion_mask.shape, dtype=torch.float64)
    entropy = 0.0
    for i in range(len(b)):
        start = int(b.prompt_lens[i])
        for j in range(int(b.completion_lens[i])):
            logp = torch.log_softmax(logits[i, start + j - 1].double() / 0.7, -1)
            expected[i, j] = logp[b.input_ids[i, start + j]]
            entropy -= float((logp.exp() * logp).sum())
    scored = w.get_logprobs(b)
    assert scored.dtype == torch.float32
    torch.testing.assert_close(scored[mask].double(), expected[mask], rtol=0, atol=1e-5)
    loss = RecordingLoss()
    metrics = w.train(b, {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}, loss)
    [(logprobs, data)] = loss.calls
    assert logprobs.dtype == data["old_logprobs"].dtype == w.old_logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs[mask].double(), expected[mask], rtol=0, atol=1e-5)
    assert metrics["probs_ratio_min"] == metrics["probs_ratio_max"] == 1.0
    assert metrics["entropy"] == pytest.approx(entropy / mask.sum().item(), rel=1e-5)


# The derivation of ``refit_probe.PROBE_BOUNDS`` (its comment, docs/testing.md "Precision"),
# reproduced on a model whose logits are scaled up 25x (the final norm's weight): the probe's
# random tokens then sit at |logp| ~16 nats, inside the 10-20 of the arithmetic warm start it was
# measured on. A healthy refit must stay at or under the worst healthy error the derivation
# measured (fp32: same weights, same arithmetic, 1e-6; bf16: the engine's bf16 rounding, 0.095),
# the bound must keep 2x over that, and an engine one AdamW step behind must fail it (bf16-mixed:
# lr 3e-5 leaves 0.48-0.66, the 0.61-0.69 measured after one step on the warm start; fp32: even
# a step of lr 1e-6, 0.017).
LOGIT_SCALE = 25.0
HEALTHY_MAX = {"fp32": 1e-6, "bf16-mixed": 0.095}
STALE_LR = {"fp32": 1e-6, "bf16-mixed": 3e-5}


@pytest.fixture(scope="module")
def peaked_model_path(tiny_model_path, tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(LOGIT_SCALE)
    where = tmp_path_factory.mktemp("peaked")
    model.save_pretrained(where)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(where)
    return str(where)


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_each_precisions_probe_bound_sits_where_its_derivation_puts_it(peaked_model_path, precision) -> None:
    w = make_worker("hf", peaked_model_path, lr=STALE_LR[precision], precision=precision,
                    train_global_batch_size=8, train_micro_batch_size=8)
    engine = HfGenerationWorkerImpl(peaked_model_path, GenerationWorkerConfig(dtype=engine_dtype(precision)))
    probes = [RefitProbe(RefitProbeConfig(seed=seed), _Tokenizer(), 1.0, precision) for seed in range(5)]
    assert min(-w.get_logprobs(p.batch, whole_vocab=True).mean().item() for p in probes) > 10  # the regime
    healthy = max(p.measure(w, engine)["train/refit_logprob_error"] for p in probes)
    g = torch.Generator().manual_seed(0)
    rows = make_batch([torch.randint(2, 17, (6,), generator=g).tolist() for _ in range(8)],
                      [torch.randint(2, 17, (4,), generator=g).tolist() for _ in range(8)], pad_id=0)
    w.train(rows, {"advantages": torch.tensor([1.0, -1.0] * 4)}, ClippedPGLoss())  # no refit after it
    stale = min(p.measure(w, engine)["train/refit_logprob_error"] for p in probes)
    bound = PROBE_BOUNDS[precision]
    assert healthy <= HEALTHY_MAX[precision], (healthy, HEALTHY_MAX[precision])
    assert 2 * HEALTHY_MAX[precision] <= bound < stale, (HEALTHY_MAX[precision], bound, stale)
    assert PROBE_BOUNDS["bf16"] == PROBE_BOUNDS["bf16-mixed"]  # one engine dtype, one derivation


@pytest.mark.parametrize("enabled", [True, False])
def test_tf32_is_switched_on_and_off_as_asked(enabled) -> None:
    """On CUDA the switch sets PyTorch's TF32 flags both ways (read back here without a GPU:
    they are process settings); on a CPU it leaves them alone."""
    from posttrain.models.precision import use_tf32_for_fp32

    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        use_tf32_for_fp32("cuda", not enabled)
        use_tf32_for_fp32("cuda", enabled)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (enabled, enabled)
        use_tf32_for_fp32("cpu", not enabled)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (enabled, enabled)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


_GPUS = torch.cuda.device_count()


@pytest.mark.gpu(1)
@pytest.mark.skipif(_GPUS < 1, reason=f"needs 1 GPU, found {_GPUS}")
def test_policy_tf32_is_honoured_both_ways_on_a_gpu(tiny_model_path) -> None:
    """fp32 on a GPU: with tf32 on, the policy worker's and the engine's matmuls run on TF32
    (a product is ~1e-2 off float64, the trainer's logprobs move off a CPU's full-fp32 values by
    more than 1e-5); with it off they are full fp32, and a worker built after one that asked for
    the other setting switches it back. The trainer and the engine agree on the probe either way."""
    a, m = torch.randn(512, 512, dtype=torch.float64), torch.randn(512, 512, dtype=torch.float64)
    exact = a @ m
    b = batch()
    reference = make_worker("hf", tiny_model_path, precision="fp32").get_logprobs(b)  # CPU, full fp32
    mask = b.completion_mask.bool()
    for enabled in (True, False, True):
        w = make_worker("hf", tiny_model_path, precision="fp32", device="cuda", tf32=enabled)
        product_error = ((a.float().cuda() @ m.float().cuda()).double().cpu() - exact).abs().max().item()
        logprob_gap = (w.get_logprobs(b) - reference)[mask].abs().max().item()
        # TF32 keeps 10 mantissa bits: a 512-term product is ~1e-2 off float64; full fp32 ~1e-5
        assert (product_error > 1e-3) is enabled, (enabled, product_error)
        assert (logprob_gap > 1e-5) is enabled, (enabled, logprob_gap)
        engine = HfGenerationWorkerImpl(tiny_model_path, GenerationWorkerConfig(device="cuda", tf32=not enabled))
        assert torch.backends.cuda.matmul.allow_tf32 is (not enabled)  # the engine's own setting, as asked
        engine = HfGenerationWorkerImpl(tiny_model_path, GenerationWorkerConfig(device="cuda", tf32=enabled))
        assert torch.backends.cuda.matmul.allow_tf32 is enabled
        probe = RefitProbe(RefitProbeConfig(), _Tokenizer(), 1.0, "fp32")
        assert probe.measure(w, engine)["train/refit_logprob_error"] <= PROBE_BOUNDS["fp32"]


class _Tokenizer:
    """The probe's view of a tokenizer: 17 ids (the tiny arithmetic model's), 0 the pad."""

    all_special_ids = [0, 1]
    pad_token_id = 0

    def __len__(self) -> int:
        return 17
