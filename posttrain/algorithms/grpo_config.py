"""GRPO's configuration schema: the ``grpo`` section (and its ``grpo.async`` part) and the
top-level :class:`GRPOMasterConfig` of ``examples/configs/grpo_*.yaml``. Read by the sync loop
(:mod:`.grpo`), the asynchronous one (:mod:`.async_grpo`) and the step they share
(:mod:`.grpo_step`); it imports none of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

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
    save_rollouts: str | None = Field(
        None, description="directory to write each step's scored rollouts to (format: "
        "posttrain/algorithms/rollout_recording.py)")
    load_rollouts: str | None = Field(
        None, description="directory of recorded rollouts to train on instead of sampling: no engine starts, "
        "nothing is validated or refit")
    # ``async`` is a Python keyword: the attribute is ``async_``, the config key ``grpo.async``.
    async_: AsyncGRPOConfig = Field(AsyncGRPOConfig(), alias="async")

    @model_validator(mode="after")
    def _recording_is_synchronous(self) -> GRPOConfig:
        if self.async_.enabled and (self.save_rollouts or self.load_rollouts):
            key = "save_rollouts" if self.save_rollouts else "load_rollouts"
            raise ValueError(f"{key} records and replays the synchronous loop; with async.enabled=true its "
                             "samples are not one step's on-policy batch (set async.enabled=false)")
        if self.save_rollouts and self.load_rollouts:
            raise ValueError(f"save_rollouts='{self.save_rollouts}' and load_rollouts='{self.load_rollouts}': a "
                             "replay samples nothing new to record (set one)")
        return self


class GRPOMasterConfig(RunConfig):
    """Top-level schema of ``examples/configs/grpo_*.yaml``."""

    grpo: GRPOConfig = GRPOConfig()

    def output_paths(self) -> list[tuple[str, str | None]]:
        return [*super().output_paths(), ("grpo.save_rollouts", self.grpo.save_rollouts)]
