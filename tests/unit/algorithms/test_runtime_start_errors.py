"""A worker that cannot start makes ``setup_runtime`` fail at once with one line, and
leaves no actor behind (the Ray leak check would fail the test otherwise)."""

import re
import shutil

import pytest

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.errors import WorkerStartError


@pytest.mark.slow(reason="Ray actors that fail to load, and their teardown")
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


@pytest.mark.slow(reason="Ray actors that fail to load, and their teardown")
def test_a_generation_worker_that_cannot_load_is_one_line_and_killed(ray_cluster, tiny_model_path, tmp_path):
    """The engine driver's own start-up path (the policy would have failed first in setup)."""
    from posttrain.config import GenerationWorkerConfig
    from posttrain.distributed.ray_cluster import RayVirtualCluster
    from posttrain.models.generation.engine_group import EngineGroup
    from posttrain.models.generation.hf_generation_worker import HfGenerationWorker

    broken = tmp_path / "broken_model"
    shutil.copytree(tiny_model_path, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    cluster = RayVirtualCluster(1, num_cpus=0.5)
    try:
        engines = EngineGroup(cluster, HfGenerationWorker, str(broken), GenerationWorkerConfig(), [0])
        expected = rf"^HfGenerationWorker for '{re.escape(str(broken))}' did not start: \w+"
        with pytest.raises(WorkerStartError, match=expected) as err:
            engines.wait_ready()
        assert "\n" not in str(err.value)
        assert engines.group.workers == []  # killed on the way out (the Ray leak check sees the rest)
    finally:
        cluster.shutdown()
