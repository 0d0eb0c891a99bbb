"""The Ray leak check against a stand-in for the slice of Ray it reads, in this process.

``test_harness_ray_leaks.py`` proves the check on a real cluster. These tests pin what it lists,
reports, keeps and kills, word for word, on a stand-in cluster (``StandInRay``: the listings in
the keys Ray's GCS gives them, each object listed from and until a time) in virtual time
(``ray_leaks.time`` is a ``Clock`` whose ``sleep`` returns at once), so they need no cluster and
wait for nothing, and mutmut's forked workers can run them.
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from posttrain.testing.harness import ray_leaks
from posttrain.testing.harness.ray_leaks import LiveRayObjects, RayLeakCheck, RayLeakError, live_ray_objects

JOB = "01000000"
ADVICE = ("Kill actors (ray.kill / worker group shutdown) and remove placement groups in the test, "
          "or hold them in a module- or session-scoped fixture.")


class Clock:
    """Virtual monotonic time in whole microseconds, so that sums of sleeps are exact and a wait's
    length is asserted exactly; it starts at 1000 s, as a monotonic clock does not start at 0."""

    def __init__(self) -> None:
        self.us = 1_000_000_000

    def monotonic(self) -> float:
        return self.us / 1e6

    def sleep(self, seconds: float) -> None:
        self.us += round(seconds * 1e6)  # like time.sleep, None is a TypeError


class _ID:
    def __init__(self, hex_id: str) -> None:
        self.hex_id = hex_id

    @classmethod
    def from_hex(cls, hex_id: str) -> _ID:
        if not isinstance(hex_id, str):
            raise TypeError(f"{cls.__name__}.from_hex takes a hex str, not {hex_id!r}")
        return cls(hex_id)


class ActorID(_ID):
    pass


class PlacementGroupID(_ID):
    pass


class PlacementGroup:
    def __init__(self, id: PlacementGroupID) -> None:  # noqa: A002 -- Ray's name
        self.id = id


@dataclass
class _Object:
    row: dict[str, Any]
    appears_at: int  # us: the GCS lists it from then on (ActorClass.remote() returns before)
    dies_at: float  # us: listed as DEAD / REMOVED from then on


class StandInRay:
    """A cluster's actors and placement groups, what the check killed and removed, its listings."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.initialized = clock, True
        self.actors: dict[str, _Object] = {}
        self.placement_groups: dict[str, _Object] = {}
        self.killed: list[tuple[str, Any]] = []  # (actor id, no_restart)
        self.removed: list[str] = []
        self.refused: set[str] = set()  # ids whose kill or removal raises
        self.listings = 0  # of actors: one per look at the cluster
        self.on_listing = lambda: None

    def _span(self, appears_in: float, dies_in: float | None) -> tuple[int, float]:
        return (self.clock.us + round(appears_in * 1e6),
                math.inf if dies_in is None else self.clock.us + round(dies_in * 1e6))

    def actor(self, cls: str, name: str = "", *, aid: str, job: str = JOB, appears_in: float = 0.0,
              dies_in: float | None = None) -> str:
        row = {"ActorID": aid, "ActorClassName": cls, "Name": name, "JobID": job}  # an unnamed actor's Name is ""
        self.actors[aid] = _Object(row, *self._span(appears_in, dies_in))
        return aid

    def placement_group(self, bundles: list[dict[str, float]], name: str = "", *, pid: str,
                        dies_in: float | None = None) -> str:
        row = {"placement_group_id": pid, "name": name, "bundles": dict(enumerate(bundles)), "strategy": "PACK"}
        self.placement_groups[pid] = _Object(row, *self._span(0.0, dies_in))
        return pid

    def stop(self, object_id: str) -> None:
        """What the test's own ray.kill / remove_placement_group does."""
        (self.actors.get(object_id) or self.placement_groups[object_id]).dies_at = self.clock.us

    def _rows(self, objects: dict[str, _Object], state: str, alive: str, dead: str) -> dict[str, dict]:
        if not self.initialized:
            raise RuntimeError("Ray has not been started yet")
        now = self.clock.us
        return {i: {**o.row, state: alive if now < o.dies_at else dead} for i, o in objects.items()
                if o.appears_at <= now}

    def actor_table(self) -> dict[str, dict]:
        self.listings += 1
        self.on_listing()
        return self._rows(self.actors, "State", "ALIVE", "DEAD")

    def placement_group_table(self) -> dict[str, dict]:
        return self._rows(self.placement_groups, "state", "CREATED", "REMOVED")

    def kill_actor(self, actor_id: ActorID, no_restart: bool) -> None:
        if not isinstance(actor_id, ActorID):
            raise TypeError(f"kill_actor takes an ActorID, not {actor_id!r}")
        self.killed.append((actor_id.hex_id, no_restart))
        if actor_id.hex_id in self.refused:
            raise RuntimeError("the GCS refused")
        self.stop(actor_id.hex_id)

    def remove_placement_group(self, pg: PlacementGroup) -> None:
        if not isinstance(pg, PlacementGroup) or not isinstance(pg.id, PlacementGroupID):
            raise TypeError(f"remove_placement_group takes a PlacementGroup, not {pg!r}")
        self.removed.append(pg.id.hex_id)
        if pg.id.hex_id in self.refused:
            raise RuntimeError("the GCS refused")
        self.stop(pg.id.hex_id)


