"""Fixtures shared by every test tier (unit, integration, nightly).

The harness (``posttrain.testing.harness``, a pytest plugin turned on in pyproject.toml by
``posttrain_harness = true``): the ``tracker`` fixture, ``gpu(n)`` skips, the Ray leak check,
unit_results.json; see docs/testing.md. ``pytester`` drives the harness's own tests.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest

# The harness arrives through its pytest11 entry point when posttrain is installed (uv run,
# the container); where nothing loads it that way (a checkout only on PYTHONPATH, as on the
# GPU device, or PYTEST_DISABLE_PLUGIN_AUTOLOAD), load it from here.
HARNESS = "posttrain.testing.harness.plugin"
_autoloaded = (any(ep.value == HARNESS for ep in entry_points(group="pytest11"))
               and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"))
pytest_plugins = ["pytester"] if _autoloaded else ["pytester", HARNESS]


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (2 CPUs) for the whole session, started by the first test that asks.

    Tests that do not ask never import Ray. Actors and placement groups a test leaves alive
    make it error (``posttrain.testing.harness.ray_leaks``); hold shared ones in a module-scoped fixture.
    """
    import ray

    from posttrain.distributed.ray_cluster import init_ray

    init_ray(num_cpus=2)  # retries a start-up that timed out on a busy machine
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
