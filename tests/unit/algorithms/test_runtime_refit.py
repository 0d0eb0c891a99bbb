"""Policy + generation workers on Ray: refit really moves weights, a stale engine is caught."""

import pytest
import torch

from posttrain.algorithms.loss_functions import NLLLoss
from posttrain.algorithms.runtime import refit
from posttrain.data.batch import make_batch
from posttrain.models.generation.interfaces import SamplingParams


def _train_once(rt, answer: str = "77"):
    pairs = [rt.chat.sft_example(f"{a}+1=", answer) for a in range(16)]
    batch = make_batch([p for p, _ in pairs], [c for _, c in pairs], rt.tokenizer.pad_token_id)
    return rt.policy.train(batch, {}, NLLLoss())


def _greedy(rt, prompts):
    return rt.generation.generate(prompts, SamplingParams(max_new_tokens=4, greedy=True))


def test_refit_changes_generation_and_versions_agree(hf_runtime):
    rt = hf_runtime
    prompts = [list(rt.chat.prompt(f"{a}+1=")) for a in range(4)]
    before = _greedy(rt, prompts)
    steps = 0
    while steps < 60:  # memorize "77" (takes a few dozen steps)
        steps += 1
        metrics = _train_once(rt)
        if metrics["loss"] < 0.05:
            break
    assert metrics["loss"] < 0.05
    # Not yet refit: the engine still generates with its old weights.
    assert _greedy(rt, prompts).completion_ids == before.completion_ids
    refit(rt.policy, rt.generation)
    after = _greedy(rt, prompts)
    assert after.weight_version == rt.policy.weight_version == steps
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
    _train_once(rt, answer="5")  # trainer moves on, engine is stale
    stale = rt.policy.get_logprobs(batch)
    assert (engine - stale)[mask].abs().max() > 1e-2


def test_refit_with_stale_version_raises(hf_runtime, monkeypatch):
    rt = hf_runtime
    monkeypatch.setattr(rt.generation, "update_weights", lambda weights, version: None)
    _train_once(rt)
    with pytest.raises(RuntimeError, match="refit failed: generation engine at weight version"):
        refit(rt.policy, rt.generation)
