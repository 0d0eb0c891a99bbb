"""Ray actors and placement groups a test created and left alive make that test ERROR.

A leaked actor keeps its CPUs (and GPUs) and poisons the tests after it, which then fail
far from the cause. After each test's teardown, the live actors and placement groups of
this job are compared with those alive before its setup; what is new, minus what module-,
class-, package- or session-scoped fixtures created (they are meant to outlive the test,
e.g. an inference engine shared by a module), is reported by name and then killed/removed,
so one leak does not cascade.

Listing goes to Ray's GCS directly (``ray._private.state.actors()``,
``ray.util.placement_group_table()``): the state API (``ray.util.state``) needs the
dashboard, which ``init_ray`` does not start. When Ray is not initialized in this process
(pure-Python tests) the check is a dictionary lookup.

A wider-scoped fixture's actors are recorded after a quiet period (:func:`_settled_ids`: an
actor ``.remote()`` created may not be listed yet when the fixture returns) only when the
test's fixture closure holds :data:`RAY_FIXTURE`: the only way a fixture of this suite gets a
Ray cluster to start actors on. Other fixtures (a model directory, a config) are recorded
with one listing, not a 2 s wait each: those waits were ~40 s of the serial default tier.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Generator
from dataclasses import dataclass

import pytest

# ray.kill and remove_placement_group return before the GCS marks the object dead.
_GRACE_S = 3.0
_ACTOR_DEAD = "DEAD"
_PG_REMOVED = "REMOVED"
# The session fixture that starts Ray (tests/conftest.py): a fixture that starts actors requests it.
RAY_FIXTURE = "ray_cluster"


@dataclass(frozen=True)
class LiveRayObjects:
    """Live actors and placement groups of this job: id (hex) -> a readable description."""

    actors: dict[str, str]
    placement_groups: dict[str, str]

    def ids(self) -> set[str]:
        return set(self.actors) | set(self.placement_groups)


def live_ray_objects() -> LiveRayObjects | None:
    """This job's live actors and placement groups; None when Ray is not initialized here."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray._private import state

    job = ray.get_runtime_context().get_job_id()
    actors = {aid: f"actor {a['ActorClassName']}" + (f" '{a['Name']}'" if a.get("Name") else "") + f" (id {aid[:12]})"
              for aid, a in state.actors().items() if a["State"] != _ACTOR_DEAD and a["JobID"] == job}
    pgs = {pid: f"placement group {list(pg['bundles'].values())}" + (f" '{pg['name']}'" if pg.get("name") else "")
           + f" (id {pid[:12]})"
           for pid, pg in ray.util.placement_group_table().items() if pg["state"] != _PG_REMOVED}
    return LiveRayObjects(actors, pgs)


def leaked(before: set[str], held: set[str], now: LiveRayObjects) -> list[str]:
    """Descriptions of objects alive ``now`` that are neither in ``before`` nor ``held`` (sorted)."""
    new = now.ids() - before - held
    return sorted({**now.actors, **now.placement_groups}[i] for i in new)


def _kill(ids: set[str]) -> None:
    import ray
    from ray.util.placement_group import PlacementGroup

    now = live_ray_objects()
    for aid in ids & set(now.actors if now else ()):
        try:
            # the test dropped its handle: kill by id, as ray.kill does with a handle
            ray._private.worker.global_worker.core_worker.kill_actor(  # type: ignore[attr-defined]
                ray._raylet.ActorID.from_hex(aid), True)
        except Exception:  # noqa: BLE001 -- cleanup is best effort; the error is already reported
            pass
    for pid in ids & set(now.placement_groups if now else ()):
        try:
            ray.util.remove_placement_group(PlacementGroup(ray._raylet.PlacementGroupID.from_hex(pid)))
        except Exception:  # noqa: BLE001
            pass


def _settled_ids(quiet_s: float = 2.0, timeout_s: float = 20.0) -> set[str]:
    """Live ids once no actor has appeared for ``quiet_s`` seconds (at most ``timeout_s``).

    ``ActorClass.remote()`` returns before the actor is registered with the GCS: a fixture
    that creates actors and returns at once would have them listed only later, and they
    would be blamed on the test. Seen on a loaded 2-core CI machine, never on an idle one.
    """
    live = live_ray_objects()
    if live is None:
        return set()
    ids, stable_since, deadline = live.ids(), time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() - stable_since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        now = live_ray_objects()
        current = now.ids() if now else set()
        if current != ids:
            ids, stable_since = current, time.monotonic()
    return ids


class RayLeakError(Exception):
    """A test left Ray actors or placement groups alive."""


class RayLeakCheck:
    """pytest hooks: snapshot before setup, attribute wider-scope fixtures, check after teardown."""

    def __init__(self) -> None:
        self.before: set[str] = set()
        self.held: set[str] = set()  # created by fixtures wider than a function

    @staticmethod
    def _ids() -> set[str]:
        live = live_ray_objects()
        return live.ids() if live else set()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        self.before = self._ids()
        return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
        if fixturedef.scope == "function":
            return (yield)
        before = self._ids()
        try:
            return (yield)
        finally:
            self.held |= (_settled_ids() if RAY_FIXTURE in request.fixturenames else self._ids()) - before

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
        result = yield
        names = self._still_leaked()
        if names:
            raise RayLeakError(f"{item.nodeid} left {len(names)} Ray object(s) alive (now killed/removed): "
                               + "; ".join(names) + ". Kill actors (ray.kill / worker group shutdown) and remove "
                               "placement groups in the test, or hold them in a module- or session-scoped fixture.")
        return result

    def _still_leaked(self) -> list[str]:
        deadline = time.monotonic() + _GRACE_S
        while True:
            now = live_ray_objects()
            names = leaked(self.before, self.held, now) if now else []
            if not names or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if names and now:
            _kill(now.ids() - self.before - self.held)
        return names