def _install(monkeypatch: pytest.MonkeyPatch, cluster: StandInRay) -> None:
    """``ray`` and the submodules ray_leaks imports, in sys.modules; ``ray.stand_in`` for inner tests."""
    mods = {name: types.ModuleType(name) for name in ("ray", "ray._private", "ray._private.state",
            "ray._private.worker", "ray.util", "ray.util.placement_group", "ray._raylet")}
    ray = mods["ray"]
    ray.is_initialized = lambda: cluster.initialized
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_job_id=lambda: JOB)
    ray.stand_in = cluster
    ray._private, ray.util, ray._raylet = mods["ray._private"], mods["ray.util"], mods["ray._raylet"]
    ray._private.state, ray._private.worker = mods["ray._private.state"], mods["ray._private.worker"]
    ray._private.state.actors = cluster.actor_table
    ray._private.worker.global_worker = types.SimpleNamespace(
        core_worker=types.SimpleNamespace(kill_actor=cluster.kill_actor))
    ray.util.placement_group_table = cluster.placement_group_table
    ray.util.remove_placement_group = cluster.remove_placement_group
    ray.util.placement_group = mods["ray.util.placement_group"]
    ray.util.placement_group.PlacementGroup = PlacementGroup
    ray._raylet.ActorID, ray._raylet.PlacementGroupID = ActorID, PlacementGroupID
    for name, module in mods.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> StandInRay:
    clock = Clock()
    monkeypatch.setattr(ray_leaks, "time", clock)
    stand_in = StandInRay(clock)
    _install(monkeypatch, stand_in)
    return stand_in


def test_the_listing_is_this_jobs_live_actors_and_the_live_placement_groups_word_for_word(cluster):
    cluster.actor("Engine", "vllm-0", aid="0123456789abcdef0123456789abcdef")
    cluster.actor("Sleeper", aid="fedcba9876543210fedcba9876543210")
    cluster.stop(cluster.actor("Dead", "gone", aid="dead" * 8))
    cluster.actor("Theirs", "other-job", aid="0be1" * 8, job="02000000")
    cluster.placement_group([{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}], "workers", pid="a1b2c3d4e5f6a7b8c9" * 2)
    cluster.placement_group([{"CPU": 0.5}], pid="0f" * 18)
    cluster.stop(cluster.placement_group([{"CPU": 2.0}], "removed", pid="ee" * 18))
    assert live_ray_objects() == LiveRayObjects(
        {"0123456789abcdef0123456789abcdef": "actor Engine 'vllm-0' (id 0123456789ab)",
         "fedcba9876543210fedcba9876543210": "actor Sleeper (id fedcba987654)"},
        {"a1b2c3d4e5f6a7b8c9" * 2: "placement group [{'CPU': 1.0}, {'CPU': 1.0, 'GPU': 1.0}] 'workers' "
                                   "(id a1b2c3d4e5f6)",
         "0f" * 18: "placement group [{'CPU': 0.5}] (id 0f0f0f0f0f0f)"})
    assert live_ray_objects().ids() == {"0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210",
                                        "a1b2c3d4e5f6a7b8c9" * 2, "0f" * 18}


def test_without_ray_initialized_nothing_is_listed_killed_or_waited_for(cluster):
    cluster.actor("Sleeper", aid="aa" * 16)
    cluster.initialized = False
    start = cluster.clock.us
    assert live_ray_objects() is None
    ray_leaks._kill({"aa" * 16})
    assert ray_leaks._settled_ids() == set()
    assert (cluster.killed, cluster.listings, cluster.clock.us) == ([], 0, start)


