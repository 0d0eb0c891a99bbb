"""A run's check that every config key it was given was read by some code of the run.

The config's YAML file and ``key=value`` overrides set keys; :mod:`posttrain.config_reads`
records which keys the driver and the workers read. A key set off its default that nothing read
is a setting the run silently goes without (a vLLM key on an HF engine, a Megatron key on an HF
policy, a LoRA alpha at rank 0, ``checkpoint.keep_last`` without ``checkpoint.dir``). It is
checked twice (``runtime.open_run``):

- at the end of set-up (workers up, checkpoint restored, before the first step): every key set
  but :data:`READ_AFTER_SET_UP` must have been read, else the run stops before training
  (``ConfigError``, exit 2);
- at the end of a run that trained at least one step: every key set must have been read, else the
  run fails after its last step, its metrics written (``ConfigError``, exit 2).

The keys of a part the run chose not to start are not checked (:func:`not_started`): the
``generation`` keys of a run without an engine (SFT validating by loss, a GRPO replay), a replay's
``grpo.val_period``.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from posttrain.config import spelled
from posttrain.config_reads import record_of
from posttrain.errors import ConfigError

# Keys whose first read may come after set-up (at a step, a validation, a refit, a checkpoint or the
# export), so the set-up check cannot tell that nothing will read them: the end of the run checks
# them. A key missing here that a correct run first reads in its loop would stop that run at
# set-up (the in-process runs of tests/integration/test_config_plumbing.py set every key and run
# both checks), so the list errs on the side of keys some runs read at set-up.
READ_AFTER_SET_UP: dict[str, str] = {
    **{f"grpo.{k}": "a GRPO step" for k in ("advantage_estimator", "drop_zero_variance_groups", "val_period",
                                             "save_rollouts", "async.claim_timeout_s")},
    **{f"sft.{k}": "an SFT step or validation" for k in ("val_period", "val_loss_size", "stop_at_val_accuracy")},
    **{f"generation.{k}": "sampling, validation or scoring" for k in ("max_new_tokens", "temperature", "top_k",
                                                                       "top_p")},
    **{f"generation.{k}": "a refit" for k in ("refit_transport", "refit_bucket_mb")},
    # dir: at set-up only to find a checkpoint to resume from (not with checkpoint.resume=never)
    **{f"checkpoint.{k}": "a checkpoint or the export" for k in ("dir", "save_period", "keep_last", "save_path")},
    # a policy worker's train or scoring call, not its construction (on one backend or both)
    **{f"policy.{k}": "a train or scoring call" for k in (
        "train_micro_batch_size", "logprob_batch_size", "sequence_packing", "max_grad_norm", "warmup_steps",
        "reference_timing_period")},
}


def unread_keys(cfg: BaseModel, at_set_up: bool) -> list[str]:
    """``key=value`` of each key ``cfg``'s file or overrides set off its default that its record
    holds no read of (the driver's, and the workers' merged with :func:`note_reads`);
    ``at_set_up``: but those of :data:`READ_AFTER_SET_UP`. Empty for a config without a record
    (built, not loaded)."""
    record = record_of(cfg)
    if record is None:
        return []
    return [f"{key}={spelled(value)}" for key, value in record.set_keys.items()
            if key not in record.read and not (at_set_up and key in READ_AFTER_SET_UP)
            and not any(key == m or (m.endswith(".") and key.startswith(m)) for m in record.moot)]


def check_reads(cfg: BaseModel, at_set_up: bool) -> None:
    """Fail on the keys :func:`unread_keys` finds.

    Raises:
        ConfigError: one line naming each unread key and its value.
    """
    unread = unread_keys(cfg, at_set_up)
    if unread:
        when = "by the end of set-up" if at_set_up else "in the whole run"
        raise ConfigError(f"config keys set but read by nothing {when}: {', '.join(unread)} (this run's backends, "
                          "algorithm and settings do not use them: remove them, or set what they apply to)")


def not_started(cfg: BaseModel, *keys: str) -> None:
    """Say that this run does not start the part ``keys`` configure (a key, or a prefix ending in
    ``.``: ``generation.`` for a run without an engine): they are not checked."""
    record = record_of(cfg)
    if record is not None:
        record.moot.update(keys)


def note_reads(cfg: BaseModel, reads: Iterable[str]) -> None:
    """Add the keys workers read (their ``config_reads()``) to ``cfg``'s record."""
    record = record_of(cfg)
    if record is not None:
        record.read.update(reads)
