"""``policy.compile``: the Hugging Face policy worker compiles its trained model's forward in
place, and trains as the eager worker does.

On a CPU the key's reach is checked without running the compiled graph (inductor needs a C
compiler, which a CPU-only CI machine need not have); on a GPU a compiled bf16-mixed worker
and an eager one score and take an optimizer step alike. The speed is measured by
``benchmarks/train_step_bench.py --compile``.
"""

from __future__ import annotations

import pytest
import torch

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import PolicyConfig, PolicyWorkerConfig
from posttrain.data.batch import make_batch
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl

_GPUS = torch.cuda.device_count()


@pytest.mark.parametrize("compile_", [True, False])
def test_policy_compile_compiles_the_trained_models_forward(tiny_model_path, compile_: bool) -> None:
    worker = HfPolicyWorkerImpl(tiny_model_path, PolicyWorkerConfig.model_validate({"compile": compile_}))
    assert (worker.model._compiled_call_impl is not None) is compile_
    assert worker.reference._compiled_call_impl is None  # the reference is scored eagerly
    # compiled in place: the state dict keeps the model's own names (refit, checkpoints)
    assert not [name for name in worker.model.state_dict() if "_orig_mod" in name]


def test_compile_with_the_megatron_backend_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"compile=true needs backend=hf") as err:
        PolicyConfig.model_validate({"compile": True, "backend": "megatron"})
    assert str(err.value).count("compile=true") == 1


@pytest.mark.gpu(1)
@pytest.mark.skipif(_GPUS < 1, reason=f"needs 1 GPU, found {_GPUS}")
def test_a_compiled_worker_trains_as_the_eager_one(tiny_model_path) -> None:
    def worker(compile_: bool) -> HfPolicyWorkerImpl:
        cfg = PolicyWorkerConfig.model_validate({"compile": compile_, "device": "cuda", "precision": "bf16-mixed",
                                                 "lr": 1e-3, "train_global_batch_size": 8,
                                                 "train_micro_batch_size": 8, "reference": False})
        return HfPolicyWorkerImpl(tiny_model_path, cfg)

    g = torch.Generator().manual_seed(0)
    batch = make_batch([torch.randint(3, 17, (5,), generator=g).tolist() for _ in range(8)],
                       [torch.randint(3, 17, (4,), generator=g).tolist() for _ in range(8)], pad_id=0)
    extra = {"advantages": torch.linspace(-1, 1, 8)}
    eager, compiled = worker(False), worker(True)
    mask = batch.completion_mask.bool()
    gap = (eager.get_logprobs(batch) - compiled.get_logprobs(batch))[mask].abs().max().item()
    assert gap < 2e-2  # bf16 rounding in a fused kernel differs from the eager one's
    metrics = [w.train(batch, extra, ClippedPGLoss()) for w in (eager, compiled)]
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-2)
    before = worker(False).get_weights()
    moved = [max((w.get_weights()[k] - before[k]).abs().max().item() for k in before) for w in (eager, compiled)]
    assert moved[1] == pytest.approx(moved[0], rel=0.1) and moved[1] > 1e-4  # both took the step
