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
samples, a resumed run's first step is sampled by the restored weights, and a producer that
fails must reach the trainer as its one-line error.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from same_run import assert_same_steps

from posttrain.algorithms import async_grpo, grpo, grpo_step
from posttrain.algorithms.async_actors import RolloutBufferClient, RolloutProducerClient
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import load_config
from posttrain.data.datasets import load_problems
from posttrain.errors import BufferTimeoutError, ConfigError
from posttrain.models.policy import lm_policy
from posttrain.rollouts.buffer import BufferStatus
from posttrain.rollouts.fan_out import shard_for_data_parallel
from posttrain.rollouts.filters import StalenessFilter
from posttrain.rollouts.samples import RolloutSample
from posttrain.utils.timer import Timer
from posttrain.weight_sync.refit import refit

GRPO_YAML = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_arithmetic.yaml")
STEPS, P, G, DP = 5, 4, 4, 3
N = P * G
LOOP = ["generation.backend=hf", "cluster.cpus_per_worker=0.5", "grpo.val_period=0", "policy.lr=1e-2",
        "grpo.num_steps=3"]
# A job the untrained tiny model earns rewards in: one-digit sums answered in one token, 8 per
# prompt (the producer actor scores with the real verifier; a test cannot patch it there), so
# some groups vary and the KL term acts once the weights moved: steps 2 and 3 train.
LEARNABLE = ["data.arithmetic.operand_digits=1", "generation.max_new_tokens=1", "grpo.completions_per_prompt=8",
             "grpo.kl_coef=0.1"]


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


def test_a_buffer_too_small_for_max_staleness_is_one_line() -> None:
    cfg = async_cfg("unused", "grpo.async.buffer_size=31")
    with pytest.raises(ConfigError, match=r"grpo.async.buffer_size=31 is below .* = 32"):
        async_grpo.buffer_capacity(cfg)
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.buffer_size=32")) == 32
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.max_staleness=3")) == 4 * N


def test_max_staleness_buffer_size_and_the_weight_cap_reach_the_loop(ray_cluster, tiny_model_path, tmp_path,
                                                                       capsys, monkeypatch) -> None:
    """k = 1 trains on samples of the previous weights (and never older); the buffer has the
    configured size; the cap turns on the truncated importance weight, which stays below it,
    and the loss the loop trains with truncates at exactly the configured 2.5 (no cast, no clamp)."""
    losses = []  # the loss objects the loop hands the policy (driver side)
    train = lm_policy.Policy.train

    def recording_train(self, batch, extra, loss_fn):
        losses.append(loss_fn)
        return train(self, batch, extra, loss_fn)

    monkeypatch.setattr(lm_policy.Policy, "train", recording_train)
    metrics = grpo.train(async_cfg(tiny_model_path, "generation.backend=hf", "cluster.cpus_per_worker=0.5",
                                   "grpo.val_period=0", "policy.lr=1e-2", "grpo.num_steps=4",
                                   "grpo.async.buffer_size=40", "grpo.async.importance_weight_cap=2.5",
                                   f"logger.log_dir={tmp_path}"))
    assert "the producer samples up to 1 step(s) ahead, rollout buffer of 40 samples" in capsys.readouterr().out
    assert max(metrics["async/staleness_max"].values()) == 1.0  # the producer ran ahead ...
    assert metrics["async/staleness_max"]["1"] == 0.0  # ... from the first step's weights on
    assert set(metrics["async/dropped_samples"].values()) == {0.0}
    assert "train/token_mult_prob_error" not in metrics  # with k >= 1 it would have gaps
    weights = metrics["train/importance_weight"].values()
    assert len(weights) == 4 and all(0 < w <= 2.5 for w in weights)
    # pi_trainer / pi_behaviour of 4 and of 2 on two tokens: weights 2.5 (truncated) and 2
    gaps = torch.tensor([[math.log(4.0), math.log(2.0)]])
    data = {"completion_mask": torch.ones(1, 2), "advantages": torch.ones(1), "old_logprobs": gaps,
            "behaviour_logprobs": torch.zeros(1, 2)}
    assert len(losses) == 4 and losses[0](gaps, data, 2.0)[1]["importance_weight"] == pytest.approx(2.25, rel=1e-6)


