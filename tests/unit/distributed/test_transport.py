"""The worker transport (``posttrain.distributed.transport``): chosen at set-up, restored after,
and the in-process one copies what crosses it as Ray would and runs any worker class unlisted."""

from __future__ import annotations

import pytest
import ray

from posttrain.distributed.transport import (
    InProcessCluster,
    InProcessTransport,
    RayTransport,
    current_transport,
    object_store_put,
    use_transport,
)


class Counter:
    """A worker as written (the class a ``ray.remote`` wrapper wraps)."""

    def __init__(self, start: int, rank: int = 0):
        self.total, self.rank = start, rank

    def add(self, values: list[int]) -> list[int]:
        self.total += sum(values)
        values.append(self.rank)  # a worker mutating its argument must not reach the caller's list
        return values


CounterActor = ray.remote(Counter)


def test_the_transport_is_ray_unless_chosen_and_the_choice_ends_with_its_block():
    assert isinstance(current_transport(), RayTransport)
    with pytest.raises(RuntimeError), use_transport(InProcessTransport()) as chosen:
        assert current_transport() is chosen
        assert object_store_put(big := {"w": [1, 2]}) is big  # in-process: the value itself, no object store
        raise RuntimeError("a failed run")
    assert isinstance(current_transport(), RayTransport)


def test_an_in_process_group_runs_any_worker_class_and_copies_what_crosses_it():
    transport = InProcessTransport()
    group = transport.group(InProcessCluster(3), CounterActor, 10)
    assert group.name == "Counter" and len(group) == 3
    mine = [1, 2]
    answers = group.run_all("add", mine)
    assert mine == [1, 2]  # the workers got copies
    assert answers == [[1, 2, 0], [1, 2, 1], [1, 2, 2]]  # each its own rank, results copied back
    answers[0].append(99)
    assert [w.total for w in group.workers] == [13, 13, 13]
    assert group.run_sharded("add", [[1], [2], [3]]) == [[1, 0], [2, 1], [3, 2]]
    with pytest.raises(ValueError, match="2 shards for 3 workers"):
        group.run_sharded("add", [[1], [2]])
