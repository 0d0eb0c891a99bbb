"""The Megatron policy worker against the Hugging Face one and against itself (GPU, extra ``mcore``).

    uv run --extra mcore --group test bash tests/run_unit.sh --mcore-only

Each test compares posttrain's Megatron code with an independent reference: the Hugging
Face model's own forward pass, the HF policy worker's train step (the two backends share
only the loss objects and the loop in ``PolicyWorkerBase``: the model, the optimizer, the
gradient clipping and the weight conversion are different code), or the worker's own
state before a save. All in fp32 unless the test is about bf16. The backend-agnostic
learning tests of ``tests/integration`` run over this backend too (``policy_backends.py``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from harness.model_files import perturbed_copy
from harness.policy_backends import make_worker, worker_cfg
from harness.worker_parity import grpo_extra, max_gap

from posttrain.algorithms.loss_functions import ClippedPGLoss, NLLLoss
from posttrain.data.batch import make_batch

pytestmark = pytest.mark.mcore
GPU = pytest.mark.gpu(1)
LR = 1e-3


def random_batch(vocab: int, seed: int = 0, rows: int = 8):
    """Right-padded rows with prompts of 2..9 and completions of 1..5 tokens (ids 2..vocab-1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 10, (rows,), generator=g)
    prompts = [torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in lengths]
    lengths = torch.randint(1, 6, (rows,), generator=g)
    comps = [torch.randint(2, vocab, (int(n),), generator=g).tolist() for n in lengths]
    return make_batch(prompts, comps, pad_id=0)


def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def model_25m(tiny_model_path, tmp_path_factory) -> str:
    """A ~26M-parameter Qwen2 (hidden 512, 8 layers, 8 query / 2 key-value heads, vocab 4096)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, rope_theta=1e6)
    out = tmp_path_factory.mktemp("qwen2_25m")
    Qwen2ForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(out)
    return perturbed_copy(str(out), out)


@GPU
def test_weights_round_trip_hf_to_megatron_to_hf_bit_exact(noisy_tiny) -> None:
    """Converted into a GPTModel's parameters and read back out: every tensor identical, every
    name and shape what ``Qwen2ForCausalLM.state_dict()`` has."""
    worker = make_worker("megatron", noisy_tiny)
    expected = hf_model(noisy_tiny).state_dict()
    got = worker.get_weights()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


@GPU
@pytest.mark.parametrize("layer_spec", ["torch", "local"])
@pytest.mark.parametrize("which", ["tiny", "25m"])
def test_logits_equal_the_hf_models(which, layer_spec, noisy_tiny, model_25m) -> None:
    path = noisy_tiny if which == "tiny" else model_25m
    worker = make_worker("megatron", path, layer_spec=layer_spec)
    reference = hf_model(path).cuda().eval()
    batch = random_batch(reference.config.vocab_size).to("cuda")
    with torch.no_grad():
        expected = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        worker.model.eval()
        got = worker._forward_logits(worker.model, batch)
    real = batch.attention_mask.bool()  # padding positions are never read
    assert got.shape == expected.shape
    err = (got - expected)[real].abs().max().item()
    assert err <= 1e-4, err


@GPU
def test_logprobs_with_mixed_prompt_lengths_equal_the_hf_workers(noisy_tiny) -> None:
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size, rows=12)
    assert len(set(batch.prompt_lens.tolist())) > 3
    hf, mc = make_worker("hf", noisy_tiny, temperature=0.7), make_worker("megatron", noisy_tiny, temperature=0.7)
    mask = batch.completion_mask.bool()
    for reference in (False, True):
        gap = (hf.get_logprobs(batch, reference)[mask] - mc.get_logprobs(batch, reference)[mask]).abs().max()
        assert gap <= 1e-5, (reference, gap)


@GPU
@pytest.mark.parametrize("layer_spec", ["torch", "local"])
@pytest.mark.parametrize("loss", ["grpo", "sft"])
def test_train_steps_equal_the_hf_workers(noisy_tiny, loss, layer_spec) -> None:
    """Two calls of two optimizer steps of two micro-batches each, grad clipping active, lr
    warmup: every metric within 1e-4 (relative) of the HF worker's, and weights within a
    tenth of one step's size; with either layer spec."""
    kw = dict(lr=LR, train_global_batch_size=4, train_micro_batch_size=2, max_grad_norm=0.5, warmup_steps=3)
    hf, mc = make_worker("hf", noisy_tiny, **kw), make_worker("megatron", noisy_tiny, layer_spec=layer_spec, **kw)
    batch = random_batch(hf.model.config.vocab_size)
    loss_fn = ClippedPGLoss(clip_eps=0.2, kl_coef=0.3) if loss == "grpo" else NLLLoss()
    for call in range(2):
        extra = grpo_extra(hf, batch, seed=call) if loss == "grpo" else {}
        logged_hf, logged_mc = hf.train(batch, extra, loss_fn), mc.train(batch, extra, loss_fn)
        assert logged_hf.keys() == logged_mc.keys()
        for key, value in logged_hf.items():
            assert logged_mc[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (call, key)
        assert logged_hf["grad_norm"] > 0.5  # clipping was active
    assert max_gap(hf.get_weights(), mc.get_weights()) <= 0.1 * LR


@GPU
def test_gradient_accumulation_equals_one_micro_batch(noisy_tiny) -> None:
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size)
    runs = {}
    for micro in (8, 2):
        worker = make_worker("megatron", noisy_tiny, lr=LR, train_global_batch_size=8, train_micro_batch_size=micro)
        runs[micro] = (worker.train(batch, grpo_extra(worker, batch), ClippedPGLoss(kl_coef=0.1)), worker.get_weights())
    for key, value in runs[8][0].items():
        if not key.endswith(("_min", "_max")):  # extremes are per micro-batch
            assert runs[2][0][key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert max_gap(runs[8][1], runs[2][1]) <= 0.1 * LR


@GPU
def test_a_non_finite_gradient_skips_the_step_and_training_goes_on(noisy_tiny) -> None:
    worker = make_worker("megatron", noisy_tiny, lr=LR)
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size)
    before = worker.get_weights()
    extra = grpo_extra(worker, batch)
    bad = {**extra, "advantages": torch.full_like(extra["advantages"], math.nan)}
    metrics = worker.train(batch, bad, ClippedPGLoss())
    assert metrics["skipped_optimizer_steps"] == 1 and not math.isfinite(metrics["grad_norm"])
    assert max_gap(before, worker.get_weights()) == 0.0
    metrics = worker.train(batch, extra, ClippedPGLoss())
    assert metrics["skipped_optimizer_steps"] == 0 and math.isfinite(metrics["grad_norm"])
    assert max_gap(before, worker.get_weights()) > 0.5 * LR


