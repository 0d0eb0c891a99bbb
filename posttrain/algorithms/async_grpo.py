"""Asynchronous GRPO: the producer samples step t + 1 while the trainer trains on step t.

The loop (:func:`train`) reads top to bottom:

    claim -> staleness filter -> learn -> clear -> pause, refit, resume

A :mod:`rollout producer <posttrain.algorithms.rollout_producer>` actor samples whole steps
into a :class:`~posttrain.rollouts.buffer.RolloutBuffer` actor, each sample tagged with the
weight version that drew it; it runs at most ``k = grpo.async.max_staleness`` steps ahead of
the trainer. Each step the trainer claims one step's samples (N = P * G, FIFO, exclusive),
drops those drawn by weights more than k versions behind it (whole groups; it raises on a
bad tag, it never guesses), trains with the PPO ratio taken against the behaviour (engine) logprobs (off-policy
correction, see :class:`~posttrain.algorithms.loss_functions.ClippedPGLoss`), clears what it
consumed and dropped, and refits the engine while the producer is paused (so each batch is
sampled by one weight version). With k = 0 the producer samples step t + 1 only after step
t's refit: the samples, and so the run, are the synchronous loop's.

Metrics beyond the synchronous loop's: ``async/staleness_mean``, ``async/staleness_max``
(trainer version minus sample version, over the claimed samples), ``async/dropped_samples``,
``async/dropped_fraction``, ``async/buffer_size`` (samples held after the claim: what the
producer has sampled ahead), ``async/overlap_seconds`` (producer sampling time hidden behind
the trainer's work this step) and ``timing/generation`` (here: the trainer's wait for rollouts).
"""

from __future__ import annotations

import time

from posttrain.algorithms import checkpointing
from posttrain.algorithms.async_actors import RolloutBufferClient, RolloutProducerClient
from posttrain.algorithms.evaluation import is_validation_step
from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.grpo_step import learn, to_rollouts, validate
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.runtime import open_run
from posttrain.algorithms.unread_keys import note_reads
from posttrain.data.datasets import load_problems
from posttrain.errors import BufferTimeoutError, ConfigError
from posttrain.models.generation.backends import serves_in_place
from posttrain.models.generation.megatron.in_place import check_in_place
from posttrain.rollouts.filters import StalenessFilter, staleness
from posttrain.rollouts.samples import RolloutSample
from posttrain.utils.timer import Timer
from posttrain.weight_sync.refit import refit

# How often a waiting trainer asks the producer whether it failed (s).
CLAIM_POLL_S = 2.0


def buffer_capacity(cfg: GRPOMasterConfig) -> int:
    """``grpo.async.buffer_size``, default ``(k + 1) * P * G``: the producer may hold k steps
    ahead while the trainer holds its claimed step.

    Raises:
        ConfigError: a set size below that: the producer would stall before the trainer claims.
    """
    acfg = cfg.grpo.async_
    needed = (acfg.max_staleness + 1) * cfg.grpo.num_prompts_per_step * cfg.grpo.completions_per_prompt
    if acfg.buffer_size is not None and acfg.buffer_size < needed:
        raise ConfigError(f"grpo.async.buffer_size={acfg.buffer_size} is below (max_staleness + 1) * "
                          f"num_prompts_per_step * completions_per_prompt = {needed}: the producer would stall")
    return acfg.buffer_size or needed


