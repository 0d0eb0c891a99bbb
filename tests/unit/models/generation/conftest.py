"""Fixtures of the generation tests."""

from __future__ import annotations

import pytest
import torch

from posttrain.models.generation.hf_generation_worker import HfGenerationWorkerImpl


@pytest.fixture(scope="module")
def engine(tiny_model_path) -> HfGenerationWorkerImpl:
    """The Hugging Face engine's worker in this process (no Ray), on the tiny model."""
    threads = torch.get_num_threads()
    worker = HfGenerationWorkerImpl(tiny_model_path)
    torch.set_num_threads(threads)  # the worker sets its own; keep the test process's
    return worker
