"""The worker transport (``posttrain.distributed.transport``): chosen at set-up, restored after,
and the in-process one copies what crosses it as Ray would and runs any worker class unlisted."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

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


class Mailbox:
    """A service actor with an asyncio method (as the rollout buffer) and a plain one."""

    def __init__(self, handle: object):
        self.handle = handle  # another actor, an engine group: shared, never copied
        self.items: list[list[int]] = []
        self.arrived: asyncio.Condition | None = None

    async def put(self, item: list[int]) -> None:
        self.arrived = self.arrived or asyncio.Condition()
        async with self.arrived:
            self.items.append(item)
            item.append(-1)  # must not reach the caller's list
            self.arrived.notify_all()

    async def take(self, timeout_s: float) -> list[int]:
        self.arrived = self.arrived or asyncio.Condition()
        async with self.arrived:
            await asyncio.wait_for(self.arrived.wait_for(lambda: bool(self.items)), timeout_s)
            return self.items.pop(0)

    def size(self) -> int:
        return len(self.items)


def test_an_in_process_actor_serves_async_calls_on_its_own_loop_and_kill_cancels_a_waiting_one():
    """As Ray serves an asyncio actor: a call that waits (``take``) does not block another caller's
    ``put`` from a second thread; arguments and results are copied, constructor handles are not;
    a call still waiting when the actor is killed ends (``CancelledError``) instead of hanging."""
    handle = object()
    box = InProcessTransport().actor(Mailbox, handle, name="mailbox")
    assert box.instance.handle is handle  # type: ignore[attr-defined]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        taking = pool.submit(box.call, "take", 10.0)
        mine = [1, 2]
        box.call("put", mine)
        assert taking.result(timeout=10) == [1, 2, -1] and mine == [1, 2]
        assert box.call("size") == 0
        waiting = pool.submit(box.call, "take", 60.0)
        time.sleep(0.2)  # let it wait on the loop (were it not yet there, kill still ends the loop)
        box.kill()
        with pytest.raises(concurrent.futures.CancelledError):
            waiting.result(timeout=10)


def test_a_ray_actor_is_asked_for_no_cpu_and_its_errors_arrive_as_themselves(ray_cluster):
    from posttrain.errors import BufferTimeoutError
    from posttrain.rollouts.buffer import RolloutBuffer

    buffer = RayTransport().actor(RolloutBuffer, 4, name="transport_test_buffer")
    try:
        assert ray.get_actor("transport_test_buffer")
        with pytest.raises(BufferTimeoutError, match="^claim of 4 samples timed out"):
            buffer.call("claim", 4, timeout_s=0.05)
    finally:
        buffer.kill()
