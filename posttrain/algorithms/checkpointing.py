"""Periodic training checkpoints and resuming from them (``checkpoint.dir``, ``save_period``,
``keep_last``, ``resume``), the same for every algorithm.

A checkpoint ``step_<N>/`` holds what continuing needs to be indistinguishable from never
stopping: ``policy/`` (the policy worker's weights in Hugging Face format, optimizer and
lr-scheduler state, weight version), ``driver_state.pt`` (the step and the driver's python,
numpy and torch RNG states) and ``config.yaml`` (the config it was written with). The data
sampler is a pure function of the step (``EpochSampler.batch``) and so are the engines'
sampling seeds (``SamplingParams.seed``), so neither has state to keep. The frozen reference
policy is rebuilt from ``model.path``, as at the start of the run. The metric logger
continues from the step (``MetricsLogger(resume_step=N)``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from posttrain.config import CheckpointConfig
from posttrain.errors import ConfigError
from posttrain.utils.checkpoint import COMPLETE, is_complete, latest_complete, save_step
from posttrain.utils.interrupts import StopRequested, stop_requested

DRIVER_STATE = "driver_state.pt"


def find_resume(cfg: CheckpointConfig) -> Path | None:
    """The checkpoint a run continues from: ``resume: never`` none; ``auto`` the newest complete
    one in ``dir`` (none when there is none, or no ``dir``); else the path given.

    Raises:
        ConfigError: a given path that is not a complete checkpoint.
    """
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        return latest_complete(Path(cfg.dir)) if cfg.dir else None
    path = Path(cfg.resume)
    if not is_complete(path):
        raise ConfigError(f"checkpoint.resume '{cfg.resume}' is not a complete checkpoint (no {COMPLETE} marker)")
    return path


def is_due(step: int, cfg: CheckpointConfig, num_steps: int) -> bool:
    """Whether to write a checkpoint after ``step``: every ``save_period`` steps and after the
    last step, when ``dir`` is set."""
    # save_period is read before the last-step test: a resumed run whose only step is the last read it too
    return cfg.dir is not None and ((cfg.save_period > 0 and step % cfg.save_period == 0) or step == num_steps)


def save(policy: Any, run_cfg: Any, step: int) -> Path:
    """Write checkpoint ``step`` of the run into ``run_cfg.checkpoint.dir`` (atomically; older
    ones beyond ``keep_last`` are deleted). ``policy`` is the driver-side ``Policy``."""
    cfg: CheckpointConfig = run_cfg.checkpoint
    assert cfg.dir is not None

    def write(tmp: Path) -> None:
        policy.save_checkpoint(str(tmp / "policy"))
        rng = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        torch.save({"step": step, "rng": rng}, tmp / DRIVER_STATE)
        (tmp / "config.yaml").write_text(yaml.safe_dump(run_cfg.model_dump(), sort_keys=False))

    return save_step(Path(cfg.dir), step, write, cfg.keep_last)


def after_step(policy: Any, run_cfg: Any, step: int, num_steps: int) -> None:
    """What the loop does after logging ``step``: a periodic checkpoint when due, and, when a
    stop was requested (``posttrain.utils.interrupts``) before the last step, a checkpoint of
    this step (with ``save_period`` > 0) and :class:`StopRequested`."""
    saved = None
    if is_due(step, run_cfg.checkpoint, num_steps):
        saved = save(policy, run_cfg, step)
    signum = stop_requested()
    if signum is None or step == num_steps:  # the run is complete anyway: end it normally
        return
    if saved is None and run_cfg.checkpoint.dir is not None and run_cfg.checkpoint.save_period > 0:
        saved = save(policy, run_cfg, step)
    raise StopRequested(signum, step, str(saved) if saved else None)


def restore(policy: Any, path: Path) -> int:
    """Load checkpoint ``path`` into the policy worker(s) and this process's RNGs; returns its
    step. The caller refits the generation engine afterwards."""
    state = torch.load(path / DRIVER_STATE, weights_only=False)
    policy.load_checkpoint(str(path / "policy"))
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])
    torch.set_rng_state(state["rng"]["torch"])
    return int(state["step"])
