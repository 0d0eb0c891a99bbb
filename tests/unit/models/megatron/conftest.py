"""Models shared by the megatron-core tests."""

from __future__ import annotations

import pytest
from harness.model_files import perturbed_copy


@pytest.fixture(scope="module")
def noisy_tiny(tiny_model_path, tmp_path_factory) -> str:
    """The tiny model with every weight perturbed (``perturbed_copy``)."""
    return perturbed_copy(tiny_model_path, tmp_path_factory.mktemp("noisy_tiny"))
