"""The filter that keeps vLLM's per-refit rotary-embedding warning out of the job log
drops that line only: a layer that really missed its weights is still reported."""

import logging

import pytest

from posttrain.models.generation.vllm.vllm_generation_worker import RotaryReloadWarningFilter


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("vllm", logging.WARNING, __file__, 1, msg, args, None)


@pytest.mark.parametrize("layer", ["RotaryEmbedding", "Llama3RotaryEmbedding", "YaRNScalingRotaryEmbedding"])
def test_rotary_reload_warning_dropped(layer):
    assert not RotaryReloadWarningFilter().filter(record("%s: Failed to load weights", layer))


@pytest.mark.parametrize("msg", [
    "RMSNorm: Failed to load weights",  # a real partial refit
    "QKVParallelLinear: Failed to load weights",
    "Reloading weights inplace...",
    "RotaryEmbedding: Delayed processing",
])
def test_other_lines_kept(msg):
    assert RotaryReloadWarningFilter().filter(record(msg))
