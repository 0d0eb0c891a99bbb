"""Tests for posttrain/testing/rules/loading.py: the metrics JSON and TensorBoard directories as rule input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from posttrain.testing.rules.errors import MetricsFileError
from posttrain.testing.rules.interpreter import evaluate_rule
from posttrain.testing.rules.loading import load_metrics, load_tb_dir, validate_metrics
from posttrain.testing.rules.series import Series


def write_json(tmp_path: Path, obj: object) -> Path:
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(obj))
    return path


class TestValidate:
    def test_string_sorted_steps_become_numeric_order(self, tmp_path):
        # the logger writes json.dumps(sort_keys=True): "1", "10", "2"
        path = tmp_path / "m.json"
        path.write_text('{"train/loss": {"1": 1.0, "10": 0.1, "2": 0.5}}')
        series = load_metrics(path)["train/loss"]
        assert isinstance(series, Series)
        assert list(series.steps) == [1, 2, 10] and list(series.step_values) == [1.0, 0.5, 0.1]

    def test_plain_number_metric_is_kept(self, tmp_path):
        data = load_metrics(write_json(tmp_path, {"eval/score": 0.7, "train/loss": {"1": 1.0}}))
        assert data["eval/score"] == 0.7
        assert evaluate_rule(data, 'data["eval/score"] > 0.5').passed

    @pytest.mark.parametrize("step", ["01", "-1", "1.5", "", " 1", "1 ", "²", "one"])
    def test_non_canonical_step_is_named(self, tmp_path, step):
        path = write_json(tmp_path, {"train/loss": {"1": 1.0, step: 2.0}})
        with pytest.raises(MetricsFileError) as info:
            load_metrics(path)
        assert str(path) in str(info.value) and "'train/loss'" in str(info.value) and repr(step) in str(info.value)

    def test_newline_inside_a_step_key_is_not_two_steps(self):
        with pytest.raises(MetricsFileError, match=r"'1\\n2'"):
            validate_metrics({"m": {"1\n2": 1.0}}, "x.json")

    @pytest.mark.parametrize("value", [True, None, "0.5", [0.5]])
    def test_non_number_value_is_named(self, value):
        with pytest.raises(MetricsFileError, match=r"'train/loss' step '2'"):
            validate_metrics({"train/loss": {"1": 1.0, "2": value}}, "x.json")

    def test_nan_and_infinity_load_and_fail_the_rules_that_read_them(self, tmp_path):
        path = tmp_path / "m.json"
        path.write_text('{"train/kl": {"1": NaN, "2": Infinity}}')
        data = load_metrics(path)
        assert math.isnan(data["train/kl"]["1"])
        assert not evaluate_rule(data, 'max(data["train/kl"]) < 1').passed

    def test_empty_metric_loads_and_fails_when_read(self, tmp_path):
        data = load_metrics(write_json(tmp_path, {"train/loss": {}}))
        result = evaluate_rule(data, 'len(data["train/loss"]) == 0')
        assert not result.passed and "has no values" in result.message

    def test_invalid_json_says_where(self, tmp_path):
        path = tmp_path / "m.json"
        path.write_text('{"train/loss": {"1": 0.5,}}')
        with pytest.raises(MetricsFileError, match=r"line 1 column \d+"):
            load_metrics(path)


class TestTensorBoard:
    def test_event_files_load_like_the_json(self, tmp_path):
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
        for step in (10, 1, 2):  # out of order on purpose
            writer.add_scalar("train/loss", 1.0 / step, global_step=step)
        writer.add_scalar("val/accuracy", 0.5, global_step=0)
        writer.close()
        data = load_tb_dir(tmp_path / "tb")
        assert list(data["train/loss"].steps) == [1, 2, 10]
        assert data["train/loss"]["10"] == 0.1 and data["val/accuracy"]["0"] == 0.5

    def test_directory_without_event_files(self, tmp_path):
        with pytest.raises(MetricsFileError, match="no TensorBoard event files"):
            load_tb_dir(tmp_path)

    def test_corrupt_event_file_is_a_usage_error(self, tmp_path):
        (tmp_path / "events.out.tfevents.1.host").write_bytes(b"\x00not an event file" * 10)
        with pytest.raises(MetricsFileError, match="no scalars"):
            load_tb_dir(tmp_path)


class TestUsageErrorMessages:
    """What the CLI prints for input it cannot read: the path, and the reason, word for word."""

    def test_a_missing_metrics_file_is_named_with_the_os_reason(self, tmp_path):
        path = tmp_path / "missing.json"
        with pytest.raises(MetricsFileError) as e:
            load_metrics(path)
        assert str(e.value) == f"cannot read metrics file {path}: [Errno 2] No such file or directory: '{path}'"

    def test_an_event_file_the_reader_chokes_on_names_the_directory_and_the_error(self, tmp_path, monkeypatch):
        import posttrain.testing.tb_to_json as tb_to_json

        def broken(log_dir):
            raise ValueError("truncated record")

        monkeypatch.setattr(tb_to_json, "dump_tb_logs", broken)
        with pytest.raises(MetricsFileError) as e:
            load_tb_dir(tmp_path)
        assert str(e.value) == f"cannot read TensorBoard logs under {tmp_path}: ValueError: truncated record"

    def test_a_bad_scalar_in_the_event_files_is_named_as_from_tensorboard(self, tmp_path, monkeypatch):
        import posttrain.testing.tb_to_json as tb_to_json

        monkeypatch.setattr(tb_to_json, "dump_tb_logs", lambda log_dir: {"train/loss": {"01": 1.0}})
        with pytest.raises(MetricsFileError) as e:
            load_tb_dir(tmp_path)
        assert str(e.value) == (
            f"metrics file {tmp_path} (TensorBoard): metric 'train/loss' step '01': "
            "expected a step number such as '1', got '01'"
        )


class TestValidateMessages:
    def test_a_metric_may_mix_int_and_float_values(self):
        data = validate_metrics({"x": {"1": 1, "2": 0.5}, "y": {}}, "m.json")
        assert list(data["x"].step_values) == [1, 0.5] and len(data["y"]) == 0

    def test_a_top_level_that_is_not_an_object_is_named(self):
        with pytest.raises(MetricsFileError) as e:
            validate_metrics([1, 2], "m.json")
        assert str(e.value) == "metrics file m.json: top level must be an object, got list"

    def test_a_metric_that_is_neither_steps_nor_a_number_is_named(self):
        with pytest.raises(MetricsFileError) as e:
            validate_metrics({"x": "abc"}, "m.json")
        assert str(e.value) == "metrics file m.json: metric 'x' is 'abc', not {step: value} or a number"
