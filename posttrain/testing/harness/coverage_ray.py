"""Coverage inside Ray actors and tasks when pytest runs with ``--cov``.

Ray workers are Python processes the raylet starts, so the driver's tracer never sees
them. With ``--cov``, :func:`enable_for_ray_workers` hands the run's coverage settings to
Ray's documented ``RAY_RUNTIME_ENV_HOOK``: at ``ray.init`` the hook adds
``COVERAGE_PROCESS_CONFIG`` to the job's ``runtime_env`` ``env_vars``, so coverage.py's
start-up hook (its ``.pth`` file) measures every worker of the job, and only the workers:
Ray's own Python services (dashboard agent, log monitor) stay unmeasured, which matters
because measuring them slows the agent past the raylet's start-up deadline on a busy
2-core machine. Each worker writes its own data file next to pytest-cov's (``parallel``);
pytest-cov combines them when the session ends, after the session-scoped ``ray_cluster``
has shut down.

``ray.kill`` ends an actor's process without running its exit handlers, so coverage would
never write that actor's data. The same hook therefore wraps ``ray.kill`` in the driver:
before the kill, the actor saves its coverage data (``actor.__ray_call__``, at most
``SAVE_TIMEOUT_S``). Not covered: actors still alive at ``ray.shutdown`` (kill them first,
as the leak check asks anyway) and code run only in Ray tasks whose worker is killed.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
CONFIG_ENV = "POSTTRAIN_RAY_WORKER_COVERAGE"
HOOK = "posttrain.testing.harness.coverage_ray.add_worker_coverage"
SAVE_TIMEOUT_S = 10.0


def enable_for_ray_workers(cov: Any) -> bool:
    """Make Ray clusters started later by this process measure their workers with ``cov``'s settings.

    Args:
        cov: the running ``coverage.Coverage`` of pytest-cov.

    Returns:
        False (and changes nothing) when another ``RAY_RUNTIME_ENV_HOOK`` is already set.
    """
    if os.environ.get(HOOK_ENV, HOOK) != HOOK:
        return False
    config = copy.deepcopy(cov.config)
    config.data_file = os.path.abspath(config.data_file)  # workers run in other directories
    config.parallel = True  # one data file per worker process
    os.environ[CONFIG_ENV] = config.serialize()
    os.environ[HOOK_ENV] = HOOK
    return True


def add_worker_coverage(runtime_env: dict[str, Any] | None) -> dict[str, Any]:
    """``RAY_RUNTIME_ENV_HOOK``: the job's ``runtime_env`` plus ``COVERAGE_PROCESS_CONFIG`` for its workers."""
    runtime_env = dict(runtime_env or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    if os.environ.get(CONFIG_ENV):
        env_vars["COVERAGE_PROCESS_CONFIG"] = os.environ[CONFIG_ENV]
    runtime_env["env_vars"] = env_vars
    _save_before_kill()
    return runtime_env


def _save_in_actor(_instance: Any) -> bool:
    """Runs inside an actor: write its coverage data now (True if it measures)."""
    import coverage

    cov = coverage.Coverage.current()
    if cov is not None:
        cov.save()
    return cov is not None


def save_actor_coverage(actors: list[Any]) -> None:
    """Ask each actor to write its coverage data; dead or hung actors are skipped."""
    import sys

    import ray

    # Workers may not have tests/ on sys.path: ship this module's code with the call.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    refs = [actor.__ray_call__.remote(_save_in_actor) for actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=SAVE_TIMEOUT_S)


def _save_before_kill() -> None:
    import ray

    if getattr(ray.kill, "_saves_coverage", False):
        return
    kill = ray.kill

    @functools.wraps(kill)
    def kill_saving_coverage(actor: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            save_actor_coverage([actor])
        except Exception:  # noqa: BLE001 -- never let coverage bookkeeping change what kill does
            pass
        return kill(actor, *args, **kwargs)

    kill_saving_coverage._saves_coverage = True  # type: ignore[attr-defined]
    ray.kill = kill_saving_coverage
