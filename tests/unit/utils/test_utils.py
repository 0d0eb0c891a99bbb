"""Tests for posttrain.utils: atomic checkpoint directories, the metrics logger, the timer."""

import json
import math
import time
from pathlib import Path

import pytest

from posttrain.utils.checkpoint import atomic_dir
from posttrain.utils.logger import MetricsLogger
from posttrain.utils.timer import Timer


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


# --- atomic_dir ----------------------------------------------------------------------------


def test_atomic_dir_creates_the_target_on_success(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "ckpt"
    with atomic_dir(target) as tmp:
        assert tmp.is_dir() and tmp.parent == target.parent
        assert not target.exists()  # nothing visible until the block succeeds
        (tmp / "weights.bin").write_text("new")
    assert _tree(target) == {"weights.bin": "new"}
    assert sorted(p.name for p in target.parent.iterdir()) == ["ckpt"]


def test_atomic_dir_replaces_an_existing_dir_on_success(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "weights.bin").write_text("old")
    (target / "stale.txt").write_text("only in the old one")
    with atomic_dir(target) as tmp:
        (tmp / "weights.bin").write_text("new")
        assert _tree(target) == {"weights.bin": "old", "stale.txt": "only in the old one"}
    assert _tree(target) == {"weights.bin": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no .old / .tmp leftovers


def test_atomic_dir_keeps_the_old_dir_on_exception(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "weights.bin").write_text("old")
    with pytest.raises(RuntimeError, match="crash mid-save"):
        with atomic_dir(target) as tmp:
            (tmp / "weights.bin").write_text("half")
            raise RuntimeError("crash mid-save")
    assert _tree(target) == {"weights.bin": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_atomic_dir_leaves_nothing_on_exception_without_a_previous_dir(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "x").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_twice_in_a_row(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    for version in ("1", "2"):
        with atomic_dir(target) as tmp:
            (tmp / "v").write_text(version)
    assert _tree(target) == {"v": "2"}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


# --- MetricsLogger -------------------------------------------------------------------------


def test_metrics_json_has_the_documented_shape(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path / "run", print_period=1000)
    try:
        logger.log({"val/accuracy": 0.25}, step=0)
        logger.log({"train/loss": 0.93, "timing/step": 1.5}, step=1)
        logger.log({"train/loss": 0.81}, step=2)
        logger.log({"train/loss": 0.5, "val/accuracy": 0.5}, step=10)
    finally:
        logger.close()
    data = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert data == {
        "val/accuracy": {"0": 0.25, "10": 0.5},
        "train/loss": {"1": 0.93, "2": 0.81, "10": 0.5},
        "timing/step": {"1": 1.5},
    }
    assert all(isinstance(step, str) for series in data.values() for step in series)
    assert logger.metrics == data  # the in-memory copy train() returns


def test_metrics_json_is_complete_after_every_log(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, print_period=1000)
    try:
        logger.log({"train/loss": 1.0}, step=1)
        assert json.loads((tmp_path / "metrics.json").read_text()) == {"train/loss": {"1": 1.0}}
        logger.log({"train/loss": 0.5}, step=2)
        assert json.loads((tmp_path / "metrics.json").read_text()) == {"train/loss": {"1": 1.0, "2": 0.5}}
    finally:
        logger.close()
    assert not list(tmp_path.glob("*.tmp"))


def test_values_are_stored_as_floats(tmp_path: Path) -> None:
    import torch

    logger = MetricsLogger(tmp_path, print_period=1000)
    try:
        logger.log({"train/count": 3, "train/t": torch.tensor(0.5)}, step=1)
    finally:
        logger.close()
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert data == {"train/count": {"1": 3.0}, "train/t": {"1": 0.5}}
    assert isinstance(data["train/count"]["1"], float)


def test_non_finite_values_are_kept(tmp_path: Path) -> None:
    logger = MetricsLogger(tmp_path, print_period=1)
    try:
        logger.log({"train/loss": float("nan"), "train/grad_norm": float("inf")}, step=0)  # printed too
    finally:
        logger.close()
    text = (tmp_path / "metrics.json").read_text()
    assert "NaN" in text and "Infinity" in text
    data = json.loads(text)
    assert math.isnan(data["train/loss"]["0"])
    assert data["train/grad_norm"]["0"] == math.inf


def _same_value(a: float, b: float) -> bool:
    """Equal, with NaN equal to NaN (and +inf never equal to -inf)."""
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("position", [0, 1, 2], ids=["first-step", "middle-step", "last-step"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_values_keep_their_kind_in_both_files(tmp_path: Path, bad: float, position: int) -> None:
    """NaN stays NaN, +inf +inf, -inf -inf in metrics.json and in the event files: never a number."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = [0.5, 0.25, 0.125]
    values[position] = bad
    logger = MetricsLogger(tmp_path, print_period=1000)
    try:
        for step, value in enumerate(values, start=1):
            logger.log({"train/loss": value}, step=step)
    finally:
        logger.close()
    logged = json.loads((tmp_path / "metrics.json").read_text())["train/loss"]
    assert [_same_value(logged[str(s)], v) for s, v in enumerate(values, start=1)] == [True] * 3, logged
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    written = [(s.step, s.value) for s in acc.Scalars("train/loss")]
    assert [s for s, _ in written] == [1, 2, 3]
    assert [_same_value(v, values[i]) for i, (_, v) in enumerate(written)] == [True] * 3, written


def test_tensorboard_event_files_are_written(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, print_period=1000)
    try:
        logger.log({"train/loss": 0.75}, step=1)
        logger.log({"train/loss": 0.5}, step=2)
    finally:
        logger.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    scalars = acc.Scalars("train/loss")
    assert [(s.step, s.value) for s in scalars] == [(1, 0.75), (2, 0.5)]


def test_tensorboard_is_flushed_after_every_log(tmp_path: Path) -> None:
    """A run that crashes before close() still leaves its scalars on disk."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, print_period=1000)
    try:
        logger.log({"train/loss": 0.75}, step=1)
        acc = EventAccumulator(str(tmp_path / "tensorboard"))
        acc.Reload()
        assert [(s.step, s.value) for s in acc.Scalars("train/loss")] == [(1, 0.75)]
    finally:
        logger.close()


def test_console_prints_on_the_print_period(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    logger = MetricsLogger(tmp_path, print_period=2)
    try:
        for step in range(4):
            logger.log({"train/loss": 1.0 / (step + 1), "train/other": 7.0}, step=step)
    finally:
        logger.close()
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("step")]
    assert [line.split()[1] for line in lines] == ["0", "2"]
    assert "train/loss=" in lines[0]
    assert "train/other" not in out  # only the console keys are shown


# --- Timer -----------------------------------------------------------------------------------


def test_timer_accumulates_and_pop_resets() -> None:
    timer = Timer()
    with timer.time("generation"):
        time.sleep(0.02)
    with timer.time("generation"):
        time.sleep(0.02)
    with timer.time("train"):
        pass
    got = timer.pop()
    assert set(got) == {"timing/generation", "timing/train"}
    # a sum of two sleeps, not a timestamp; the upper bound is loose: a loaded machine (load 10-40
    # seen in CI) can stretch a 20 ms sleep far beyond it, and speed belongs in benchmarks
    assert 0.04 <= got["timing/generation"] < 60.0
    assert 0.0 <= got["timing/train"] < got["timing/generation"]
    assert timer.pop() == {}
    with timer.time("train"):
        pass
    assert set(timer.pop(prefix="t/")) == {"t/train"}


def test_timer_records_a_phase_that_raises() -> None:
    timer = Timer()
    with pytest.raises(ValueError):
        with timer.time("refit"):
            time.sleep(0.01)
            raise ValueError("boom")
    assert timer.pop()["timing/refit"] >= 0.01
