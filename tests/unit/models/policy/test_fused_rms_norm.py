"""``policy.fused_rms_norm``: the HF policy's RMSNorm layers run torch's fused ``rms_norm``
and compute what transformers' modules compute, with the same parameters.

Independent reference: transformers' own RMSNorm classes (Qwen2, Qwen3, Llama, Mistral), run
next to the swapped module on the same input and weight. ``eps`` is 0.5 and the inputs small,
so a dropped or wrong ``eps`` shows; the weight is random, so a dropped weight shows.

Bounds, AMD EPYC (this CPU) and the GPU host's Xeon pinned to 2 threads: float32 outputs and
gradients are bit-identical to transformers' on both (0.0 over 4 classes x 3 seeds); bf16 and
mixed inputs take the same float32 arithmetic as transformers before the one rounding, so the
bound is one bf16 rounding of the output (2^-8 relative).
"""

from __future__ import annotations

import importlib

import pytest
import torch

from posttrain.config import PolicyWorkerConfig
from posttrain.models.fused_norms import STANDARD_RMSNORMS, FusedRMSNorm, use_fused_rms_norm
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl

EPS = 0.5


def _transformers_norm(name: str, hidden: int, dtype: torch.dtype) -> torch.nn.Module:
    module = importlib.import_module(f"transformers.models.{name[:-len('RMSNorm')].lower()}.modeling_"
                                     f"{name[:-len('RMSNorm')].lower()}")
    norm = getattr(module, name)(hidden, eps=EPS).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=torch.Generator().manual_seed(1)))
    return norm


@pytest.mark.parametrize("name", sorted(STANDARD_RMSNORMS))
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                    (torch.bfloat16, torch.float32)], ids=["fp32", "bf16", "bf16-input-fp32-weight"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fused_norm_computes_what_transformers_computes(name, dtypes, seed) -> None:
    """Output (values and dtype) and the gradients of the input and the weight."""
    input_dtype, weight_dtype = dtypes
    reference = _transformers_norm(name, 48, weight_dtype)
    fused = FusedRMSNorm(torch.nn.Parameter(reference.weight.detach().clone()), reference.variance_epsilon)
    x = (0.3 * torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(seed))).to(input_dtype)
    outs, grads = [], []
    for norm in (reference, fused):
        xi = x.clone().requires_grad_(True)
        out = norm(xi)
        out.float().square().sum().backward()
        outs.append(out)
        grads.append((xi.grad, norm.weight.grad))
    assert outs[1].dtype == outs[0].dtype
    exact = dtypes == (torch.float32, torch.float32)
    rel = 0.0 if exact else 2.0**-8
    torch.testing.assert_close(outs[1].float(), outs[0].float(), rtol=rel, atol=1e-6 if exact else 1e-3)
    for got, expected in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got.float(), expected.float(), rtol=2 * rel, atol=1e-5 if exact else 1e-2)


def test_the_swap_keeps_the_parameters_and_the_logits(tiny_model_path) -> None:
    """Every norm of the tiny Qwen2 swapped (2 per layer + the final one), the same Parameter
    objects under the same names, and the logits of the model unchanged (fp32: bit-identical)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    before = dict(model.named_parameters())
    ids = torch.randint(3, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    assert use_fused_rms_norm(model) == 2 * model.config.num_hidden_layers + 1
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert not [m for m in model.modules() if type(m).__name__ in STANDARD_RMSNORMS]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, expected)


def test_a_norm_of_another_arithmetic_is_left_alone() -> None:
    """Gemma's norm scales by (1 + weight): not in the list, not swapped."""
    GemmaRMSNorm = type("GemmaRMSNorm", (torch.nn.Module,), {})  # noqa: N806 (a class, named as transformers')
    model = torch.nn.Sequential(GemmaRMSNorm())
    assert use_fused_rms_norm(model) == 0 and type(model[0]).__name__ == "GemmaRMSNorm"


@pytest.mark.parametrize("fused", [True, False])
def test_the_key_reaches_the_policy_and_its_reference(tiny_model_path, fused: bool) -> None:
    worker = HfPolicyWorkerImpl(tiny_model_path, PolicyWorkerConfig.model_validate({"fused_rms_norm": fused}))
    for model in (worker.model, worker.reference):
        kinds = {type(m).__name__ for m in model.modules() if "RMSNorm" in type(m).__name__}
        assert kinds == ({"FusedRMSNorm"} if fused else {"Qwen2RMSNorm"})
