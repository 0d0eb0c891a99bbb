"""A worker that cannot start makes ``setup_runtime`` fail at once with one line, and
leaves no actor behind (the Ray leak check would fail the test otherwise)."""

import re
import shutil

import pytest

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.errors import WorkerStartError


def test_unloadable_weights_fail_at_setup_in_one_line(ray_cluster, tiny_model_path, tmp_path):
    # A model directory the driver accepts (config.json, tokenizer) whose weights the
    # workers cannot read: the failure must come from setup, not from the first step.
    broken = tmp_path / "broken_model"
    shutil.copytree(tiny_model_path, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    expected = rf"^hf policy worker for '{re.escape(str(broken))}' did not start: \w+"
    with pytest.raises(WorkerStartError, match=expected) as err:
        setup_runtime(ModelConfig(path=str(broken)), PolicyConfig(), GenerationConfig(backend="hf"),
                      ClusterConfig(cpus_per_worker=0.5), seed=0)
    assert "\n" not in str(err.value)
