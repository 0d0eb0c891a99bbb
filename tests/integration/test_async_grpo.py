"""Asynchronous GRPO end to end with real Ray actors: producer -> buffer -> filter -> fan-out.

The flow test drives the loop's own parts (``async_grpo.claim_step``, ``StalenessFilter``,
``grpo_step.learn``, ``refit``, the actors' driver classes in ``async_actors``) and the
data-parallel fan-out a loop with several data-parallel ranks will add (``shard_for_data_parallel``,
over 3 ranks; today's policies have one and the loop trains on the kept samples as they are)
around a real producer actor that
samples with the real Hugging Face engine, for several steps; it records what each step
saw and asserts in a separate phase afterwards (so an assertion cannot stop the pipeline
half way and leave it looking consistent). Counts are compared as ``Counter`` of sample ids:
a sample trained twice and another never trained has the same set size as a correct run.

The loop tests run ``grpo.train`` itself: k = 0 must reproduce the synchronous loop's
samples, and a resumed run's first step is sampled by the restored weights; in process (the
``in_process`` transport: no Ray actor), the same loop at k = 0 and k = 1, the importance-weight
cap the k = 1 run's loss truncates at, and a resumed run's first step. The keys and the
failures (buffer size, staleness, weight cap, claim timeout, a failing producer) are in
``test_async_grpo_keys_and_errors.py``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from async_jobs import DP, GRPO_YAML, LEARNABLE, LOOP, SMALL_STEPS, STEPS, N, P, async_cfg
from in_process import no_ray_actor
from same_run import assert_same_steps
from step_timing import DELAY_S, assert_async_counts_are_per_step, assert_each_step_timed_alone, at, hold_first

from posttrain.algorithms import async_grpo, grpo, grpo_step
from posttrain.algorithms.async_actors import RolloutBufferClient, RolloutProducerClient
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.datasets import load_problems
from posttrain.rollouts.buffer import BufferStatus
from posttrain.rollouts.fan_out import shard_for_data_parallel
from posttrain.rollouts.filters import StalenessFilter
from posttrain.rollouts.samples import RolloutSample
from posttrain.utils.timer import Timer
from posttrain.weight_sync.refit import refit


@dataclass
class StepRecord:
    """What one step of the pipeline saw (asserted on after the pipeline has run)."""

    step: int
    trainer_version: int
    claimed: list[RolloutSample]
    kept: list[RolloutSample]
    dropped: list[RolloutSample]
    shards: list[list[RolloutSample]]
    after_clear: BufferStatus


def ids(samples: list[RolloutSample]) -> Counter[int]:
    return Counter(s["sample_id"] for s in samples)


@pytest.mark.slow(reason="a real producer actor on Ray")
def test_claim_filter_fan_out_clear_with_a_real_producer(hf_runtime) -> None:
    rt = hf_runtime
    cfg = async_cfg(rt.model_path)
    train_problems, _ = load_problems(cfg.data)
    loss_fn = ClippedPGLoss(clip_eps=cfg.grpo.clip_eps)
    refit(rt.policy, rt.engine)  # the module's runtime may have been trained by another test
    first_version = rt.policy.weight_version
    buffer = RolloutBufferClient(async_grpo.buffer_capacity(cfg))
    producer = RolloutProducerClient(rt.engine, buffer, rt.model_path, train_problems, cfg, 1)
    records: list[StepRecord] = []
    try:  # phase 1: run the pipeline, record everything
        for step in range(1, STEPS + 1):
            claimed = async_grpo.claim_step(buffer, producer, N, timeout_s=120)
            version = rt.policy.weight_version
            kept, dropped = StalenessFilter(cfg.grpo.async_.max_staleness).split(claimed, version)
            shards = shard_for_data_parallel(kept, DP)
            fanned = [s for shard in shards for s in shard]
            if fanned:  # as the loop: a step whose samples were all dropped trains on nothing
                grpo_step.learn(rt, grpo_step.to_rollouts(fanned), cfg, loss_fn, Timer(), version, off_policy=True)
            buffer.clear(consumed=fanned, dropped=dropped)
            producer.pause()
            refit(rt.policy, rt.engine)
            producer.resume(step)
            records.append(StepRecord(step, version, claimed, kept, dropped, shards, buffer.status()))
        producer.pause()
        final = buffer.status()
    finally:
        producer.kill()
        buffer.kill()

    # phase 2: the assertions
    every_id = Counter(range(STEPS * N))  # the producer's ids for steps 1..STEPS, each once
    assert sum((ids(r.claimed) for r in records), Counter()) == every_id
    assert sum((ids(r.kept) + ids(r.dropped) for r in records), Counter()) == every_id
    for r in records:
        assert {s["batch_index"] for s in r.claimed} == {r.step}, "a claim must be one step's batch, in order"
        assert sum((ids(shard) for shard in r.shards), Counter()) == ids(r.kept), f"step {r.step}: fan-out lost rows"
        groups = [{s["group_id"] for s in shard} for shard in r.shards]
        assert sum(len(g) for g in groups) == len(set().union(*groups)), f"step {r.step}: a group split over shards"
        assert all(len(shard) for shard in r.shards), f"step {r.step}: {P} groups must fill {DP} shards"
        lags = {r.trainer_version - s["weight_version"] for s in r.claimed}
        assert lags <= {0, 1}, f"step {r.step}: staleness {lags} beyond max_staleness 1"
        assert r.after_clear.claim_cursor == r.step * N
        assert r.after_clear.consumed + r.after_clear.dropped == r.step * N
        assert r.after_clear.claimed == 0
    assert records[0].trainer_version == first_version
    assert [r.trainer_version for r in records] == list(range(first_version, first_version + STEPS))
    # The producer ran ahead: some step trained on samples of the previous weights.
    assert any(s["weight_version"] < r.trainer_version for r in records for s in r.claimed)
    assert final.size == 0 and final.put_total == STEPS * N  # nothing beyond the last step, all cleared
    assert Counter(final.consumed_ids) == every_id


@pytest.fixture(scope="module")
def k0_run(ray_cluster, tiny_model_path, tmp_path_factory) -> tuple[dict, Path]:
    """The learnable job, asynchronous with k = 0, checkpointed after every step: its metrics
    and its directory (``log/``, ``ckpt/``)."""
    tmp = tmp_path_factory.mktemp("async_k0")
    metrics = grpo.train(async_cfg(tiny_model_path, *LOOP, *LEARNABLE, "grpo.async.max_staleness=0",
                                   f"logger.log_dir={tmp / 'log'}", f"checkpoint.dir={tmp / 'ckpt'}",
                                   "checkpoint.save_period=1"))
    return metrics, tmp


@pytest.mark.slow(reason="an async run at staleness 0 and a synchronous run, compared step by step")
def test_max_staleness_0_reproduces_the_synchronous_run(k0_run, tiny_model_path, tmp_path) -> None:
    sync = grpo.train(async_cfg(tiny_model_path, *LOOP, *LEARNABLE, "grpo.async.enabled=false",
                                f"logger.log_dir={tmp_path / 'sync'}"))
    k0 = k0_run[0]
    assert sync["train/grad_norm"]["3"] > 0  # the weights move: equal runs mean the same training
    assert k0["async/staleness_max"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    assert not any(key.startswith("async/") for key in sync), "the synchronous loop ran asynchronously"
    assert len(k0["train/token_mult_prob_error"]) == 3  # on-policy: engine/trainer agreement every step
    for key in ("train/reward_mean", "train/completion_length", "val/accuracy"):
        assert k0[key] == sync[key], key
    for key in ("train/loss", "train/grad_norm", "train/entropy"):
        assert k0[key] == pytest.approx(sync[key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow(reason="an async GRPO run stopped and resumed from its checkpoint, with a real producer actor")
def test_a_resumed_async_run_samples_its_first_step_with_the_restored_weights(k0_run, tiny_model_path,
                                                                               tmp_path) -> None:
    """The documented difference of an asynchronous resume: the producer starts at the step
    after the checkpoint, with the restored weights, so that step is sampled on-policy
    (staleness 0) whatever k. From step 2 of the k = 0 run, a k = 1 run logs step 3 as the
    uninterrupted k = 0 run did (samples, rewards, loss, KL, validation, probe), except the
    engine/trainer agreement a k >= 1 run never logs; its metrics.json continues at step 3."""
    k0, tmp = k0_run
    resumed = grpo.train(async_cfg(tiny_model_path, *LOOP, *LEARNABLE, "grpo.async.max_staleness=1",
                                   f"logger.log_dir={tmp / 'log'}", f"checkpoint.dir={tmp_path / 'ckpt'}",
                                   f"checkpoint.resume={tmp / 'ckpt' / 'step_2'}"))
    assert k0["train/grad_norm"]["3"] > 0 and k0["train/kl"]["3"] > 0  # step 3 trains, against the reference
    assert resumed["async/staleness_max"]["3"] == 0.0
    assert_same_steps({k: v for k, v in k0.items() if k != "train/token_mult_prob_error"}, resumed, range(3, 4))
    logged = json.loads((tmp / "log" / "metrics.json").read_text())
    assert sorted(map(int, logged["train/loss"])) == [1, 2, 3]
    assert all(logged["train/loss"][s] == k0["train/loss"][s] for s in ("1", "2"))


def in_process_base(model_path: str) -> list[str]:
    return [f"model.path={model_path}", *LOOP, *LEARNABLE, "grpo.num_prompts_per_step=4", "data.arithmetic.num_val=8"]


CAP = 5.0  # the k = 1 run's grpo.async.importance_weight_cap: above 2, so a cap clamped to 2 shows


@pytest.fixture(scope="module")
def k1_in_process(tiny_model_path, tmp_path_factory):
    """The learnable job in process, asynchronous at k = 1 with an importance-weight cap of ``CAP``, its
    first sampling call (the producer's) and first train call each held ``DELAY_S``
    (``step_timing.py``); no Ray actor may start."""
    from in_process import InProcess

    from posttrain.distributed import worker_group

    sampling = hold_first(only=lambda call: not call.kwargs["params"].greedy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker_group.RayActor, "__init__", no_ray_actor)
        return InProcess().run(grpo, GRPO_YAML, [*in_process_base(tiny_model_path), "grpo.async.enabled=true",
                                                 "grpo.async.max_staleness=1",
                                                 f"grpo.async.importance_weight_cap={CAP}",
                                                 f"logger.log_dir={tmp_path_factory.mktemp('k1')}"],
                               {("generation", "generate"): sampling, ("policy", "train"): hold_first()})


@pytest.mark.slow(reason="an async and a synchronous GRPO run in process, compared (8.8 s run first)")
def test_the_async_loop_runs_in_process_and_at_k_0_trains_as_the_synchronous_loop(in_process, k1_in_process,
                                                                                   tiny_model_path, tmp_path,
                                                                                   monkeypatch) -> None:
    """The buffer and the producer are started through the run's transport, as every worker is: under
    the in-process transport the asynchronous loop runs in this process (the producer's sampling
    thread, the buffer's event loop), starting no Ray, and at k = 0 it trains exactly as the
    synchronous loop; at k = 1 its producer samples ahead on its own thread."""
    from posttrain.distributed import worker_group

    monkeypatch.setattr(worker_group.RayActor, "__init__", no_ray_actor)
    base = in_process_base(tiny_model_path)
    sync = in_process.run(grpo, GRPO_YAML, [*base, f"logger.log_dir={tmp_path / 'sync'}"])
    k0 = in_process.run(grpo, GRPO_YAML, [*base, "grpo.async.enabled=true", "grpo.async.max_staleness=0",
                                          f"logger.log_dir={tmp_path / 'k0'}"])
    assert k0.cfg.grpo.async_.enabled and not sync.cfg.grpo.async_.enabled
    assert sync.metrics["train/grad_norm"]["3"] > 0  # the weights move: equal runs mean the same training
    assert k0.metrics["async/staleness_max"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    # k = 0: the producer samples step t + 1 only after step t's refit, so nothing waits in the buffer
    assert k0.metrics["async/buffer_size"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    prompts = [c.args for c in sync.calls("generation", "generate")]
    assert [c.args for c in k0.calls("generation", "generate")] == prompts
    for key in ("train/reward_mean", "train/completion_length", "train/loss", "train/grad_norm", "train/kl"):
        assert k0.metrics[key] == sync.metrics[key], key
    k1 = k1_in_process
    assert max(k1.metrics["async/staleness_max"].values()) == 1.0  # sampled ahead, with the older weights
    assert set(k1.metrics["async/dropped_samples"].values()) == {0.0}


def test_async_timings_and_counts_measure_each_step_alone(k1_in_process) -> None:
    """``timing/*``, ``async/overlap_seconds`` and ``async/buffer_size`` of each step of an
    asynchronous run measure that step, not the run so far (``step_timing.py``): the producer's
    first batch and the trainer's first update were held, and neither shows up after step 1."""
    assert_each_step_timed_alone(k1_in_process, "async")
    assert_async_counts_are_per_step(k1_in_process)
    assert at(k1_in_process, "timing/train", 1) >= DELAY_S  # the held update counts in its own step


def test_the_async_loop_trains_with_the_configured_importance_weight_cap(k1_in_process) -> None:
    """Every update of the k = 1 run got a loss truncating the importance weight at exactly
    ``grpo.async.importance_weight_cap`` (5): on two tokens whose trainer / behaviour probability
    ratios are 4 and 8, the weights are min(4, 5) = 4 and min(8, 5) = 5, mean 4.5 (a cap clamped to
    2 would give 2)."""
    train_calls = k1_in_process.calls("policy", "train")
    assert len(train_calls) == 3  # one update per step
    gaps = torch.tensor([[math.log(4.0), math.log(8.0)]])
    data = {"completion_mask": torch.ones(1, 2), "advantages": torch.ones(1), "old_logprobs": gaps,
            "behaviour_logprobs": torch.zeros(1, 2), "ref_logprobs": gaps}
    expected = (min(4.0, CAP) + min(8.0, CAP)) / 2
    for call in train_calls:
        loss_fn = call.args[2]  # what the policy worker trained with (a copy, as Ray would hand it over)
        assert loss_fn(gaps, data, 2.0)[1]["importance_weight"] == pytest.approx(expected, rel=1e-6)
    assert set(k1_in_process.metrics["train/importance_weight"]) == {"1", "2", "3"}  # the weight is logged


def sampled_prompts(run) -> list[tuple]:
    """The prompts (and sampling seed) of each sampling call of ``run``, in call order; validation's
    greedy calls left out."""
    calls = [(c.args[0], c.kwargs["params"]) for c in run.calls("generation", "generate")]
    return [(prompts, params.seed) for prompts, params in calls if not params.greedy]


def test_a_resumed_async_run_in_process_samples_the_step_after_its_checkpoint_first(in_process, tiny_model_path,
                                                                                   tmp_path, monkeypatch) -> None:
    """Resumed from step 1's checkpoint, the producer's first batch is step 2's (its prompts and
    sampling seed, as the uninterrupted run sampled them), drawn by the restored weights
    (staleness 0), not step 1's again; the Ray run of this is
    ``test_a_resumed_async_run_samples_its_first_step_with_the_restored_weights``."""
    from posttrain.distributed import worker_group

    monkeypatch.setattr(worker_group.RayActor, "__init__", no_ray_actor)
    base = [f"model.path={tiny_model_path}", *LOOP, *SMALL_STEPS, "grpo.num_steps=2", "grpo.async.enabled=true",
            "grpo.async.max_staleness=1", f"checkpoint.dir={tmp_path / 'ckpt'}"]
    whole = in_process.run(grpo, GRPO_YAML, [*base, "checkpoint.save_period=1", f"logger.log_dir={tmp_path / 'a'}"])
    resumed = in_process.run(grpo, GRPO_YAML, [*base, f"checkpoint.resume={tmp_path / 'ckpt' / 'step_1'}",
                                               f"logger.log_dir={tmp_path / 'b'}"])
    first, second = sampled_prompts(whole)
    assert first[0] != second[0]  # the two steps' prompts differ: the comparison below can tell them apart
    assert [seed for _, seed in sampled_prompts(resumed)] == [second[1]], "the resumed producer's first step"
    assert sampled_prompts(resumed) == [second]
    assert resumed.metrics["async/staleness_max"] == {"2": 0.0}