def test_kill_kills_exactly_the_given_live_actors_by_id_and_removes_exactly_the_given_placement_groups(cluster):
    leaked_actor, kept_actor = cluster.actor("A", aid="a1" * 16), cluster.actor("B", aid="b2" * 16)
    leaked_pg, kept_pg = cluster.placement_group([{"CPU": 1.0}], pid="c3" * 18), cluster.placement_group(
        [{"CPU": 1.0}], pid="d4" * 18)
    ray_leaks._kill({leaked_actor, leaked_pg, "gone" * 8})
    assert (cluster.killed, cluster.removed) == ([(leaked_actor, True)], [leaked_pg])  # no restart
    assert live_ray_objects().ids() == {kept_actor, kept_pg}


def test_a_kill_or_removal_that_fails_does_not_stop_the_others(cluster):
    actors = {cluster.actor("A", aid=f"a{i}" * 16) for i in range(3)}
    pgs = {cluster.placement_group([{"CPU": 1.0}], pid=f"c{i}" * 18) for i in range(3)}
    cluster.refused = {"a1" * 16, "c1" * 18}
    ray_leaks._kill(actors | pgs)
    assert ({a for a, _ in cluster.killed}, set(cluster.removed)) == (actors, pgs)  # each one tried
    assert live_ray_objects().ids() == {"a1" * 16, "c1" * 18}


def test_the_settled_listing_waits_for_a_late_actor_and_then_two_quiet_seconds(cluster):
    start = cluster.clock.us
    held = cluster.actor("Engine", aid="e1" * 16)
    late = cluster.actor("Worker", aid="e2" * 16, appears_in=0.5)  # .remote() returned, not listed yet
    assert ray_leaks._settled_ids() == {held, late}
    assert cluster.clock.us - start == 2_500_000  # quiet from 0.5 s on, for 2 s
    start = cluster.clock.us
    assert ray_leaks._settled_ids(quiet_s=0.5) == {held, late}
    assert (cluster.clock.us - start, cluster.listings) == (500_000, 1 + 25 + 1 + 5)  # a listing each 0.1 s


def test_the_settled_listing_gives_up_after_twenty_seconds_of_changes(cluster):
    n = iter(range(10**6))
    # an actor more at each look for 25 s: the wait ends at its deadline, with what it saw last
    cluster.on_listing = lambda: cluster.clock.us < 1_025_000_000 and cluster.actor("A", aid=f"{next(n):032x}")
    start = cluster.clock.us
    ids = ray_leaks._settled_ids()
    assert cluster.clock.us - start == 20_000_000
    assert ids == set(cluster.actors) == {f"{i:032x}" for i in range(201)}  # the first look and 200 more
    start = cluster.clock.us
    assert len(ray_leaks._settled_ids(quiet_s=0.5, timeout_s=1.0)) == 212  # its first look and 10 more
    assert cluster.clock.us - start == 1_000_000


def test_a_cluster_shut_down_during_the_settled_wait_settles_to_nothing(cluster, monkeypatch):
    cluster.actor("Engine", aid="e1" * 16)
    monkeypatch.setattr(sys.modules["ray"], "is_initialized", lambda: cluster.listings < 3)  # ray.shutdown()
    assert ray_leaks._settled_ids() == set()


def _teardown(check: RayLeakCheck, nodeid: str = "test_x.py::test_x") -> str | None:
    """Drives the check's teardown hook as pytest does: its error's message, or None."""
    hook = check.pytest_runtest_teardown(types.SimpleNamespace(nodeid=nodeid), None)
    next(hook)
    try:
        hook.send(None)
    except StopIteration:
        return None
    except RayLeakError as e:
        return str(e)
    raise AssertionError("the teardown hook yielded twice")


def _setup(check: RayLeakCheck) -> None:
    hook = check.pytest_runtest_setup(types.SimpleNamespace(nodeid="test_x.py::test_x"))
    next(hook)
    with pytest.raises(StopIteration):
        hook.send(None)


def test_a_clean_test_costs_one_listing_before_and_one_after_and_no_wait(cluster):
    cluster.actor("Engine", "from-before", aid="e1" * 16)
    check = RayLeakCheck()
    _setup(check)
    cluster.stop(cluster.actor("Sleeper", aid="5e" * 16))  # the test kills what it started
    start = cluster.clock.us
    assert _teardown(check) is None
    assert (cluster.listings, cluster.clock.us - start, cluster.killed) == (2, 0, [])
    cluster.initialized = False  # without Ray: no listing, no error
    _setup(check)
    assert (_teardown(check), cluster.listings) == (None, 2)


def test_a_teardown_whose_setup_never_reached_the_check_reports_nothing_of_its_own(cluster):
    """Another plugin's setup wrapper, run outside this one, failed: pytest still tears the test down."""
    assert _teardown(RayLeakCheck()) is None
    assert cluster.listings == 1