def claim_step(buffer: RolloutBufferClient, producer: RolloutProducerClient, n: int,
               timeout_s: float) -> list[RolloutSample]:
    """Claim the next step's ``n`` samples, asking the producer between short waits whether it
    failed (its error is raised as itself, not after the whole timeout).

    Raises:
        BufferTimeoutError: no ``n`` samples within ``timeout_s``.
        PosttrainError: the producer's error.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        wait = min(CLAIM_POLL_S, max(deadline - time.monotonic(), 0.01))
        try:
            return buffer.claim(n, timeout_s=wait)
        except BufferTimeoutError:
            producer.check()
            if time.monotonic() >= deadline:
                raise BufferTimeoutError(f"no rollouts for this step within grpo.async.claim_timeout_s="
                                         f"{timeout_s:g} s (the producer is alive but slower)") from None


def staleness_metrics(claimed: list[RolloutSample], dropped: list[RolloutSample], version: int) -> dict[str, float]:
    lags = [staleness(s, version) for s in claimed]
    return {"async/staleness_mean": sum(lags) / len(lags), "async/staleness_max": float(max(lags)),
            "async/dropped_samples": float(len(dropped)), "async/dropped_fraction": len(dropped) / len(claimed)}


def train(cfg: GRPOMasterConfig) -> dict[str, dict[str, float]]:
    """Run asynchronous GRPO as configured (``grpo.async.enabled``); returns the logged metrics.

    Raises:
        ConfigError: ``grpo.async.buffer_size`` too small for ``max_staleness``; an in-place
            megatron engine (the policy's own workers cannot generate while they train).
        BufferTimeoutError: a step's rollouts did not arrive within ``claim_timeout_s``.
        RolloutTagError: a sample's tags are wrong (a producer bug; see ``StalenessFilter``).
    """
    acfg = cfg.grpo.async_
    if serves_in_place(cfg.generation, cfg.generation.backend, cfg.policy.backend):
        check_in_place(cfg.policy.megatron.tensor_model_parallel_size, cfg.generation.num_workers,
                       asynchronous=True, pipeline_parallel_size=cfg.policy.megatron.pipeline_model_parallel_size)
    capacity = buffer_capacity(cfg)
    n = cfg.grpo.num_prompts_per_step * cfg.grpo.completions_per_prompt
    train_problems, val_problems = load_problems(cfg.data)
    loss_fn = ClippedPGLoss(clip_eps=cfg.grpo.clip_eps, kl_coef=cfg.grpo.kl_coef,
                            importance_weight_cap=acfg.importance_weight_cap)
    staleness_filter = StalenessFilter(acfg.max_staleness)
    timer = Timer()
    with open_run(cfg, cfg.grpo.seed, cfg.grpo.num_steps, "GRPO (async)",
                  with_reference=cfg.grpo.kl_coef > 0) as (rt, logger, resumed_at):
        if resumed_at == 0:
            logger.log(validate(rt, val_problems, cfg), step=0)
        buffer = RolloutBufferClient(capacity)
        producer = RolloutProducerClient(rt.engine, buffer, rt.model_path, train_problems, cfg, resumed_at + 1)
        print(f"async GRPO: the producer samples up to {acfg.max_staleness} step(s) ahead, rollout buffer of "
              f"{capacity} samples", flush=True)
        sampled_before = 0.0  # the producer's sampling seconds at the end of the last step
        try:
            for step in range(resumed_at + 1, cfg.grpo.num_steps + 1):
                start = time.perf_counter()
                with timer.time("generation"):  # what sampling the trainer still waits for
                    claimed = claim_step(buffer, producer, n, acfg.claim_timeout_s)
                version = rt.policy.weight_version
                kept, dropped = staleness_filter.split(claimed, version)
                metrics = staleness_metrics(claimed, dropped, version)
                metrics["async/buffer_size"] = float(buffer.status().size - len(claimed))
                trained = None  # every sample stale: nothing to train on this step
                if kept:
                    learned, trained = learn(rt, to_rollouts(kept), cfg, loss_fn, timer, version, off_policy=True)
                    metrics.update(learned)
                if acfg.max_staleness > 0:
                    # Only an occasional fresh step would have it: a series with gaps reads as a run
                    # that stopped early. The weight-sync probe checks the engine at every refit.
                    metrics.pop("train/token_mult_prob_error", None)
                buffer.clear(consumed=kept, dropped=dropped)
                with timer.time("refit"):  # the producer waits, so each batch has one weight version
                    sampled = producer.pause()
                    metrics.update(refit(rt.policy, rt.engine, rt.probe))
                if is_validation_step(step, cfg.grpo.val_period, cfg.grpo.num_steps):
                    with timer.time("validation"):
                        metrics.update(validate(rt, val_problems, cfg))
                producer.resume(step)
                waited = timer.peek("generation")
                metrics["async/overlap_seconds"] = max(sampled - sampled_before - waited, 0.0)
                sampled_before = sampled
                metrics.update(rt.resource_metrics(timer, start, trained))
                logger.log(metrics, step)
                checkpointing.after_step(rt.policy, cfg, step, cfg.grpo.num_steps)
            note_reads(cfg, producer.config_reads())  # the producer ends before the run's check
        finally:
            producer.kill()
            buffer.kill()
    return logger.metrics
