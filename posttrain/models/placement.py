"""The one check of a backend whose workers run on CUDA only (the Megatron policy, the megatron
engine): refused before Ray starts, in one line, where no GPU can hold them."""

from __future__ import annotations

from posttrain.errors import ConfigError


def require_gpus(setting: str, gpus_per_worker: float, gpus_found: int | None, why: str) -> None:
    """Raise unless this machine has a GPU and ``cluster.gpus_per_worker`` gives each worker some.

    Args:
        setting: the key and value that asked for CUDA, e.g. "policy.backend=megatron".
        gpus_per_worker: ``cluster.gpus_per_worker``.
        gpus_found: GPUs visible to this process (None: ``torch.cuda.device_count()``).
        why: the reason, for the message.

    Raises:
        ConfigError: "<setting> needs 1 GPU, found 0 (<why>)", or "<setting> needs GPUs for its
            workers: set cluster.gpus_per_worker > 0".
    """
    if gpus_found is None:
        import torch

        gpus_found = torch.cuda.device_count()
    if gpus_found == 0:
        raise ConfigError(f"{setting} needs 1 GPU, found 0 ({why})")
    if gpus_per_worker <= 0:
        raise ConfigError(f"{setting} needs GPUs for its workers: set cluster.gpus_per_worker > 0")
