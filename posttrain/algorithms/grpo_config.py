"""GRPO's configuration schema: the ``grpo`` section (and its ``grpo.async`` part) and the
top-level :class:`GRPOMasterConfig` of ``examples/configs/grpo_*.yaml``. Read by the sync loop
(:mod:`.grpo`), the asynchronous one (:mod:`.async_grpo`) and the step they share
(:mod:`.grpo_step`); it imports none of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from posttrain.config import RunConfig, Section


class AsyncGRPOConfig(Section):
    """Asynchronous GRPO (``grpo.async``, see :mod:`posttrain.algorithms.async_grpo`): a
    producer actor samples the next steps' rollouts while the trainer trains."""

    enabled: bool = Field(False, description="run the asynchronous loop: a producer actor samples the next steps "
                          "while the trainer trains")
    max_staleness: int = Field(
        1, ge=0, description="k: the producer runs at most k steps ahead and samples drawn by weights more than k "
        "versions behind the trainer are dropped; 0 reproduces on-policy GRPO")
    buffer_size: int | None = Field(
        None, ge=1, description="samples the rollout buffer holds (None: (k + 1) * P * G, the least that never "
        "stalls the producer)")
    importance_weight_cap: float | None = Field(
        None, gt=0, description="None: the PPO ratio is taken against the behaviour (engine) logprobs; C: against "
        "the trainer's logprobs, times the truncated weight min(pi_trainer / pi_behaviour, C)")
    claim_timeout_s: float = Field(600.0, gt=0, description="seconds the trainer waits for a step's rollouts")


class GRPOConfig(Section):
    """The algorithm's own knobs."""

    # The file spells ``async`` (only that: the attribute name ``async_`` is no config key).
    model_config = ConfigDict(extra="forbid", strict=True, serialize_by_alias=True)

    num_steps: int = Field(200, ge=1)
    num_prompts_per_step: int = Field(16, ge=1)
    completions_per_prompt: int = Field(8, ge=2, description="G, the group size")
    advantage_estimator: Literal["grpo", "dr_grpo"] = "grpo"
    drop_zero_variance_groups: bool = True
    clip_eps: float = Field(0.2, gt=0)
    kl_coef: float = Field(0.0, ge=0)
    val_period: int = Field(50, ge=0, description="steps between validations; 0: only first and last")
    seed: int = 0
    # ``async`` is a Python keyword: the attribute is ``async_``, the config key ``grpo.async``.
    async_: AsyncGRPOConfig = Field(AsyncGRPOConfig(), alias="async")


class GRPOMasterConfig(RunConfig):
    """Top-level schema of ``examples/configs/grpo_*.yaml``."""

    grpo: GRPOConfig = GRPOConfig()
