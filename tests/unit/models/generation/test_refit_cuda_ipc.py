"""Refit over CUDA IPC: the policy and a Hugging Face engine on one GPU (half each), real Ray.

The weights never leave the GPU: the engine opens the policy's IPC handles and copies device
to device. Checked by what must follow: the driver sees both on one GPU, the engine then
scores exactly as the trainer in fp32 (and within the bf16 bound in bf16-mixed), a training
step without a refit is caught by the probe, and a second refit (new tensors, the first
ones released) is exact again. Skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.algorithms.runtime import setup_runtime
from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig
from posttrain.data.batch import make_batch
from posttrain.weight_sync.probe import PROBE_BOUNDS
from posttrain.weight_sync.refit import refit, refit_transport

_GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu(1), pytest.mark.skipif(_GPUS < 1, reason=f"needs 1 GPU, found {_GPUS}")]


def train_once(rt) -> None:
    prompts = [list(rt.chat.prompt(f"{a}+1=")) for a in range(8)]
    completions = [list(rt.tokenizer.encode(str(a + 1))) for a in range(8)]
    batch = make_batch(prompts, completions, rt.tokenizer.pad_token_id)
    old = rt.policy.get_logprobs(batch)
    rt.policy.train(batch, {"advantages": torch.linspace(-1, 1, 8), "old_logprobs": old}, ClippedPGLoss())


@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_colocated_refit_goes_over_cuda_ipc_and_the_engine_serves_the_new_weights(
        ray_cluster, tiny_model_path, precision) -> None:
    rt = setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(lr=1e-2, precision=precision),
                       GenerationConfig(backend="hf"), ClusterConfig(cpus_per_worker=0.5, gpus_per_worker=0.5),
                       seed=0)
    try:
        assert refit_transport(rt.policy, rt.generation) == "cuda_ipc"
        bound = PROBE_BOUNDS[precision]
        exact = 1e-6 if precision == "fp32" else bound
        for _ in range(2):  # the second refit shares new tensors; the first ones are released
            train_once(rt)
            stale = rt.probe.measure(rt.policy, rt.generation)["train/refit_logprob_error"]
            assert stale > bound, stale  # the engine still serves the old weights
            error = refit(rt.policy, rt.generation, rt.probe)["train/refit_logprob_error"]
            assert error <= exact, error
            assert rt.generation.weight_version() == rt.policy.weight_version
    finally:
        rt.shutdown()
