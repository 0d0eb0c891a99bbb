"""Policy + generation workers on Ray: refit really moves weights, a stale engine is caught."""

import pytest
import torch
from unit.models.generation.refit_helpers import (
    answer_nll,
    engines_skip,
    max_logprob_gap,
    shared_prefix_prompts,
    train_step,
)

from posttrain.data.batch import make_batch
from posttrain.models.generation.interfaces import SamplingParams
from posttrain.weight_sync.refit import refit

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


@pytest.mark.parametrize("transport", ["broadcast", "object_store"])
def test_an_engine_that_loads_nothing_fails_the_refits_version_check(hf_runtime, monkeypatch, transport):
    """The engines take the refit call and skip loading: the version they read back is
    their old one, and refit stops (the probe is not needed to see it)."""
    rt = hf_runtime
    refit(rt.policy, rt.generation)
    old = rt.policy.weight_version
    train_step(rt)
    with engines_skip(rt, "_load_weights"), pytest.raises(
            RuntimeError, match=rf"^refit failed: generation engine at weight version {old}, trainer at {old + 1}$"):
        refit(rt.policy, rt.generation, transport=transport)
    refit(rt.policy, rt.generation)  # the engines load again: the next refit arrives
    assert rt.generation.weight_version() == old + 1


def _record_calls(monkeypatch, group) -> list[str]:
    """The methods called on ``group``'s actors from here on (every call goes through
    ``submit_all`` or ``submit_sharded``; ``run_*`` wrap them)."""
    called: list[str] = []
    for name in ("submit_all", "submit_sharded"):
        real = getattr(group, name)

        def spy(method, *args, _real=real, **kwargs):
            called.append(method)
            return _real(method, *args, **kwargs)

        monkeypatch.setattr(group, name, spy)
    return called


@pytest.mark.parametrize(("transport", "sender", "receiver"), [("broadcast", "broadcast_weights", "receive_weights"),
                                                               ("object_store", "put_weights", "update_weights")])
def test_a_probed_refit_is_one_call_per_side(hf_runtime, monkeypatch, transport, sender, receiver):
    """Issue 16's round trips: the policy sends and scores its side of the probe in one
    call; the engines load, read their version back and score theirs in one call. Nothing
    is asked afterwards, and the probe still measures the two sides (exact in fp32)."""
    rt = hf_runtime
    refit(rt.policy, rt.generation, rt.probe, transport=transport)  # a broadcast group is set up at its first refit
    train_step(rt)
    policy_calls = _record_calls(monkeypatch, rt.policy.group)
    engine_calls = _record_calls(monkeypatch, rt.generation.group)
    metrics = refit(rt.policy, rt.generation, rt.probe, transport=transport)
    assert (policy_calls, engine_calls) == ([sender], [receiver])
    assert metrics["train/refit_logprob_error"] < 1e-5
    assert rt.generation.weight_version() == rt.policy.weight_version


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