@GPU
def test_refit_into_the_hf_engine_makes_it_score_like_the_trainer(noisy_tiny) -> None:
    """After a train step the engine, loaded with ``get_weights``, scores completions as the
    Megatron trainer does (the weight-sync probe's comparison), and differently from before."""
    from posttrain.config import GenerationWorkerConfig
    from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl

    worker = make_worker("megatron", noisy_tiny, lr=1e-2)
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size)
    worker.train(batch, grpo_extra(worker, batch), ClippedPGLoss())
    engine = HfGenerationWorkerImpl(noisy_tiny, GenerationWorkerConfig(device="cuda", tf32=False))  # as the trainer
    prompts = [row[:p].tolist() for row, p in zip(batch.input_ids, batch.prompt_lens, strict=True)]
    comps = [row[p:p + n].tolist() for row, p, n in zip(batch.input_ids, batch.prompt_lens, batch.completion_lens,
                                                         strict=True)]
    trainer = [row[:n].tolist() for row, n in zip(worker.get_logprobs(batch), batch.completion_lens, strict=True)]

    def gap(scored):
        return max(abs(a - b) for s, t in zip(scored, trainer, strict=True) for a, b in zip(s, t, strict=True))

    assert gap(engine.score(prompts, comps, 1.0)) > 1e-3  # the step moved the policy
    engine.update_weights(worker.get_weights(), worker.get_weight_version())
    assert gap(engine.score(prompts, comps, 1.0)) <= 1e-5
    assert engine.weight_version() == 1


