"""Fixtures shared by every test tier (unit, integration, nightly).

The harness (``posttrain.testing.harness``, a pytest plugin turned on in pyproject.toml by
``posttrain_harness = true``): the ``tracker`` fixture, ``gpu(n)`` skips, the Ray leak check,
unit_results.json; see docs/testing.md. ``pytester`` drives the harness's own tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# The harness arrives through its pytest11 entry point when posttrain is installed (uv run,
# the container); where nothing loads it that way (a checkout only on PYTHONPATH, as on the
# GPU device, or PYTEST_DISABLE_PLUGIN_AUTOLOAD), load it from here.
HARNESS = "posttrain.testing.harness.plugin"
_autoloaded = (any(ep.value == HARNESS for ep in entry_points(group="pytest11"))
               and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"))
pytest_plugins = ["pytester"] if _autoloaded else ["pytester", HARNESS]
# Ray reads this once, when it is imported (posttrain.distributed sets it too, but a test may import
# ray first): under `uv run python -m pytest` it would start every worker through `uv run`, which
# rebuilds the worker's environment, as run_unit.sh and run_mutants.py already prevent.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# The functional scripts' check_run archives every checked run into the user's
# ~/.cache/posttrain/functional_history, which functional-trend reads as the script's history: the
# tests that source common.sh must not add their made-up runs there (test_trend.py turns it back on
# with a cache of its own).
os.environ.setdefault("FUNCTIONAL_HISTORY", "0")


def pytest_configure(config: pytest.Config) -> None:
    # gpu(n) is the harness's marker, registered by its plugin when the harness is on (slow(reason) is
    # declared in pyproject.toml). Switched off (mutmut's runs, tests/mutation/run_auto.sh:
    # -o posttrain_harness=false), a module that marks one of its tests gpu(n) must still collect under
    # --strict-markers: mutmut selects them.
    if not config.getini("posttrain_harness"):
        from posttrain.testing.harness.plugin import GPU_MARKER

        config.addinivalue_line("markers", GPU_MARKER)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster (2 CPUs) for the whole session, started by the first test that asks.

    Tests that do not ask never import Ray. Actors and placement groups a test leaves alive
    make it error (``posttrain.testing.harness.ray_leaks``); hold shared ones in a module-scoped fixture.

    Under pytest-xdist (``-n``) each worker process starts a cluster of its own (``address="local"``:
    never ``$RAY_ADDRESS``'s nor another worker's; Ray gives each its own session directory and
    ports), also of 2 logical CPUs: the tests are sized for 2 (actors at 0.5 CPU; test_worker_group
    checks the figure). Logical CPUs only gate placement; the CPU time is threads, and the harness
    gives each worker's torch its share of the cores (docs/testing.md, "In parallel").
    """
    import ray

    from posttrain.distributed.ray_cluster import init_ray

    # retries a start-up that timed out on a busy machine
    init_ray(address="local" if os.environ.get("PYTEST_XDIST_WORKER") else None, num_cpus=2)
    yield
    ray.shutdown()


@dataclass(frozen=True)
class WarmStart:
    """The shared SFT warm start: ``model`` (its Hugging Face directory: load it, never write into
    it) and ``info`` (``sft_steps``, ``val_accuracy``, ``seconds`` of the build)."""

    model: Path
    info: dict


@pytest.fixture(scope="session")
def warm_start(ray_cluster) -> WarmStart:
    """The SFT warm start of ``examples/configs/grpo_arithmetic_warm_start.yaml`` (seed 0), from the
    verified cache ``$POSTTRAIN_CACHE/warm_start`` (``posttrain.algorithms.warm_start``).

    Built once per config, code and library version: the first session on a machine trains it
    (~1.5-3 min on 2 cores), later sessions, xdist workers (a file lock lets one build) and the
    functional scripts reuse it; a partial, corrupt or stale entry is rebuilt.
    """
    from posttrain.algorithms import sft
    from posttrain.algorithms.warm_start import MODEL_DIR
    from posttrain.algorithms.warm_start import warm_start as cached_warm_start
    from posttrain.config import load_config

    yaml = Path(__file__).resolve().parents[1] / "examples" / "configs" / "grpo_arithmetic_warm_start.yaml"
    entry = cached_warm_start(load_config(yaml, ["cluster.cpus_per_worker=0.5"], sft.SFTMasterConfig))
    return WarmStart(entry.path / MODEL_DIR, entry.info)


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
