"""torch's foreach kernels as megatron-core's multi-tensor ops, where neither Transformer Engine nor
Apex installs.

megatron-core's optimizer computes the gradient norm, clips, and copies master weights into the
model through ``multi_tensor_applier`` with Transformer Engine's or Apex's fused multi-tensor
kernels. Without either (the machines this project runs on), it falls back to
``megatron.core.utils.local_multi_tensor_*``: Python loops over the tensors, and a norm that reads
every tensor's norm back to the host, one device sync per tensor (~170 for a 0.4B Qwen2) in every
step. :func:`install` puts torch's own multi-tensor (``torch._foreach_*``) kernels in their place:
the same arithmetic, one launch per group of tensors, one sync per step (the caller's ``.item()``).
"""

from __future__ import annotations

from typing import Any

import torch


def foreach_l2_norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                    per_tensor: bool, *args: Any) -> tuple[torch.Tensor, None]:
    """The L2 norm over every tensor of ``tensor_lists[0]`` (``sqrt(sum_i ||t_i||^2)``), as a ``[1]``
    fp32 tensor on the tensors' device, with no host sync (``multi_tensor_l2norm``'s contract:
    ``(norm, per-tensor norms or None)``).

    Raises:
        ValueError: ``per_tensor`` norms, which megatron's gradient clipping never asks for.
    """
    if per_tensor:
        raise ValueError("foreach_l2_norm computes the total norm only (per_tensor=True asked)")
    norms = torch._foreach_norm(tensor_lists[0])  # one 0-d norm per tensor, on the device
    return torch.linalg.vector_norm(torch.stack([n.float() for n in norms])).reshape(1), None


def foreach_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                  scale: float) -> None:
    """``dst_i = src_i * scale`` for ``[src, dst] = tensor_lists`` (``multi_tensor_scale``'s contract;
    ``scale`` 1.0 copies, e.g. fp32 master weights into bf16 model weights, rounding once)."""
    src, dst = tensor_lists
    if scale == 1.0:
        torch._foreach_copy_(dst, src)
    elif all(a is b for a, b in zip(src, dst, strict=True)):
        torch._foreach_mul_(dst, scale)
    else:
        torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


def foreach_applier(op: Any, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], *args: Any) -> Any:
    """``multi_tensor_applier(op, noop_flag, tensor_lists, *args)``: calls ``op`` on all tensors at once."""
    return op(0, noop_flag, tensor_lists, *args)


def install() -> bool:
    """Put the foreach ops in megatron-core's optimizer modules where they hold its local (Python
    loop) fallbacks; returns whether they do now. Idempotent; leaves Transformer Engine's or Apex's
    kernels alone."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    if clip_grads.l2_norm_impl not in (utils.local_multi_tensor_l2_norm, foreach_l2_norm):
        return False  # a fused implementation is installed
    for module in (clip_grads, optimizer):
        module.multi_tensor_applier = foreach_applier
        module.multi_tensor_scale_impl = foreach_scale
    clip_grads.l2_norm_impl = foreach_l2_norm
    return True
