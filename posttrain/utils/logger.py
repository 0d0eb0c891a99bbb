"""Metric logging: TensorBoard event files + one JSON file, and a console line.

The JSON file has the shape ``tests/check_metrics.py`` reads,
``{"train/loss": {"1": 0.93, "2": 0.81}, ...}`` (metric -> step -> value; steps are string
keys of integers). It is rewritten atomically after every ``log`` call, so a crashed run
still leaves every step it finished, and a reader never sees a half-written file.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.console import Console

from posttrain.utils.progress import StepProgress

# The metrics worth a glance on the console; everything goes to the files.
CONSOLE_KEYS = ("train/loss", "train/reward_mean", "val/accuracy", "val/loss", "train/kl",
                "train/grad_norm", "train/entropy", "timing/step")


class MetricsLogger:
    """Args: log_dir (created; holds ``metrics.json`` and ``tensorboard/``), print_period
    (steps between console lines; step 0, multiples and the last step are printed),
    resume_step (a run resumed after step N: ``metrics.json`` keeps the steps up to N,
    anything the interrupted run logged after N is dropped, and TensorBoard purges steps > N),
    num_steps and name (the run's last step and its name, e.g. "GRPO": a progress bar on a
    terminal and ``step N/T (P%, ETA ...)`` on each line, see ``utils/progress.py``; without
    num_steps the lines say ``step N``)."""

    def __init__(self, log_dir: str | Path, print_period: int = 10, resume_step: int | None = None,
                 num_steps: int | None = None, name: str = "run"):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.json_path = self.log_dir / "metrics.json"
        purge = None if resume_step is None else resume_step + 1
        self.writer = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"), purge_step=purge)
        self.print_period = print_period
        self.metrics: dict[str, dict[str, float]] = {}
        if resume_step is not None and self.json_path.is_file():
            logged = json.loads(self.json_path.read_text())
            for name, series in logged.items():
                kept = {step: value for step, value in series.items() if int(step) <= resume_step}
                if kept:
                    self.metrics[name] = kept
        self.console = Console(highlight=False, soft_wrap=True)
        self.num_steps = num_steps
        self.progress = (StepProgress(name, num_steps, resume_step or 0, self.console)
                         if num_steps is not None else None)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record ``metrics`` (name -> float) at integer ``step``; non-finite values are
        kept as they are (JSON ``NaN``/``Infinity``) so the rule engine can fail on them."""
        for name, value in metrics.items():
            value = float(value)
            self.metrics.setdefault(name, {})[str(step)] = value
            self.writer.add_scalar(name, value, step)
        self.writer.flush()
        tmp = self.json_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.metrics, indent=1, sort_keys=True))
        os.replace(tmp, self.json_path)
        if self.progress is not None:
            self.progress.step_done(step, metrics)
        if step % self.print_period == 0 or step == self.num_steps:
            self._print(metrics, step)

    def _print(self, metrics: dict[str, float], step: int) -> None:
        parts = [f"{k}={_fmt(metrics[k])}" for k in CONSOLE_KEYS if k in metrics]
        where = self.progress.line_prefix(step) if self.progress is not None else f"step {step}"
        console = (self.progress.console if self.progress is not None else None) or self.console
        console.print(f"[bold]{where}[/bold] " + " ".join(parts))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
        self.writer.close()


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)
