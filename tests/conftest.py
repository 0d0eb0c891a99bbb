"""Fixtures shared by every test tier (unit, integration, nightly), and the harness plugin.

The harness (``tests/harness``): the ``tracker`` fixture, ``gpu(n)`` skips, the Ray leak
check, unit_results.json; see docs/testing.md. ``pytester`` drives the harness's own tests.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["harness.plugin", "pytester"]


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (2 CPUs) for the whole session, started by the first test that asks.

    Tests that do not ask never import Ray. Actors and placement groups a test leaves alive
    make it error (``harness.ray_leaks``); hold shared ones in a module-scoped fixture.
    """
    import ray

    from posttrain.distributed.ray_cluster import init_ray

    try:
        init_ray(num_cpus=2)
    except Exception as e:  # noqa: BLE001 -- only Ray's start-up timeout is retried
        # On a loaded 2-core machine Ray's dashboard agent can miss the raylet's start-up
        # deadline; a second start (imports now in the page cache) is much faster.
        if "timed out during startup" not in str(e):
            raise
        ray.shutdown()
        init_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    """The default tiny model (arithmetic charset), built into the cache once (prepare_unit_test_assets)."""
    from unit.prepare_unit_test_assets import tiny_model_path as prepared

    return str(prepared())


@pytest.fixture(scope="module")
def hf_runtime(ray_cluster, tiny_model_path):
    """Policy + one Hugging Face generation worker on Ray (``Runtime``), lr 1e-2, probe on.

    Module scope: one pair of actors per test module. Tests train it, so a module's tests
    must not assume untouched weights; each module gets a fresh one.
    """
    from posttrain.algorithms.runtime import setup_runtime
    from posttrain.config import ClusterConfig, GenerationConfig, ModelConfig, PolicyConfig

    rt = setup_runtime(ModelConfig(path=tiny_model_path), PolicyConfig(lr=1e-2), GenerationConfig(backend="hf"),
                       ClusterConfig(cpus_per_worker=0.5), seed=0)
    yield rt
    rt.shutdown()
