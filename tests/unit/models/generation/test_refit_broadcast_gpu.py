"""Refit over NCCL: the policy and a Hugging Face engine on a GPU each (two GPUs), real Ray.

The weights go from the policy's GPU to the engine's in buckets, never through host memory.
Checked by what must follow: the driver picks the broadcast, the engine then scores exactly
as the trainer in fp32 (within the bf16 bound in bf16-mixed), a training step without a
refit is caught by the probe, and a second refit is exact again. Skipped with fewer than 2 GPUs.
"""

from __future__ import annotations

import pytest
import torch
from unit.models.generation.refit_helpers import train_step

from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.weight_sync.probe import PROBE_BOUNDS
from posttrain.weight_sync.refit import refit, refit_transport

_GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu(2), pytest.mark.skipif(_GPUS < 2, reason=f"needs 2 GPUs, found {_GPUS}")]


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_refit_between_two_gpus_is_an_nccl_broadcast_and_the_engine_serves_the_new_weights(
        ray_cluster, tiny_model_path, precision) -> None:
    rt = setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(lr=1e-2, precision=precision, tf32=False),
                       GenerationConfig(backend="hf", colocated=False, refit_bucket_mb=1),  # a GPU each
                       ClusterConfig(gpus_per_worker=1), seed=0)
    try:
        assert refit_transport(rt.policy, rt.generation) == "broadcast"
        bound = PROBE_BOUNDS[precision]
        exact = 1e-6 if precision == "fp32" else bound
        for _ in range(2):
            train_step(rt)
            stale = rt.probe.measure(rt.policy, rt.generation)["train/refit_logprob_error"]
            assert stale > bound, stale
            error = refit(rt.policy, rt.generation, rt.probe)["train/refit_logprob_error"]
            assert error <= exact, error
            assert rt.generation.weight_version() == rt.policy.weight_version
    finally:
        rt.shutdown()
