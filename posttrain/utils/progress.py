"""Progress of a training loop on the console: where it is, how long is left, how it is doing.

On a terminal, a ``rich`` progress bar (step / total, elapsed, ETA, the last loss and reward)
stays at the bottom while the periodic metric lines scroll above it. Elsewhere (CI logs, a
pipe) a bar would only add escape codes, so the periodic lines carry the same facts:
``step 10/40 (25%, ETA 0:01:12) train/loss=...``.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# What the bar shows of the last step, in this order (those the step logged).
BAR_KEYS = (("train/loss", "loss"), ("train/reward_mean", "reward"), ("val/accuracy", "val acc"),
            ("val/loss", "val loss"))


def eta_seconds(started: float, now: float, done: int, remaining: int) -> float | None:
    """Seconds left at the mean pace so far: ``(now - started) / done * remaining``; None before
    the first step is done (no pace yet)."""
    if done <= 0:
        return None
    return (now - started) / done * remaining


def _fmt(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class StepProgress:
    """Args: name (e.g. "GRPO"), total (the run's last step), first (the step this process
    starts after: 0, or N when resumed from step N), console (a terminal one gets the bar).

    :meth:`step_done` after each step; :meth:`line_prefix` gives the periodic line's
    ``step N/T (P%, ETA h:mm:ss)``; :meth:`close` removes the bar.
    """

    def __init__(self, name: str, total: int, first: int, console: Console):
        self.total = total
        self.first = first
        self.started = time.perf_counter()
        self.done = 0
        self.bar: Progress | None = None
        if console.is_terminal and total > first:
            self.bar = Progress(TextColumn(f"[bold]{name}[/bold]"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                TextColumn("{task.fields[last]}"), console=console, transient=True)
            self.task = self.bar.add_task(name, total=total, completed=first, last="")
            self.bar.start()

    @property
    def console(self) -> Console | None:
        """The bar's console (print through it so lines appear above the bar), or None."""
        return self.bar.console if self.bar is not None else None

    def step_done(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step`` (> ``first``) finished with ``metrics``; validation-only logs (step 0) are ignored."""
        if step <= self.first:
            return
        self.done = step - self.first
        if self.bar is not None:
            last = "  ".join(f"{label} {_fmt(metrics[key])}" for key, label in BAR_KEYS if key in metrics)
            self.bar.update(self.task, completed=step, last=last)

    def line_prefix(self, step: int) -> str:
        """``step N/T (P%, ETA h:mm:ss)``: ETA once a step has finished, none at step 0."""
        percent = 100 * step / self.total if self.total else 100.0
        eta = eta_seconds(self.started, time.perf_counter(), self.done, self.total - step)
        left = f", ETA {timedelta(seconds=round(eta))}" if eta is not None and step < self.total else ""
        return f"step {step}/{self.total} ({percent:.0f}%{left})"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
