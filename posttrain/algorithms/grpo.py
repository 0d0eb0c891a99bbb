"""GRPO: Group Relative Policy Optimization (Shao et al., 2024, DeepSeekMath, arXiv:2402.03300),
the synchronous loop.

Each step samples ``completions_per_prompt`` (G) completions for each of
``num_prompts_per_step`` (P) prompts, rewards them with the math verifier, turns rewards
into group-relative advantages, and takes a clipped policy-gradient step with a k3 KL
penalty towards the frozen reference policy. :func:`train` reads top to bottom:

    generate -> reward -> advantages -> logprobs -> train -> refit -> validate -> log

With ``grpo.save_rollouts`` each step's scored rollouts are also written to disk; with
``grpo.load_rollouts`` they are read back instead of sampled (``posttrain/algorithms/rollout_recording.py``):
no engine starts, so nothing is refit or validated, and a replay from the recorded run's
start trains exactly as it did.

The step's pieces live in :mod:`.grpo_step` (the asynchronous loop shares them), the schema in
:mod:`.grpo_config`; ``GRPOMasterConfig`` is re-exported here, the entry point's config.
"""

from __future__ import annotations

import time

from posttrain.algorithms import async_grpo, checkpointing
from posttrain.algorithms import rollout_recording as recording
from posttrain.algorithms.evaluation import is_validation_step
from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.grpo_step import (
    check_on_policy,
    generate_rollouts,
    learn,
    score_rollouts,
    to_rollouts,
    to_samples,
    validate,
)
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.runtime import open_run
from posttrain.algorithms.unread_keys import not_started
from posttrain.data.datasets import load_problems
from posttrain.data.sampler import EpochSampler
from posttrain.utils.timer import Timer
from posttrain.weight_sync.refit import refit

__all__ = ["GRPOMasterConfig", "train"]


def train(cfg: GRPOMasterConfig) -> dict[str, dict[str, float]]:
    """Run GRPO as configured; returns the logged metrics (also in ``<log_dir>/metrics.json``).
    With ``grpo.async.enabled`` the asynchronous loop runs instead (:mod:`.async_grpo`).

    Raises:
        DataError: ``grpo.load_rollouts`` lacks a step of the run, or a step's file is not a
            recording of this run's shape (before anything starts, or at that step).
    """
    if cfg.grpo.async_.enabled:
        return async_grpo.train(cfg)
    g, replay = cfg.grpo.completions_per_prompt, cfg.grpo.load_rollouts
    if replay is not None:
        not_started(cfg, "grpo.val_period")  # a replay validates nothing (and starts no engine)
        recording.check_recording(replay, range(1, cfg.grpo.num_steps + 1))
        print(f"GRPO: training on the rollouts recorded in {replay} (no engine: nothing is refit or validated)",
              flush=True)
    train_problems, val_problems = load_problems(cfg.data)
    loss_fn = ClippedPGLoss(clip_eps=cfg.grpo.clip_eps, kl_coef=cfg.grpo.kl_coef)
    sampler = EpochSampler(train_problems, cfg.grpo.num_prompts_per_step, cfg.grpo.seed)
    timer = Timer()
    with open_run(cfg, cfg.grpo.seed, cfg.grpo.num_steps, "GRPO", with_generation=replay is None,
                  with_reference=cfg.grpo.kl_coef > 0) as (rt, logger, resumed_at):
        if resumed_at == 0 and replay is None:
            logger.log(validate(rt, val_problems, cfg), step=0)
        for step in range(resumed_at + 1, cfg.grpo.num_steps + 1):
            start = time.perf_counter()
            version = rt.policy.weight_version
            if replay is not None:
                with timer.time("generation"):  # read back: the recorded run's samples and rewards
                    rollouts = to_rollouts(recording.load_step(replay, step, cfg.grpo.num_prompts_per_step, g,
                                                               rt.chat.prompt))
            else:
                with timer.time("generation"):
                    rollouts = generate_rollouts(rt.engine, rt.chat, sampler.batch(step), cfg, step)
                    check_on_policy(rollouts, version, step)
                with timer.time("reward"):
                    score_rollouts(rt.tokenizer, rollouts)
            if cfg.grpo.save_rollouts:
                recording.save_step(cfg.grpo.save_rollouts, step, to_samples(rollouts, step, g), g)
            metrics, trained = learn(rt, rollouts, cfg, loss_fn, timer, version)
            if replay is None:
                with timer.time("refit"):  # + the weight-sync probe, which raises over its bound
                    metrics.update(refit(rt.policy, rt.engine, rt.probe))
                if is_validation_step(step, cfg.grpo.val_period, cfg.grpo.num_steps):
                    with timer.time("validation"):
                        metrics.update(validate(rt, val_problems, cfg))
            metrics.update(rt.resource_metrics(timer, start, trained))
            logger.log(metrics, step)
            checkpointing.after_step(rt.policy, cfg, step, cfg.grpo.num_steps)
    return logger.metrics
