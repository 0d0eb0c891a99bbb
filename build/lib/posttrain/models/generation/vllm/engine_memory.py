"""How much memory a vLLM engine may take, derived from the model and what is free now.

vLLM's ``gpu_memory_utilization`` is a fraction of the *whole* device (on the CPU build:
of the NUMA node's RAM), so a hard-coded value is wrong on the next machine: 0.92 fails on
a CPU box, and 0.05 failed inside a Ray actor here. Instead the KV cache is sized from the
workload (sequences x tokens x bytes per token) and checked against the free memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.errors import ConfigError

GIB = 1024**3
# Floor on the KV cache: tiny models need only kilobytes, but vLLM allocates blocks of
# 16 tokens for every sequence it schedules at once; 64 MiB keeps hundreds in flight.
MIN_KV_CACHE_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class KvCacheShape:
    """What one token costs in the KV cache: layers, key/value heads, head size, dtype size (bytes)."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        """Key and value of every layer for one token, bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


def kv_cache_shape(hf_config: Any, dtype_bytes: int = 4) -> KvCacheShape:
    """The KV-cache shape of a Hugging Face decoder config (``num_hidden_layers``,
    ``num_key_value_heads`` or ``num_attention_heads``, ``head_dim`` or hidden/heads)."""
    heads = int(hf_config.num_attention_heads)
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or int(hf_config.hidden_size) // heads
    return KvCacheShape(int(hf_config.num_hidden_layers), int(kv_heads), int(head_dim), dtype_bytes)


def kv_cache_bytes(shape: KvCacheShape, max_num_seqs: int, max_model_len: int) -> int:
    """KV cache for ``max_num_seqs`` sequences of ``max_model_len`` tokens at once, bytes
    (at least :data:`MIN_KV_CACHE_BYTES`)."""
    return max(MIN_KV_CACHE_BYTES, shape.bytes_per_token * max_num_seqs * max_model_len)


def check_fits(kv_bytes: int, free_bytes: int, total_bytes: int, where: str) -> float:
    """The fraction of the device the KV cache takes; raises when it does not fit.

    Args:
        kv_bytes: the KV cache to allocate, bytes.
        free_bytes: memory free on the device now, bytes.
        total_bytes: the device's memory, bytes (> 0).
        where: "host RAM" or "GPU memory", for the message.

    Returns:
        ``kv_bytes / total_bytes``, the ``gpu_memory_utilization`` that matches it.

    Raises:
        ConfigError: ``kv_bytes`` exceeds half of the free memory (the other half stays
            for the weights, activations and other processes), naming both sizes.
    """
    if kv_bytes > free_bytes // 2:
        raise ConfigError(
            f"vLLM KV cache of {kv_bytes / GIB:.2f} GiB does not fit in half of the free {where} "
            f"({free_bytes / GIB:.2f} GiB): lower generation.max_num_seqs or generation.max_model_len"
        )
    return kv_bytes / total_bytes


def free_memory(device: str) -> tuple[int, int]:
    """(free, total) bytes of host RAM (``device="cpu"``) or of the current CUDA device."""
    if device == "cpu":
        import psutil

        mem = psutil.virtual_memory()
        return int(mem.available), int(mem.total)
    import torch

    free, total = torch.cuda.mem_get_info()
    return int(free), int(total)