@pytest.mark.parametrize(("dies_in", "reported"), [(None, True), (3.1, True), (3.02, False), (2.9, False)])
def test_an_object_gone_within_the_three_second_grace_period_is_not_reported(cluster, dies_in, reported):
    """ray.kill returns before the GCS lists the actor DEAD: the check looks again every 0.05 s for
    3 s, and reports (and kills) what is still alive once that is past."""
    check = RayLeakCheck()
    _setup(check)
    aid = cluster.actor("Sleeper", "slow", aid="51" * 16, dies_in=dies_in)
    error = _teardown(check)
    if reported:
        assert error == f"test_x.py::test_x left 1 Ray object(s) alive (now killed/removed): " \
                        f"actor Sleeper 'slow' (id 515151515151). {ADVICE}"
        assert cluster.killed == [(aid, True)]
    else:
        assert (error, cluster.killed) == (None, [])


INNER = '''
import pytest
import ray

cluster = ray.stand_in


@pytest.fixture(scope="module")
def shared_engine():
    aid = cluster.actor("Engine", "inner-shared", aid="5a" * 16)
    yield
    cluster.stop(aid)


def test_uses_module_fixture(shared_engine):
    pass


def test_uses_module_fixture_again(shared_engine):
    pass


def test_cleans_up():
    cluster.stop(cluster.actor("Sleeper", aid="c1" * 16))


def test_leaks_an_actor_and_a_placement_group():
    cluster.actor("Sleeper", "inner-leaked", aid="1e" * 16)
    cluster.placement_group([{"CPU": 1.0}, {"GPU": 1.0}], "inner-pg", pid="9a" * 18)


def test_leaks_an_unnamed_actor():
    cluster.actor("Sleeper", aid="0b" * 16)
'''


def test_a_test_that_leaks_errors_naming_what_it_left_which_is_killed_and_fixture_held_ones_are_not(
        cluster, pytester):
    before = cluster.actor("Engine", "from-before-the-session", aid="bf" * 16)
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider",
                                          "--no-unit-results")
    result.assert_outcomes(passed=5, errors=2)
    errors = [line.split("RayLeakError: ", 1)[1] for line in result.outlines if line.startswith("E ")
              and "RayLeakError: " in line]
    assert errors == [
        "test_inner.py::test_leaks_an_actor_and_a_placement_group left 2 Ray object(s) alive (now killed/removed): "
        "actor Sleeper 'inner-leaked' (id 1e1e1e1e1e1e); placement group [{'CPU': 1.0}, {'GPU': 1.0}] 'inner-pg' "
        f"(id 9a9a9a9a9a9a). {ADVICE}",
        f"test_inner.py::test_leaks_an_unnamed_actor left 1 Ray object(s) alive (now killed/removed): "
        f"actor Sleeper (id 0b0b0b0b0b0b). {ADVICE}"]
    assert (cluster.killed, cluster.removed) == ([("1e" * 16, True), ("0b" * 16, True)], ["9a" * 18])
    assert live_ray_objects().ids() == {before}


SETTLING = '''
import pytest
import ray


@pytest.fixture(scope="session")
def ray_cluster():  # the name is what the check reads
    return ray.stand_in


@pytest.fixture(scope="module")
def model_dir():
    ray.stand_in.actor("Unrelated", "listed-at-once", aid="1a" * 16)


@pytest.fixture(scope="module")
def engine(ray_cluster):
    ray_cluster.actor("Engine", "inner-engine", aid="e9" * 16, appears_in=0.5)  # listed 0.5 s after it returns


def test_without_ray(model_dir):
    pass


def test_with_ray(engine, model_dir):
    pass
'''


def test_only_the_fixtures_of_a_test_that_uses_ray_wait_for_their_actors_to_be_listed(cluster, pytester,
                                                                                       monkeypatch):
    """A module fixture of a Ray-free test is recorded with one listing; each wider fixture of a test
    whose closure holds ``ray_cluster`` waits for a quiet 2 s (its late actor is held, not blamed)."""
    waits = []
    settled = ray_leaks._settled_ids
    monkeypatch.setattr(ray_leaks, "_settled_ids", lambda *a, **k: waits.append(1) or settled(*a, **k))
    pytester.makepyfile(test_inner=SETTLING)
    start = cluster.clock.us
    result = pytester.runpytest_inprocess("-o", "posttrain_harness=true", "-p", "no:cacheprovider",
                                          "--no-unit-results")
    result.assert_outcomes(passed=2)
    # ray_cluster: 2 s quiet; engine: its actor listed at 0.5 s, then 2 s quiet
    assert (len(waits), cluster.clock.us - start) == (2, 4_500_000)
    assert cluster.killed == []