@GPU
def test_checkpoint_save_and_load_continue_exactly(noisy_tiny, tmp_path) -> None:
    kw = dict(lr=LR, warmup_steps=4, train_global_batch_size=4, train_micro_batch_size=4)
    worker = make_worker("megatron", noisy_tiny, **kw)
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size)
    extra = grpo_extra(worker, batch)
    worker.train(batch, extra, ClippedPGLoss())
    worker.save_checkpoint(str(tmp_path / "ckpt"), tokenizer_path=noisy_tiny)
    saved = worker.get_weights()
    # The HF export is a loadable model of the same weights.
    assert max_gap(hf_model(str(tmp_path / "ckpt")).state_dict(), saved) == 0.0
    resumed = make_worker("megatron", noisy_tiny, **kw)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert max_gap(resumed.get_weights(), saved) == 0.0 and resumed.get_weight_version() == 1
    # Adam's moments and the warmup position came back too: the next step is the same step.
    assert resumed.train(batch, extra, ClippedPGLoss()) == worker.train(batch, extra, ClippedPGLoss())
    assert max_gap(resumed.get_weights(), worker.get_weights()) == 0.0


@GPU
def test_bf16_mixed_keeps_fp32_master_weights_and_learns(noisy_tiny) -> None:
    worker = make_worker("megatron", noisy_tiny, lr=LR, precision="bf16-mixed")
    assert {p.dtype for p in worker.model.parameters()} == {torch.bfloat16}
    masters = [p for group in worker.optimizer.param_groups for p in group["params"]]
    assert masters and {p.dtype for p in masters} == {torch.float32}
    assert all(group["fused"] for group in worker.optimizer.param_groups)  # torch's fused AdamW kernel
    assert {t.dtype for t in worker.get_weights().values()} == {torch.bfloat16}
    batch = random_batch(hf_model(noisy_tiny).config.vocab_size)
    advantages = torch.tensor([1.0, -1.0] * 4)
    before = (worker.get_logprobs(batch) * batch.completion_mask).sum(-1)
    for _ in range(3):
        old = worker.get_logprobs(batch)
        worker.train(batch, {"advantages": advantages, "old_logprobs": old, "ref_logprobs": old}, ClippedPGLoss())
    change = (worker.get_logprobs(batch) * batch.completion_mask).sum(-1) - before
    assert (change[advantages > 0] > 0).all() and (change[advantages < 0] < 0).all(), change


@pytest.mark.gpu(2)
def test_tensor_parallel_2_matches_the_hf_worker(ray_cluster, noisy_tiny) -> None:
    """Two Ray workers, one GPU each, one model split over them: the logprobs, a train step's
    metrics (grad norm included: each rank's shard counted once) and the gathered weights
    match the HF worker's."""
    layout = matches_the_hf_worker(noisy_tiny, tensor_parallel=2)
    assert [(r["tp_rank"], r["pp_rank"], r["num_local_layers"]) for r in layout] == [(0, 0, 4), (1, 0, 4)]


@pytest.mark.gpu(2)
def test_tensor_parallel_2_with_sequence_packing_matches_the_hf_worker(ray_cluster, noisy_tiny) -> None:
    """The same with ``policy.sequence_packing``: each rank attends its half of the heads within
    each packed sequence (megatron's packed format split over tensor-parallel ranks)."""
    matches_the_hf_worker(noisy_tiny, tensor_parallel=2, sequence_packing=True)


@pytest.mark.gpu(2)
def test_pipeline_parallel_2_matches_the_hf_worker(ray_cluster, noisy_tiny) -> None:
    """Two pipeline stages (megatron-core's 1F1B schedule over two Ray workers, one GPU each):
    the logprobs and reference logprobs (computed on the last stage, answered by rank 0, the
    first), two optimizer steps of two micro-batches each (the loss's scale through the
    schedule), the metrics (grad norm over both stages) and the weights gathered from both
    stages (the tied output layer equal to the embedding: the embedding group's all-reduce ran)
    match the HF worker's; each stage holds its half of the 4 layers."""
    layout = matches_the_hf_worker(noisy_tiny, pipeline_parallel=2)
    assert [(r["pp_rank"], r["layers"], r["num_local_layers"], r["embedding"], r["output_layer"]) for r in layout] == [
        (0, [0, 1], 2, True, False), (1, [2, 3], 2, False, True)]


