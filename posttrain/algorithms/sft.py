"""SFT: supervised fine-tuning with the masked NLL of the response tokens.

:func:`train` reads top to bottom: sample -> tokenize -> train -> validate -> log. It
doubles as the warm start of GRPO: ``stop_at_val_accuracy`` ends it on a *measured*
held-out greedy accuracy (a tiny model's accuracy sits low and then jumps, so a fixed step
count gives warm starts of very different quality).
"""

from __future__ import annotations

import time

from pydantic import Field, model_validator

from posttrain.algorithms import checkpointing
from posttrain.algorithms.evaluation import greedy_accuracy, is_validation_step, reference_batch
from posttrain.algorithms.loss_functions import NLLLoss
from posttrain.algorithms.runtime import Runtime, open_run
from posttrain.config import RunConfig, Section
from posttrain.data.batch import TokenBatch
from posttrain.data.datasets import load_problems
from posttrain.data.sampler import EpochSampler
from posttrain.data.types import MathProblem
from posttrain.ops import masked_mean
from posttrain.utils.timer import Timer
from posttrain.weight_sync.refit import refit


class SFTConfig(Section):
    num_steps: int = Field(1000, ge=1)
    batch_size: int = Field(64, ge=1, description="problems per step")
    val_period: int = Field(50, ge=0, description="steps between validations; 0: only first and last")
    val_loss_size: int = Field(256, ge=1, description="held-out problems scored for val/loss")
    val_accuracy: bool = Field(True, description="also greedy-decode the held-out problems (short answers)")
    stop_at_val_accuracy: float | None = Field(None, gt=0, le=1)
    seed: int = 0


class SFTMasterConfig(RunConfig):
    """Top-level schema of ``examples/configs/sft_*.yaml``."""

    sft: SFTConfig = SFTConfig()

    @model_validator(mode="after")
    def _no_sampling_truncation(self) -> SFTMasterConfig:
        # The policy scores its tokens under the sampling distribution (top-k / top-p
        # included), right for sampled tokens; SFT never samples (validation is greedy), and
        # a truncated NLL would stop pushing down the tokens outside the set.
        gen = self.generation
        if gen.top_k != 0 or gen.top_p != 1.0:
            raise ValueError(f"generation.top_k={gen.top_k}, top_p={gen.top_p}: SFT never samples (its validation "
                             "is greedy); leave them at 0 and 1.0")
        return self


def validate(rt: Runtime, val_batch: TokenBatch, val: list[MathProblem], cfg: SFTMasterConfig) -> dict[str, float]:
    """``val/loss`` (token-mean NLL of held-out solutions) and, if enabled, ``val/accuracy``
    with the weight-sync probe's errors of the refit before it (``train/refit_*``; a stale
    engine would score the trainer's checkpoint wrongly, and the run stops on it)."""
    logprobs = rt.policy.get_logprobs(val_batch)
    metrics = {"val/loss": -masked_mean(logprobs, val_batch.completion_mask).item()}
    if cfg.sft.val_accuracy:
        metrics.update(refit(rt.policy, rt.engine, rt.probe))
        metrics["val/accuracy"] = greedy_accuracy(rt.engine, rt.chat, val, cfg.generation.max_new_tokens)
    return metrics


def _reached_target(metrics: dict[str, float], target: float | None) -> bool:
    return target is not None and metrics.get("val/accuracy", 0.0) >= target


def train(cfg: SFTMasterConfig) -> dict[str, dict[str, float]]:
    """Run SFT as configured; returns the logged metrics (also in ``<log_dir>/metrics.json``)."""
    train_problems, val_problems = load_problems(cfg.data)
    sampler = EpochSampler(train_problems, cfg.sft.batch_size, cfg.sft.seed)
    timer = Timer()
    # An engine only when validation generates: SFT itself never samples.
    with open_run(cfg, cfg.sft.seed, cfg.sft.num_steps, "SFT",
                  with_generation=cfg.sft.val_accuracy, with_reference=False) as (rt, logger, resumed_at):
        val_batch = reference_batch(rt.chat, val_problems[: cfg.sft.val_loss_size])
        if resumed_at == 0:
            metrics = validate(rt, val_batch, val_problems, cfg)
            logger.log(metrics, step=0)
        else:  # the stop check reads what the interrupted run logged at its last step
            metrics = {k: v[str(resumed_at)] for k, v in logger.metrics.items() if str(resumed_at) in v}
        for step in range(resumed_at + 1, cfg.sft.num_steps + 1):
            if _reached_target(metrics, cfg.sft.stop_at_val_accuracy):
                # the run ends at step - 1: checkpoint it unless after_step already did
                last = step - 1
                if (cfg.checkpoint.dir is not None and last > resumed_at
                        and not checkpointing.is_due(last, cfg.checkpoint, cfg.sft.num_steps)):
                    checkpointing.save(rt.policy, cfg, last)
                break
            start = time.perf_counter()
            with timer.time("data"):
                batch = reference_batch(rt.chat, sampler.batch(step))
            with timer.time("train"):
                trained = rt.policy.train(batch, {}, NLLLoss())
            metrics = {f"train/{k}": v for k, v in trained.metrics.items()}
            if is_validation_step(step, cfg.sft.val_period, cfg.sft.num_steps):
                with timer.time("validation"):
                    metrics.update(validate(rt, val_batch, val_problems, cfg))
            metrics.update(rt.resource_metrics(timer, start, trained))
            logger.log(metrics, step)
            checkpointing.after_step(rt.policy, cfg, step, cfg.sft.num_steps)
    return logger.metrics
