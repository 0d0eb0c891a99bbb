"""Tests for posttrain/testing/tb_to_json.py, with real event files from SummaryWriter."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from posttrain.testing import tb_to_json as json_dump_tb_logs
from posttrain.testing.rules import interpreter as metric_rules
from posttrain.testing.tb_to_json import dump_tb_logs

TESTS_DIR = Path(__file__).resolve().parents[2]



CLI = TESTS_DIR / "json_dump_tb_logs.py"


def write_scalars(log_dir: Path, scalars: list[tuple[str, float, int, float]]) -> None:
    """Write ``(tag, value, step, wall_time)`` scalars to a new event file in ``log_dir``."""
    writer = SummaryWriter(log_dir=str(log_dir))
    for tag, value, step, wall_time in scalars:
        writer.add_scalar(tag, value, global_step=step, walltime=wall_time)
    writer.close()


def test_round_trip_nested_dirs_and_numeric_step_order(tmp_path):
    write_scalars(
        tmp_path / "exp" / "train",
        # logged out of order (10 first): the output is still sorted numerically
        [("train/loss", 1.5, s, 1000.0 + i) for i, s in enumerate((10, 1, 2))] + [("train/reward", 0.25, 2, 1002.0)],
    )
    write_scalars(tmp_path / "exp" / "val", [("val/accuracy", 0.5, 0, 999.0)])

    metrics = dump_tb_logs(tmp_path)

    assert metrics == {
        "train/loss": {"1": 1.5, "2": 1.5, "10": 1.5},
        "train/reward": {"2": 0.25},
        "val/accuracy": {"0": 0.5},
    }
    assert list(metrics["train/loss"]) == [
        "1",
        "2",
        "10",
    ]  # numeric, not "1", "10", "2"


def test_later_events_overwrite_earlier_ones(tmp_path):
    # first run logs steps 1..3, then is resumed (a new writer, a new file) at step 2
    write_scalars(
        tmp_path,
        [("train/loss", v, s, 100.0 + s) for s, v in [(1, 0.9), (2, 0.8), (3, 0.7)]],
    )
    write_scalars(
        tmp_path,
        [("train/loss", v, s, 200.0 + s) for s, v in [(2, 0.55), (3, 0.45), (4, 0.4)]],
    )
    # the same step twice inside one file: the second one wins
    write_scalars(tmp_path / "other", [("train/kl", 0.1, 1, 300.0), ("train/kl", 0.2, 1, 301.0)])

    metrics = dump_tb_logs(tmp_path)

    assert metrics["train/loss"] == {"1": 0.9, "2": 0.55, "3": 0.45, "4": 0.4}
    assert metrics["train/kl"] == {"1": 0.2}


def test_keeps_every_scalar_beyond_the_default_reservoir(tmp_path):
    # EventAccumulator samples 10,000 scalars per tag unless told to keep them all.
    n = 10_050
    write_scalars(tmp_path, [("train/loss", float(s), s, float(s)) for s in range(1, n + 1)])
    series = dump_tb_logs(tmp_path)["train/loss"]
    assert len(series) == n and series["5000"] == 5000.0


def test_nan_is_kept_so_the_rules_can_fail_it(tmp_path):
    write_scalars(tmp_path, [("train/grad_norm", float("nan"), 1, 1.0)])
    assert math.isnan(dump_tb_logs(tmp_path)["train/grad_norm"]["1"])


@pytest.mark.parametrize("step", [0, 1, 2], ids=["first-step", "middle-step", "last-step"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_values_keep_their_kind_through_the_output_file(tmp_path, bad, step):
    """NaN stays NaN, +inf +inf, -inf -inf (JSON NaN / Infinity / -Infinity), at any step."""
    values = [0.5, 0.25, 0.125]
    values[step] = bad
    write_scalars(tmp_path / "tb", [("train/loss", v, s, 100.0 + s) for s, v in enumerate(values)])
    out = tmp_path / "metrics.json"
    assert json_dump_tb_logs.main([str(tmp_path / "tb"), "--output", str(out)]) == 0
    dumped = json.loads(out.read_text())["train/loss"]
    assert list(dumped) == ["0", "1", "2"]
    kept = [math.isnan(dumped[str(s)]) if math.isnan(v) else dumped[str(s)] == v for s, v in enumerate(values)]
    assert kept == [True] * 3, dumped


def test_no_event_files_raises(tmp_path):
    (tmp_path / "empty_subdir").mkdir()
    with pytest.raises(FileNotFoundError, match="no TensorBoard event files"):
        dump_tb_logs(tmp_path)


def test_cli_output_file_feeds_check_metrics(tmp_path):
    write_scalars(tmp_path / "tb", [("train/loss", 1.0 / s, s, float(s)) for s in range(1, 6)])
    out = tmp_path / "out" / "metrics.json"

    proc = subprocess.run(
        [sys.executable, str(CLI), str(tmp_path / "tb"), "--output", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    data = metric_rules.load_metrics(out)
    assert data["train/loss"]["4"] == 0.25
    results = metric_rules.evaluate_rules(data, ['mean(data["train/loss"], -2) < mean(data["train/loss"], 1, 3)'])
    assert results[0].passed


def test_cli_prints_json_without_output_flag(tmp_path, capsys):
    write_scalars(tmp_path, [("train/loss", 0.5, 1, 1.0)])
    assert json_dump_tb_logs.main([str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out) == {"train/loss": {"1": 0.5}}


def test_cli_empty_dir_exits_2_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(CLI), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert str(tmp_path) in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
