"""The policy workers a backend-agnostic test runs against: ``hf`` everywhere, ``lora`` (the
``hf`` backend training LoRA adapters of rank 8 over all linear layers) everywhere, and
``megatron`` on a GPU with the ``mcore`` extra (``--mcore-only``), in fp32 so that all must
agree with the same independent computations.

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_x(backend, tiny_model_path):
        policy = make_worker(backend, tiny_model_path, lr=1e-3)

Megatron workers built here share this process's ``torch.distributed`` group (tensor
parallel size 1); the first one starts it.
"""

from __future__ import annotations

from typing import Any

import pytest

from posttrain.config import PolicyConfig, PolicyWorkerConfig
from posttrain.distributed.ray_cluster import free_port

BACKENDS = [
    pytest.param("hf", id="hf"),
    pytest.param("lora", id="lora"),
    pytest.param("megatron", id="megatron", marks=[pytest.mark.mcore, pytest.mark.gpu(1)]),
]
# The backends that train every weight: what a full fine-tuning replay (tests/integration/replay.py)
# can be compared with, gradient norms included.
FULL_FINETUNE_BACKENDS = [b for b in BACKENDS if b.id != "lora"]


LORA_RANK = 8


def free_tcp_address() -> str:
    """``tcp://127.0.0.1:<port>`` with a port free now."""
    return f"tcp://127.0.0.1:{free_port('127.0.0.1')}"


def worker_cfg(backend: str, temperature: float = 1.0, precision: str = "fp32", tensor_parallel: int = 1,
               device: str | None = None, tf32: bool = False, top_k: int = 0, top_p: float = 1.0,
               pipeline_parallel: int = 1, layer_spec: str = "torch", **policy: Any) -> PolicyWorkerConfig:
    """What a policy worker is constructed with: ``PolicyConfig`` keys (``policy``) + the run's
    sampling (temperature, top_k, top_p), device (default "cuda" for megatron, "cpu" for hf
    and lora) and megatron layout. TF32 is off by default: the backends must agree with
    independent fp32 computations."""
    megatron = {"tensor_model_parallel_size": tensor_parallel, "pipeline_model_parallel_size": pipeline_parallel,
                "layer_spec": layer_spec}
    if backend == "lora":
        backend, policy = "hf", {"lora": {"rank": LORA_RANK}, **policy}
    cfg = PolicyConfig.model_validate({**policy, "backend": backend, "megatron": megatron, "precision": precision,
                                   "tf32": tf32})
    return PolicyWorkerConfig.of(cfg, temperature, device or ("cuda" if backend == "megatron" else "cpu"),
                                 top_k=top_k, top_p=top_p)


def make_worker(backend: str, model_path: str, temperature: float = 1.0, seed: int = 0, **policy: Any) -> Any:
    """A fresh in-process policy worker of ``backend`` (the ``*Impl`` class, no Ray); keyword
    arguments are ``worker_cfg``'s (precision, tensor_parallel, device) or ``PolicyConfig`` keys."""
    cfg = worker_cfg(backend, temperature, **policy)
    if cfg.backend == "hf":
        from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl

        return HfPolicyWorkerImpl(model_path, cfg, seed=seed)
    from posttrain.models.policy.megatron_policy_worker import MegatronPolicyWorkerImpl

    return MegatronPolicyWorkerImpl(model_path, cfg, seed=seed, init_method=free_tcp_address())
