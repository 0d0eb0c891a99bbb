"""Policy + generation workers on Ray: refit really moves weights, a stale engine is caught."""

import pytest
import torch
from unit.models.generation.refit_helpers import answer_nll, max_logprob_gap, shared_prefix_prompts, train_step

from posttrain.algorithms.runtime import refit
from posttrain.data.batch import make_batch
from posttrain.models.generation.interfaces import SamplingParams

# Shared prefix of the long prompts: vLLM's CPU KV block (128 tokens) and more, so these are
# the prompts that the vLLM tier's prefix-cache test serves from a cache.
PREFIX_TOKENS = 136


def _greedy(rt, prompts):
    return rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))


def test_refit_changes_generation_and_versions_agree(hf_runtime):
    rt = hf_runtime
    prompts = [list(rt.chat.prompt(f"{a}+1=")) for a in range(4)]
    before = _greedy(rt, prompts)
    start_version = rt.policy.weight_version  # the module's runtime may have trained already (any order)
    steps = 0
    while steps < 60:  # memorize "77" (takes a few dozen steps)
        steps += 1
        train_step(rt)
        if answer_nll(rt) < 0.05:
            break
    assert answer_nll(rt) < 0.05
    # Not yet refit: the engine still generates with its old weights.
    assert _greedy(rt, prompts).completion_ids == before.completion_ids
    refit(rt.policy, rt.generation)
    after = _greedy(rt, prompts)
    assert after.weight_version == rt.policy.weight_version == start_version + steps
    assert after.completion_ids != before.completion_ids
    assert rt.tokenizer.decode(after.completion_ids[0], skip_special_tokens=True) == "77"


def test_engine_logprobs_match_trainer_after_refit_and_not_before(hf_runtime):
    rt = hf_runtime
    refit(rt.policy, rt.generation)
    prompts = [list(rt.chat.prompt(f"{a}+2=")) for a in range(8)]
    out = rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, seed=1))
    batch = make_batch(prompts, out.completion_ids, rt.tokenizer.pad_token_id)
    engine = torch.zeros_like(batch.completion_mask)
    for b, lp in enumerate(out.logprobs):
        engine[b, : len(lp)] = torch.tensor(lp)
    trainer = rt.policy.get_logprobs(batch)
    mask = batch.completion_mask.bool()
    assert (engine - trainer)[mask].abs().max() < 1e-4
    train_step(rt, answer="5")  # trainer moves on, engine is stale
    stale = rt.policy.get_logprobs(batch)
    assert (engine - stale)[mask].abs().max() > 1e-2


def test_refit_with_stale_version_raises(hf_runtime, monkeypatch):
    rt = hf_runtime
    # through the object store, where the engines' update is one call to skip (a broadcast
    # whose receivers never run would leave its sender waiting)
    monkeypatch.setattr(rt.policy, "refit_transport", lambda generation: "object_store")
    monkeypatch.setattr(rt.generation, "update_weights", lambda weights, version: None)
    train_step(rt)
    with pytest.raises(RuntimeError, match="refit failed: generation engine at weight version"):
        refit(rt.policy, rt.generation)


def test_after_each_refit_prompts_seen_before_it_get_the_trainers_new_logprobs(hf_runtime):
    """The vLLM tier's prefix-cache test on the hf backend, so both backends are held to the
    same behaviour: long prompts that share a prefix with, or repeat, prompts generated
    before a refit get the trainer's new logprobs after it, refit after refit."""
    rt = hf_runtime
    refit(rt.policy, rt.generation, rt.probe)  # the tests above leave the trainer ahead
    first, second = shared_prefix_prompts(rt, PREFIX_TOKENS)
    params = SamplingParams(max_new_tokens=4, seed=11)
    rt.generation.generate(first, params)
    for answer in ("12", "5"):  # a new answer each step: the weights move every time
        train_step(rt, answer=answer)
        refit(rt.policy, rt.generation, rt.probe)
        for prompts in (second, first):  # a prefix seen before the refit, then the very same prompts
            out = rt.generation.generate(prompts, params)
            assert out.weight_version == rt.policy.weight_version
            assert max_logprob_gap(rt, prompts, out.completion_ids, out.logprobs) < 1e-4
            scored = rt.generation.score(prompts, out.completion_ids, 1.0)
            assert max_logprob_gap(rt, prompts, out.completion_ids, scored) < 1e-4
