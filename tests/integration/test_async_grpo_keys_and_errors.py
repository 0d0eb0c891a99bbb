"""Asynchronous GRPO's keys reach the loop, and its failures reach the trainer as one line: the
buffer size, ``max_staleness`` and the importance-weight cap in a real run; the claim timeout
against a stalled producer (with real Ray actors, and in process); a producer whose engine raises.
Real Ray actors but for the in-process claim timeout (split from ``test_async_grpo.py`` so that
parallel workers can take the two files apart)."""

from __future__ import annotations

import math

import pytest
import torch
from async_jobs import GRPO_YAML, LOOP, SMALL_STEPS, N, async_cfg
from in_process import no_ray_actor

from posttrain.algorithms import async_grpo, grpo
from posttrain.algorithms.async_actors import RolloutBufferClient, RolloutProducerClient
from posttrain.data.datasets import load_problems
from posttrain.errors import BufferTimeoutError, ConfigError
from posttrain.models.policy import lm_policy


def test_a_buffer_too_small_for_max_staleness_is_one_line() -> None:
    cfg = async_cfg("unused", "grpo.async.buffer_size=31")
    with pytest.raises(ConfigError, match=r"grpo.async.buffer_size=31 is below .* = 32"):
        async_grpo.buffer_capacity(cfg)
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.buffer_size=32")) == 32
    assert async_grpo.buffer_capacity(async_cfg("unused", "grpo.async.max_staleness=3")) == 4 * N


@pytest.mark.slow(reason="a real async GRPO run on Ray (producer actor, buffer)")
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


@pytest.mark.slow(reason="a real async GRPO run on Ray (producer actor, buffer)")
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


STALL_S = 5.0  # how long the in-process engine below holds a sampling call before it raises


def test_a_claim_timeout_in_process_is_one_line_naming_the_key(in_process, tiny_model_path, tmp_path,
                                                                 monkeypatch) -> None:
    """The in-process form of ``test_a_claim_timeout_is_one_line_naming_the_key`` (no Ray actor starts):
    the producer's sampling calls are held until the test ends (or ``STALL_S``, then they raise), so no
    step's rollouts arrive and the configured 0.1 s ends the claim in one line naming the key. Were the
    key ignored (the 600 s default), the held call's error would reach the trainer after ``STALL_S``."""
    import threading

    from posttrain.distributed import worker_group

    released = threading.Event()

    def stall(call, result):
        if not call.kwargs["params"].greedy:  # the producer's sampling; validation's greedy calls pass
            released.wait(STALL_S)
            raise RuntimeError("the stalled engine woke up: the claim did not time out")
        return result

    monkeypatch.setattr(worker_group.RayActor, "__init__", no_ray_actor)
    try:
        with pytest.raises(BufferTimeoutError) as caught:
            in_process.run(grpo, GRPO_YAML, [f"model.path={tiny_model_path}", *LOOP, *SMALL_STEPS,
                                             "grpo.async.enabled=true", "grpo.async.claim_timeout_s=0.1",
                                             f"logger.log_dir={tmp_path}"],
                           {("generation", "generate"): stall})
    finally:
        released.set()  # the producer's thread ends (its error goes nowhere: the run is over)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        "no rollouts for this step within grpo.async.claim_timeout_s=0.1 s"), message


@pytest.mark.slow(reason="a real async GRPO run on Ray (producer actor, buffer)")
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
