"""``init_ray`` retries a local node start that timed out (a busy machine), one line per retry,
and fails in one line when every attempt did; it keeps Ray's and vLLM's INFO lines out of
the output unless ``POSTTRAIN_VERBOSE=1``. ``ray.init`` is replaced to isolate the retry
logic (a real busy-machine start is measured by benchmarks/ray_startup_bench.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from posttrain.distributed import ray_cluster
from posttrain.errors import ConfigError, RayStartError

TIMEOUT = Exception("The current node timed out during startup. This could happen because some of the raylet "
                    "failed to startup or the GCS has become overloaded.")


class FakeRay:
    """``ray.init`` that fails with ``errors`` in turn, then succeeds; counts shutdowns."""

    def __init__(self, errors: list[BaseException]):
        self.errors = list(errors)
        self.kwargs: dict = {}
        self.inits = 0
        self.shutdowns = 0

    def is_initialized(self) -> bool:
        return False

    def init(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.inits += 1
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.fixture
def fake(monkeypatch):
    def install(errors: list[BaseException], attempts: str | None = None) -> FakeRay:
        ray = FakeRay(errors)
        monkeypatch.setattr(ray_cluster, "ray", ray)
        monkeypatch.setattr(ray_cluster, "rearm", lambda: None)
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
        for key in ("VLLM_LOGGING_LEVEL", "POSTTRAIN_VERBOSE"):
            monkeypatch.delenv(key, raising=False)
        if attempts is None:
            monkeypatch.delenv(ray_cluster.START_ATTEMPTS_ENV, raising=False)
        else:
            monkeypatch.setenv(ray_cluster.START_ATTEMPTS_ENV, attempts)
        return ray
    return install


def test_timeouts_are_retried_with_one_line_each(fake, capsys):
    ray = fake([TIMEOUT, TIMEOUT])
    ray_cluster.init_ray(num_cpus=2)
    assert (ray.inits, ray.shutdowns) == (3, 2)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"ray: the local node timed out during startup (attempt {i} of 5, a busy machine); "
                     "starting it again" for i in (1, 2)]


def test_every_attempt_timing_out_is_one_line_naming_what_to_try(fake):
    ray = fake([TIMEOUT] * 5, attempts="2")
    with pytest.raises(RayStartError) as err:
        ray_cluster.init_ray()
    assert ray.inits == 2
    message = str(err.value)
    assert "\n" not in message and "on all 2 attempts" in message
    assert "POSTTRAIN_RAY_START_ATTEMPTS" in message and "cluster.address" in message
    assert RayStartError.exit_code == 1


def test_other_start_errors_are_not_retried(fake):
    ray = fake([ValueError("num_cpus must be non-negative")])
    with pytest.raises(ValueError, match="num_cpus"):
        ray_cluster.init_ray(num_cpus=-1)
    assert ray.inits == 1


def test_a_local_start_never_joins_another_cluster(fake, monkeypatch):
    """Without an address Ray itself would join the machine's last `ray start`; "local" also ignores
    RAY_ADDRESS (each pytest-xdist worker's own cluster)."""
    ray = fake([])
    ray_cluster.init_ray(num_cpus=2)
    assert (ray.kwargs["address"], ray.kwargs["num_cpus"]) == ("local", 2)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    ray_cluster.init_ray(address="local", num_cpus=2)
    assert (ray.kwargs["address"], ray.kwargs["num_cpus"]) == ("local", 2)
    ray_cluster.init_ray(num_cpus=2)  # RAY_ADDRESS alone: join it
    assert ray.kwargs["address"] == "10.0.0.1:6379" and "num_cpus" not in ray.kwargs


@pytest.mark.parametrize("bad", ["0", "-1", "three", ""])
def test_a_bad_attempt_count_is_one_line(fake, bad):
    ray = fake([], attempts=bad)
    with pytest.raises(ConfigError, match=f"POSTTRAIN_RAY_START_ATTEMPTS='{bad}': expected a positive integer"):
        ray_cluster.init_ray()
    assert ray.inits == 0


def test_quiet_by_default_verbose_on_request(fake, monkeypatch):
    ray = fake([])
    ray_cluster.init_ray()
    assert ray.kwargs["logging_level"] == logging.WARNING
    assert ray.kwargs["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "WARNING"
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    monkeypatch.setenv("POSTTRAIN_VERBOSE", "1")
    ray_cluster.init_ray()
    assert ray.kwargs["logging_level"] == logging.INFO
    assert "VLLM_LOGGING_LEVEL" not in ray.kwargs["runtime_env"]["env_vars"]
    monkeypatch.setenv("POSTTRAIN_VERBOSE", "0")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")  # the user's own level wins
    ray_cluster.init_ray()
    assert ray.kwargs["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] == "DEBUG"


START = "from posttrain.distributed.ray_cluster import init_ray; import ray; init_ray(num_cpus=1); ray.shutdown()"


@pytest.mark.parametrize("verbose", ["0", "1"])
@pytest.mark.slow(reason="a real Ray start in a subprocess")
def test_a_real_start_shows_rays_banner_only_when_verbose(verbose):
    env = {**os.environ, "POSTTRAIN_VERBOSE": verbose, "RAY_ADDRESS": ""}
    out = subprocess.run([sys.executable, "-c", START], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert ("Started a local Ray instance" in out.stdout + out.stderr) == (verbose == "1")
