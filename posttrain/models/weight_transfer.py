"""How refit weights travel from the policy worker to the engines without the driver.

By default the policy worker puts its state dict (CPU tensors) into Ray's object store and
the driver passes the reference on. When the policy and every engine hold the same GPU
(colocated), the weights need not leave it: :class:`CudaIpcWeights` carries CUDA IPC
handles of the policy's GPU tensors (a few hundred bytes each), and each engine opens them
and copies device to device. The policy keeps the shared tensors alive until its next refit.
"""

from __future__ import annotations

from typing import Any

import torch


class CudaIpcWeights:
    """Hugging Face-named GPU tensors of another process on this GPU, as CUDA IPC handles.

    Build with :meth:`share` in the process that owns the tensors (it must keep them alive
    until every receiver has copied them); send the object (it pickles small); call
    :meth:`open` in the receiver, on the same physical GPU.
    """

    def __init__(self, handles: dict[str, tuple[Any, tuple[Any, ...]]]):
        self.handles = handles

    @classmethod
    def share(cls, weights: dict[str, torch.Tensor]) -> CudaIpcWeights:
        """Handles of ``weights`` (CUDA tensors).

        Raises:
            ValueError: a tensor is not on a CUDA device (IPC cannot share it).
        """
        from torch.multiprocessing.reductions import reduce_tensor

        on_cpu = [name for name, t in weights.items() if not t.is_cuda]
        if on_cpu:
            raise ValueError(f"CUDA IPC shares CUDA tensors only; on the CPU: {on_cpu[:3]}")
        return cls({name: reduce_tensor(t) for name, t in weights.items()})

    def open(self) -> dict[str, torch.Tensor]:
        """The shared tensors, as views of the owner's GPU memory (copy before the owner frees them)."""
        return {name: rebuild(*args) for name, (rebuild, args) in self.handles.items()}

    def __len__(self) -> int:
        return len(self.handles)


def tensor_identity(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """(storage address, offset, shape): equal for names that share one tensor (a tied
    embedding), so a refit sends those bytes once."""
    return tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape)


def materialize(weights: dict[str, torch.Tensor] | CudaIpcWeights) -> dict[str, torch.Tensor]:
    """The state dict an engine loads: ``weights`` itself, or the tensors its IPC handles open."""
    return weights.open() if isinstance(weights, CudaIpcWeights) else weights


def node_ip() -> str:
    """This process's node address in the Ray cluster (127.0.0.1 outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def gpu_uuid(device: str | torch.device) -> str | None:
    """The UUID of the GPU a worker's model is on (this process's CUDA device 0: a Ray actor's
    GPU), None when ``device`` is the CPU (a CPU worker on a GPU machine sees the GPU too, but
    its tensors are not there): two workers with the same UUID share one physical GPU."""
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(0).uuid)
