"""How refit weights travel from the policy worker to the engines without the driver.

Three transports, chosen per refit by :func:`choose_refit_transport`:

- ``object_store``: the policy worker puts its state dict (CPU tensors) into Ray's object
  store and the driver passes the reference on.
- ``cuda_ipc``: the policy and every engine hold the same GPU (colocated), so the weights need
  not leave it: :class:`CudaIpcWeights` carries CUDA IPC handles of the policy's GPU tensors (a
  few hundred bytes each), and each engine opens them and copies device to device. The policy
  keeps the shared tensors alive until its next refit.
- ``broadcast``: a collective from the policy worker to the engines (``weight_sync.broadcast``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

Transport = Literal["cuda_ipc", "broadcast", "object_store", "in_place"]


def choose_refit_transport(setting: str, policy_gpu: str | None, engine_gpus: list[str | None]) -> Transport:
    """The refit transport for ``generation.refit_transport`` = ``setting`` ("auto" or
    "object_store"), the policy's GPU UUID and the engines' (None: a CPU).

    ``cuda_ipc`` when every engine holds the policy's GPU; ``broadcast`` when all of them are
    on CPUs, or each on a GPU of its own (NCCL cannot have two ranks on one GPU); else
    ``object_store`` (also whenever ``setting`` says so).
    """
    if setting == "object_store":
        return "object_store"
    if policy_gpu is not None and all(uuid == policy_gpu for uuid in engine_gpus):
        return "cuda_ipc"
    on_cpus = policy_gpu is None and all(uuid is None for uuid in engine_gpus)
    gpus = [policy_gpu, *engine_gpus]
    own_gpus = None not in gpus and len(set(gpus)) == len(gpus)
    return "broadcast" if on_cpus or own_gpus else "object_store"


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
