"""Fixtures shared by every test tier (unit, integration, nightly)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (2 CPUs) for the whole session; tests place workers on it."""
    import ray

    from posttrain.distributed.ray_cluster import init_ray

    init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory) -> str:
    """The default tiny model (arithmetic charset), built once per session."""
    from posttrain.models.tiny import TinyModelConfig, build_tiny_model

    return str(build_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("cache")))