def test_a_claim_timeout_is_one_line_naming_the_key(ray_cluster, tiny_model_path, tmp_path, monkeypatch) -> None:
    """The configured timeout reaches the trainer's claim, which gives up in one line naming the key.

    The producer's engine stalls for 20 s, so no rollouts can arrive within 0.5 s on any machine (with
    the real engine, whether a tiny model samples a step in under the claim's shortest wait depends
    on the CPU: it did on a CI runner and the run trained). Were the key ignored (600 s default),
    the stalled engine's error would reach the trainer instead, after 20 s, and the test fails."""

    class StalledEngine:  # defined here, so Ray ships it to the producer by value
        def generate(self, prompts, params):
            import time
            time.sleep(20.0)
            raise RuntimeError("the stalled engine woke up: the claim did not time out")

    start_producer = RolloutProducerClient
    monkeypatch.setattr(async_grpo, "RolloutProducerClient",
                        lambda engine, *args: start_producer(StalledEngine(), *args))
    cfg = async_cfg(tiny_model_path, "generation.backend=hf", "cluster.cpus_per_worker=0.5", "grpo.val_period=0",
                    "grpo.async.claim_timeout_s=0.5", f"logger.log_dir={tmp_path}")
    with pytest.raises(BufferTimeoutError) as caught:
        grpo.train(cfg)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        "no rollouts for this step within grpo.async.claim_timeout_s=0.5 s"), message


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
        buffer = RolloutBufferClient(async_grpo.buffer_capacity(cfg))
        producer = RolloutProducerClient(BrokenEngine(error), buffer, tiny_model_path, train_problems, cfg, 1)
        try:
            with pytest.raises(expected) as caught:
                async_grpo.claim_step(buffer, producer, N, timeout_s=300)
        finally:
            producer.kill()
            buffer.kill()
        message = str(caught.value)
        assert "\n" not in message and message.startswith("the rollout producer, sampling step 1"), message
        assert type(caught.value) is expected and str(error).splitlines()[0] in message


def test_the_async_loop_runs_in_process_and_at_k_0_trains_as_the_synchronous_loop(in_process, tiny_model_path,
                                                                                   tmp_path, monkeypatch) -> None:
    """The buffer and the producer are started through the run's transport, as every worker is: under
    the in-process transport the asynchronous loop runs in this process (the producer's sampling
    thread, the buffer's event loop), starting no Ray, and at k = 0 it trains exactly as the
    synchronous loop; at k = 1 its producer samples ahead on its own thread."""
    from posttrain.distributed import worker_group

    def no_ray_actor(*args, **kwargs):
        raise AssertionError("a Ray actor was started under the in-process transport")

    monkeypatch.setattr(worker_group.RayActor, "__init__", no_ray_actor)
    base = [f"model.path={tiny_model_path}", *LOOP, *LEARNABLE, "grpo.num_prompts_per_step=4",
            "data.arithmetic.num_val=8"]
    sync = in_process.run(grpo, GRPO_YAML, [*base, f"logger.log_dir={tmp_path / 'sync'}"])
    k0 = in_process.run(grpo, GRPO_YAML, [*base, "grpo.async.enabled=true", "grpo.async.max_staleness=0",
                                          f"logger.log_dir={tmp_path / 'k0'}"])
    assert k0.cfg.grpo.async_.enabled and not sync.cfg.grpo.async_.enabled
    assert sync.metrics["train/grad_norm"]["3"] > 0  # the weights move: equal runs mean the same training
    assert k0.metrics["async/staleness_max"] == {"1": 0.0, "2": 0.0, "3": 0.0}
    prompts = [c.args for c in sync.calls("generation", "generate")]
    assert [c.args for c in k0.calls("generation", "generate")] == prompts
    for key in ("train/reward_mean", "train/completion_length", "train/loss", "train/grad_norm", "train/kl"):
        assert k0.metrics[key] == sync.metrics[key], key
    k1 = in_process.run(grpo, GRPO_YAML, [*base, "grpo.async.enabled=true", "grpo.async.max_staleness=1",
                                          f"logger.log_dir={tmp_path / 'k1'}"])
    assert max(k1.metrics["async/staleness_max"].values()) == 1.0  # sampled ahead, with the older weights
    assert set(k1.metrics["async/dropped_samples"].values()) == {0.0}
