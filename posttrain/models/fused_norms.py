"""RMSNorm layers of a transformers model computed by torch's fused ``rms_norm`` kernel.

transformers' RMSNorm (Zhang & Sennrich 2019, eq. 4: ``w * x / sqrt(mean(x^2) + eps)``) is a
composite of seven elementwise kernels (upcast, square, mean, add, rsqrt, multiply, scale),
each reading and writing the activation, forward and backward, twice per layer. torch's
``rms_norm`` does it in one kernel each way. On an H100, swapping them alone made a plain
bf16-mixed train step of the 0.39B Qwen2 1.26x faster (eager; one run, see docs/testing.md).

Only the classes whose arithmetic is exactly ``weight * normalise(x.float()).to(x.dtype)`` are
swapped (:data:`STANDARD_RMSNORMS`); Gemma's ``(1 + weight)`` and any class not listed keep
their own module. The swap keeps each layer's ``weight`` Parameter object and its name, so
state dicts, optimizers, tied references, LoRA and FSDP2 see the same parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# transformers' RMSNorm classes that compute weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)
STANDARD_RMSNORMS = frozenset({"Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm"})


class FusedRMSNorm(torch.nn.Module):
    """transformers' RMSNorm through torch's fused ``rms_norm``, with its dtype rules.

    Input ``[..., H]``, weight ``[H]``. A float32 input with a float32 weight (fp32 and
    bf16-mixed runs: the residual stream is float32) goes through the one fused kernel, weight
    included. Any other input is normalised in float32 by the fused kernel, cast back to its
    dtype and then scaled by the weight, as transformers does (a bfloat16 input with a float32
    weight returns float32 there too).

    Args:
        weight: the replaced layer's ``[H]`` Parameter (the same object, not a copy).
        eps: the replaced layer's ``variance_epsilon``.
    """

    def __init__(self, weight: torch.nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Normalised and scaled ``hidden_states`` (see the class docstring for the dtype)."""
        shape = self.weight.shape
        if hidden_states.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(hidden_states, shape, self.weight, self.variance_epsilon)
        normalised = F.rms_norm(hidden_states.float(), shape, None, self.variance_epsilon)
        return self.weight * normalised.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"


def use_fused_rms_norm(model: torch.nn.Module) -> int:
    """Replace, in place, every RMSNorm of ``model`` whose class is in
    :data:`STANDARD_RMSNORMS` with a :class:`FusedRMSNorm` holding the same weight; returns how
    many were replaced (0 for a model with none, which is left as it was)."""
    targets = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
               if type(child).__name__ in STANDARD_RMSNORMS]
    for parent, name, child in targets:
        setattr(parent, name, FusedRMSNorm(child.get_parameter("weight"), float(vars(child)["variance_epsilon"])))
    return len(targets)
