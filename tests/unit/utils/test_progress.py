"""The console's progress: a bar on a terminal, ``step N/T (P%, ETA ...)`` lines elsewhere."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from posttrain.utils import progress as progress_module
from posttrain.utils.logger import MetricsLogger
from posttrain.utils.progress import StepProgress, eta_seconds


def test_eta_is_the_mean_pace_times_the_steps_left():
    assert eta_seconds(started=100.0, now=130.0, done=3, remaining=7) == pytest.approx(70.0)
    assert eta_seconds(started=100.0, now=130.0, done=0, remaining=7) is None


def test_lines_carry_the_place_in_the_run_and_an_eta(monkeypatch):
    clock = iter([0.0, 20.0, 20.0])  # start, then the line of step 2 (resumed after step 1)
    monkeypatch.setattr(progress_module.time, "perf_counter", lambda: next(clock))
    p = StepProgress("GRPO", total=11, first=1, console=Console(file=io.StringIO()))
    assert p.bar is None  # not a terminal: no bar
    p.step_done(2, {"train/loss": 1.0})
    assert p.line_prefix(2) == "step 2/11 (18%, ETA 0:03:00)"  # 20 s a step, 9 steps left


def test_the_last_and_the_validation_only_step_have_no_eta():
    p = StepProgress("SFT", total=4, first=0, console=Console(file=io.StringIO()))
    assert p.line_prefix(0) == "step 0/4 (0%)"
    p.step_done(4, {})
    assert p.line_prefix(4) == "step 4/4 (100%)"


def test_a_terminal_gets_a_bar_with_the_last_loss_and_reward():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    p = StepProgress("GRPO", total=4, first=0, console=console)
    assert p.bar is not None
    p.step_done(1, {"train/loss": 0.25, "train/reward_mean": 0.5, "timing/step": 3.0})
    p.bar.refresh()
    p.close()
    text = out.getvalue()
    assert "GRPO" in text and "1/4" in text and "loss 0.25  reward 0.5" in text and "ETA" in text


def test_the_logger_prints_every_period_and_the_last_step(tmp_path, capsys):
    logger = MetricsLogger(tmp_path, print_period=2, num_steps=3, name="SFT")
    for step in range(4):
        logger.log({"train/loss": 1.0 / (step + 1)}, step)
    logger.close()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == ["step 0/3", "step 2/3", "step 3/3"]
    assert "ETA" in lines[1] and lines[2].endswith("train/loss=0.25")