@pytest.mark.gpu(2)
def test_tensor_parallel_2_skips_a_step_whose_gradient_overflowed_in_one_ranks_shard(ray_cluster, noisy_tiny) -> None:
    """The gradient norm that decides the step is the whole model's: +inf in one element of tensor-
    parallel rank 1's shard of a split weight (its ``main_grad``, before the step's reductions) must
    make both ranks skip the step and count it, leaving every shard as it was; the next call trains.
    A norm over rank 0's shards only (weights not tagged tensor-parallel) would step, and rank 1's
    shard would turn non-finite. (``shard_fault.py`` does the same to FSDP2's shards on CPU.)"""
    from integration.shard_fault import ShardFaultTransport

    from posttrain.distributed.ray_cluster import RayVirtualCluster
    from posttrain.distributed.transport import use_transport
    from posttrain.models.policy.lm_policy import Policy
    from posttrain.models.policy.megatron_policy_worker import MegatronPolicyWorker, MegatronPolicyWorkerImpl

    class LastRankOverflow(MegatronPolicyWorkerImpl):
        faulted = False

        def _optimizer_step(self) -> float:
            if not self.faulted and self.tp_rank == self.tp - 1:
                split = next(p for p in self.model.parameters() if getattr(p, "tensor_model_parallel", False))
                with torch.no_grad():
                    split.main_grad.view(-1)[0] = math.inf
            self.faulted = True
            return super()._optimizer_step()

    kw = dict(lr=LR, train_global_batch_size=8, train_micro_batch_size=4, max_grad_norm=0.5)  # one step a call
    hf = make_worker("hf", noisy_tiny, **kw)
    cluster = RayVirtualCluster(2, num_cpus=1, num_gpus=1)
    with use_transport(ShardFaultTransport({MegatronPolicyWorker: LastRankOverflow})):
        policy = Policy(cluster, noisy_tiny, worker_cfg("megatron", tensor_parallel=2, **kw), seed=0,
                        bundle_indices=[0, 1])
    try:
        policy.wait_ready()
        batch = random_batch(hf.model.config.vocab_size)
        extra = grpo_extra(hf, batch)
        before = policy.get_weights()
        skipped = policy.train(batch, extra, ClippedPGLoss(kl_coef=0.1)).metrics
        assert skipped["skipped_optimizer_steps"] == 1 and not math.isfinite(skipped["grad_norm"]), skipped
        assert max_gap(before, policy.get_weights()) == 0.0
        trained = policy.train(batch, extra, ClippedPGLoss(kl_coef=0.1)).metrics
        assert trained["skipped_optimizer_steps"] == 0 and math.isfinite(trained["grad_norm"]), trained
        after = policy.get_weights()
        assert all(torch.isfinite(t).all() for t in after.values()) and max_gap(before, after) > 0.5 * LR
    finally:
        policy.shutdown()
        cluster.shutdown()


def matches_the_hf_worker(model_path: str, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                          **megatron_policy: Any) -> list[dict]:
    """Logprobs, reference logprobs, two train calls' metrics and the weights of a Megatron
    policy of this layout (Ray workers, a GPU each; ``megatron_policy``: more of its
    ``PolicyConfig`` keys) against the HF worker's; returns each rank's ``model_layout``."""
    from posttrain.distributed.ray_cluster import RayVirtualCluster
    from posttrain.models.policy.lm_policy import Policy

    kw = dict(lr=LR, train_global_batch_size=4, train_micro_batch_size=2, max_grad_norm=0.5)
    hf = make_worker("hf", model_path, **kw)
    ranks = tensor_parallel * pipeline_parallel
    cluster = RayVirtualCluster(ranks, num_cpus=1, num_gpus=1)
    cfg = worker_cfg("megatron", tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, **kw,
                     **megatron_policy)
    policy = Policy(cluster, model_path, cfg, seed=0, bundle_indices=list(range(ranks)))
    try:
        policy.wait_ready()
        batch = random_batch(hf.model.config.vocab_size)
        mask = batch.completion_mask.bool()
        assert (policy.get_logprobs(batch)[mask] - hf.get_logprobs(batch)[mask]).abs().max() <= 1e-5
        extra = grpo_extra(hf, batch)
        for call in range(2):
            logged_hf = hf.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
            result = policy.train(batch, extra, ClippedPGLoss(kl_coef=0.1))
            assert logged_hf.keys() == result.metrics.keys()
            for key, value in logged_hf.items():
                assert result.metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (call, key)
            assert logged_hf["num_optimizer_steps"] == 2
        got_ref = policy.get_logprobs(batch, reference=True)
        assert (got_ref[mask] - hf.get_logprobs(batch, reference=True)[mask]).abs().max() <= 1e-5
        assert max_gap(hf.get_weights(), policy.get_weights()) <= 0.1 * LR
        return policy.group.run_all("model_layout")
    finally:
        policy.shutdown()
        cluster.shutdown()
