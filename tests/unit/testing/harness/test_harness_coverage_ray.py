"""The pieces of ``posttrain.testing.harness.coverage_ray`` in this process: the settings handed to Ray
workers, the ``runtime_env`` hook, ``ray.kill``'s wrapping and an actor's save. That a real actor's
lines reach the combined report under ``--cov`` is ``test_harness_coverage.py``'s (a subprocess
run with Ray workers)."""

from __future__ import annotations

import os

import coverage
import pytest
import ray
from coverage.config import CoverageConfig

from posttrain.testing.harness import coverage_ray


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(coverage_ray.HOOK_ENV, raising=False)
    monkeypatch.delenv(coverage_ray.CONFIG_ENV, raising=False)
    monkeypatch.setattr(ray, "kill", ray.kill)  # put back whatever the hook wraps
    return monkeypatch


def test_workers_get_the_runs_settings_with_an_absolute_data_file_and_one_file_each(clean_env, tmp_path):
    clean_env.chdir(tmp_path)
    cov = coverage.Coverage(data_file="sub/.coverage", config_file=False)
    assert coverage_ray.enable_for_ray_workers(cov) is True
    assert os.environ[coverage_ray.HOOK_ENV] == coverage_ray.HOOK
    handed = CoverageConfig.deserialize(os.environ[coverage_ray.CONFIG_ENV])
    assert (handed.data_file, handed.parallel) == (str(tmp_path / "sub" / ".coverage"), True)
    assert (cov.config.data_file, cov.config.parallel) == ("sub/.coverage", False)  # the run's own unchanged


def test_another_runtime_env_hook_is_left_alone(clean_env):
    clean_env.setenv(coverage_ray.HOOK_ENV, "theirs.hook")
    assert coverage_ray.enable_for_ray_workers(coverage.Coverage(config_file=False)) is False
    assert os.environ[coverage_ray.HOOK_ENV] == "theirs.hook"
    assert coverage_ray.CONFIG_ENV not in os.environ


def test_the_hook_adds_the_coverage_config_to_the_jobs_env_vars_and_keeps_the_rest(clean_env):
    clean_env.setenv(coverage_ray.CONFIG_ENV, "serialized")
    job = {"pip": ["x"], "env_vars": {"A": "1"}}
    assert coverage_ray.add_worker_coverage(job) == {
        "pip": ["x"], "env_vars": {"A": "1", "COVERAGE_PROCESS_CONFIG": "serialized"}}
    assert job == {"pip": ["x"], "env_vars": {"A": "1"}}  # the caller's dicts are not changed
    assert coverage_ray.add_worker_coverage(None) == {"env_vars": {"COVERAGE_PROCESS_CONFIG": "serialized"}}
    clean_env.delenv(coverage_ray.CONFIG_ENV)
    assert coverage_ray.add_worker_coverage({"env_vars": {"A": "1"}}) == {"env_vars": {"A": "1"}}


def test_ray_kill_is_wrapped_once_and_saves_the_actors_coverage_before_killing_it(clean_env):
    calls: list[tuple] = []
    clean_env.setattr(ray, "kill", lambda actor, **kwargs: calls.append(("kill", actor, kwargs)))
    original = ray.kill
    clean_env.setattr(coverage_ray, "save_actor_coverage", lambda actors: calls.append(("save", actors)))
    coverage_ray.add_worker_coverage(None)
    coverage_ray.add_worker_coverage(None)  # every ray.init calls the hook: still one wrapper
    assert ray.kill.__wrapped__ is original and ray.kill._saves_coverage is True
    ray.kill("actor", no_restart=True)
    assert calls == [("save", ["actor"]), ("kill", "actor", {"no_restart": True})]

    def broken(actors):
        raise RuntimeError("the actor is gone")

    clean_env.setattr(coverage_ray, "save_actor_coverage", broken)
    ray.kill("other")  # the bookkeeping's failure never stops the kill
    assert calls[-1] == ("kill", "other", {})


def test_each_actor_is_asked_to_save_and_waited_for_all_together_at_most_the_timeout(monkeypatch):
    class Actor:
        def __init__(self, name):
            self.name, self.__ray_call__ = name, self

        def remote(self, fn):
            return (self.name, fn)

    waits: list[tuple] = []
    monkeypatch.setattr(ray, "wait", lambda refs, **kwargs: waits.append((refs, kwargs)))
    coverage_ray.save_actor_coverage([Actor("a"), Actor("b")])
    save = coverage_ray._save_in_actor
    assert waits == [([("a", save), ("b", save)], {"num_returns": 2, "timeout": coverage_ray.SAVE_TIMEOUT_S})]


def test_an_actor_that_measures_writes_its_data_when_asked(tmp_path):
    cov = coverage.Coverage(data_file=str(tmp_path / ".coverage"), config_file=False)
    cov.start()
    try:
        saved = coverage_ray._save_in_actor(None)
    finally:
        cov.stop()
    assert saved is True and (tmp_path / ".coverage").exists()
