"""Asynchronous GRPO end to end with real Ray actors: producer -> buffer -> filter -> fan-out.

The flow test drives the loop's own parts (``async_grpo.claim_step``, ``StalenessFilter``,
``shard_for_data_parallel``, ``grpo.learn``, ``refit``) around a real producer actor that
samples with the real Hugging Face engine, for several steps; it records what each step
saw and asserts in a separate phase afterwards (so an assertion cannot stop the pipeline
half way and leave it looking consistent). Counts are compared as ``Counter`` of sample ids:
a sample trained twice and another never trained has the same set size as a correct run.

The loop tests run ``grpo.train`` itself: k = 0 must reproduce the synchronous loop's
samples, and a producer that fails must reach the trainer as its one-line error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray

from posttrain.algorithms import async_grpo, grpo
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.rollout_producer import start_rollout_producer
from posttrain.algorithms.runtime import refit
from posttrain.config import load_config
from posttrain.data.datasets import load_problems
from posttrain.errors import BufferTimeoutError, ConfigError
from posttrain.rollouts.buffer import BufferStatus, start_rollout_buffer
from posttrain.rollouts.fan_out import shard_for_data_parallel
from posttrain.rollouts.filters import StalenessFilter
from posttrain.rollouts.samples import RolloutSample
from posttrain.utils.timer import Timer

GRPO_YAML = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_arithmetic.yaml")
STEPS, P, G, DP = 5, 4, 4, 3
N = P * G


def async_cfg(model_path: str, *overrides: str) -> grpo.GRPOMasterConfig:
    return load_config(GRPO_YAML, [f"model.path={model_path}", f"grpo.num_steps={STEPS}",
                                   f"grpo.num_prompts_per_step={P}", f"grpo.completions_per_prompt={G}",
                                   "generation.max_new_tokens=3", "data.arithmetic.num_val=8",
                                   "grpo.async.enabled=true", "grpo.async.max_staleness=1", *overrides],
                       grpo.GRPOMasterConfig)


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


def test_claim_filter_fan_out_clear_with_a_real_producer(hf_runtime) -> None:
    rt = hf_runtime
    cfg = async_cfg(rt.model_path)
    train_problems, _ = load_problems(cfg.data)
    loss_fn = ClippedPGLoss(clip_eps=cfg.grpo.clip_eps)
    refit(rt.policy, rt.engine)  # the module's runtime may have been trained by another test
    first_version = rt.policy.weight_version
    buffer = start_rollout_buffer(async_grpo.buffer_capacity(cfg))
    producer = start_rollout_producer(rt.engine, buffer, rt.model_path, train_problems, cfg, 1)
    records: list[StepRecord] = []
    try:  # phase 1: run the pipeline, record everything
        for step in range(1, STEPS + 1):
            claimed = async_grpo.claim_step(buffer, producer, N, timeout_s=120)
            version = rt.policy.weight_version
            kept, dropped = StalenessFilter(cfg.grpo.async_.max_staleness).split(claimed, version)
            shards = shard_for_data_parallel(kept, DP)
            fanned = [s for shard in shards for s in shard]
            if fanned:  # as the loop: a step whose samples were all dropped trains on nothing
                grpo.learn(rt, async_grpo.to_rollouts(fanned), cfg, loss_fn, Timer(), version, off_policy=True)
            ray.get(buffer.clear.remote([s["sample_id"] for s in fanned], "consumed"))
            ray.get(buffer.clear.remote([s["sample_id"] for s in dropped], "dropped"))
            ray.get(producer.pause.remote())
            refit(rt.policy, rt.engine)
            ray.get(producer.resume.remote(step))
            records.append(StepRecord(step, version, claimed, kept, dropped, shards, ray.get(buffer.status.remote())))
        ray.get(producer.pause.remote())
        final = ray.get(buffer.status.remote())
    finally:
        ray.kill(producer)
        ray.kill(buffer)

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


def test_max_staleness_0_reproduces_the_synchronous_run(ray_cluster, tiny_model_path, tmp_path) -> None:
    base = ["generation.backend=hf", "cluster.cpus_per_worker=0.5", "grpo.val_period=0", "policy.lr=1e-2",
            "grpo.num_steps=3"]
    sync = grpo.train(async_cfg(tiny_model_path, *base, "grpo.async.enabled=false",
                                f"logger.log_dir={tmp_path / 'sync'}"))
    k0 = grpo.train(async_cfg(tiny_model_path, *base, "grpo.async.max_staleness=0",
                              f"logger.log_dir={tmp_path / 'k0'}"))
    assert k0["async/staleness_max"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    assert not any(key.startswith("async/") for key in sync), "the synchronous loop ran asynchronously"
    assert len(k0["train/token_mult_prob_error"]) == 3  # on-policy: engine/trainer agreement every step
    for key in ("train/reward_mean", "train/completion_length", "val/accuracy"):
        assert k0[key] == sync[key], key
    for key in ("train/loss", "train/grad_norm", "train/entropy"):
        assert k0[key] == pytest.approx(sync[key], rel=1e-4, abs=1e-6), key


def test_a_buffer_too_small_for_max_staleness_is_one_line() -> None:
    cfg = async_cfg("unused", "grpo.async.buffer_size=31")
    with pytest.raises(ConfigError, match=r"grpo.async.buffer_size=31 is below .* = 32"):
        async_grpo.buffer_capacity(cfg)
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.buffer_size=32")) == 32
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.max_staleness=3")) == 4 * N


def test_max_staleness_buffer_size_and_the_weight_cap_reach_the_loop(ray_cluster, tiny_model_path, tmp_path,
                                                                       capsys) -> None:
    """k = 1 trains on samples of the previous weights (and never older); the buffer has the
    configured size; the cap turns on the truncated importance weight, which stays below it."""
    metrics = grpo.train(async_cfg(tiny_model_path, "generation.backend=hf", "cluster.cpus_per_worker=0.5",
                                   "grpo.val_period=0", "policy.lr=1e-2", "grpo.num_steps=4",
                                   "grpo.async.buffer_size=40", "grpo.async.importance_weight_cap=1.5",
                                   f"logger.log_dir={tmp_path}"))
    assert "the producer samples up to 1 step(s) ahead, rollout buffer of 40 samples" in capsys.readouterr().out
    assert max(metrics["async/staleness_max"].values()) == 1.0  # the producer ran ahead ...
    assert metrics["async/staleness_max"]["1"] == 0.0  # ... from the first step's weights on
    assert set(metrics["async/dropped_samples"].values()) == {0.0}
    assert "train/token_mult_prob_error" not in metrics  # with k >= 1 it would have gaps
    weights = metrics["train/importance_weight"].values()
    assert len(weights) == 4 and all(0 < w <= 1.5 for w in weights)


def test_a_claim_timeout_is_one_line_naming_the_key(ray_cluster, tiny_model_path, tmp_path) -> None:
    cfg = async_cfg(tiny_model_path, "generation.backend=hf", "cluster.cpus_per_worker=0.5", "grpo.val_period=0",
                    "grpo.async.claim_timeout_s=0.001", f"logger.log_dir={tmp_path}")
    with pytest.raises(BufferTimeoutError, match=r"^no rollouts for this step within grpo.async.claim_timeout_s=0.001"):
        grpo.train(cfg)


def test_a_failing_producer_reaches_the_trainer_as_one_line_at_once(ray_cluster, tiny_model_path) -> None:
    from posttrain.errors import ProducerError, StaleWeightsError

    class BrokenEngine:  # defined here, so Ray ships it to the producer by value
        def __init__(self, error: Exception):
            self.error = error

        def generate(self, prompts, params):
            raise self.error

    cfg = async_cfg(tiny_model_path)
    train_problems, _ = load_problems(cfg.data)
    for error, expected in ((RuntimeError("CUDA out of memory\nmore"), ProducerError),
                            (StaleWeightsError("engines disagree"), StaleWeightsError)):
        buffer = start_rollout_buffer(async_grpo.buffer_capacity(cfg))
        producer = start_rollout_producer(BrokenEngine(error), buffer, tiny_model_path, train_problems, cfg, 1)
        try:
            with pytest.raises(expected) as caught:
                async_grpo.claim_step(buffer, producer, N, timeout_s=300)
        finally:
            ray.kill(producer)
            ray.kill(buffer)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("the rollout producer, sampling step 1"), message
        assert type(caught.value) is expected and str(error).splitlines()[0] in message
