"""Tests for posttrain.rollouts.buffer: the rollout buffer of asynchronous GRPO.

A sample claimed twice is trained on twice, a lost one never; both still give a loss. So the
tests count sample_ids exactly (``Counter``, not sets), in-process and across a real Ray actor
with two consumers racing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from unit.rollouts.rollout_helpers import ids, make_group

from posttrain.errors import BufferTimeoutError, RolloutTagError
from posttrain.rollouts.buffer import BufferStatus, RolloutBuffer
from posttrain.rollouts.samples import RolloutSample


def _run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(scenario(), 20))  # a hang fails, it does not stall the suite


def _empty(**counts: Any) -> BufferStatus:
    fields: dict[str, Any] = dict(unclaimed=0, claimed=0, consumed=0, dropped=0, put_total=0, claim_cursor=0,
                                  consumed_ids=frozenset(), dropped_ids=frozenset())
    return BufferStatus(**{**fields, **counts})


@pytest.mark.parametrize("bad", [0, -3, True, 2.0])
def test_capacity_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError, match="capacity") as err:
        RolloutBuffer(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(err.value)


def test_claims_are_fifo_exact_and_whole_groups() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=32)
        await buf.put(make_group(0) + make_group(1))
        await buf.put(make_group(2))
        await buf.put(make_group(3) + make_group(4))
        assert ids(await buf.claim(4)) == ids(make_group(0))
        assert ids(await buf.claim(8)) == ids(make_group(1) + make_group(2))
        assert ids(await buf.claim(4)) == ids(make_group(3))
        assert await buf.status() == _empty(unclaimed=4, claimed=16, put_total=20, claim_cursor=16)

    _run(scenario)


@pytest.mark.parametrize("n", [2, 6, 7])
def test_a_claim_that_would_split_a_group_raises_and_takes_nothing(n: int) -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=12)
        await buf.put(make_group(0) + make_group(1) + make_group(2))
        with pytest.raises(ValueError, match=f"claiming {n} samples would split group") as err:
            await buf.claim(n)
        assert "\n" not in str(err.value)
        assert await buf.status() == _empty(unclaimed=12, put_total=12)
        assert ids(await buf.claim(4)) == [0, 1, 2, 3]

    _run(scenario)


@pytest.mark.parametrize("n", [0, -1, 9, True])
def test_a_claim_that_can_never_be_satisfied_raises_at_once(n: int) -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=8)
        with pytest.raises(ValueError, match="claim size"):
            await buf.claim(n, timeout_s=None)  # raises instead of waiting forever

    _run(scenario)


def test_a_put_larger_than_capacity_raises_at_once() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=7)
        with pytest.raises(ValueError, match="cannot put 8 samples into a buffer of capacity 7"):
            await buf.put(make_group(0, size=8), timeout_s=None)

    _run(scenario)


def test_a_full_buffer_makes_put_wait_until_a_clear_frees_room() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=8)
        await buf.put(make_group(0) + make_group(1))
        claimed = await buf.claim(4)
        waiting = asyncio.create_task(buf.put(make_group(2), timeout_s=10))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # claimed samples still count towards capacity
        await buf.clear(ids(claimed), "consumed")
        await asyncio.wait_for(waiting, 5)
        assert await buf.status() == _empty(unclaimed=8, consumed=4, put_total=12, claim_cursor=4,
                                            consumed_ids=frozenset(ids(claimed)))

    _run(scenario)


def test_a_claim_waits_for_enough_samples() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=16)
        waiting = asyncio.create_task(buf.claim(8, timeout_s=10))
        await buf.put(make_group(0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await buf.put(make_group(1))
        assert ids(await asyncio.wait_for(waiting, 5)) == list(range(8))

    _run(scenario)


def test_concurrent_claims_never_share_a_sample() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=32)
        waiting = [asyncio.create_task(buf.claim(4, timeout_s=10)) for _ in range(3)]
        await asyncio.sleep(0.01)  # all three wait, then one put wakes them together
        await buf.put(make_group(0) + make_group(1) + make_group(2))
        got = await asyncio.gather(*waiting)
        assert Counter(i for claim in got for i in ids(claim)) == Counter(range(12))
        assert sorted(ids(claim) for claim in got) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]

    _run(scenario)


def test_timeouts_raise_buffer_timeout_error_and_change_nothing() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=6)
        with pytest.raises(BufferTimeoutError, match="claim of 4 samples timed out after 0.05 s: 0 unclaimed"):
            await buf.claim(4, timeout_s=0.05)
        await buf.put(make_group(0))
        with pytest.raises(BufferTimeoutError, match="put of 4 samples .* holds 4 of capacity 6") as err:
            await buf.put(make_group(1), timeout_s=0.05)
        assert "\n" not in str(err.value) and err.value.exit_code == 1
        assert await buf.status() == _empty(unclaimed=4, put_total=4)
        assert ids(await buf.claim(4, timeout_s=0)) == [0, 1, 2, 3]  # the buffer still works; 0: no wait
        await buf.clear([0, 1, 2, 3], "consumed")
        await buf.put(make_group(1), timeout_s=0)  # room now: 0 does not wait, nor time out

    _run(scenario)


def test_bad_sample_ids_and_groups_raise_and_change_nothing() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=32)
        await buf.put(make_group(0))
        duplicate = make_group(1) + [make_group(9, first_id=2)[0]]  # sample 2 was put before
        with pytest.raises(RolloutTagError, match="sample 2 was put before"):
            await buf.put(duplicate)
        twice_here = make_group(1) + make_group(2, first_id=7)  # sample 7 twice in one put
        with pytest.raises(RolloutTagError, match="sample 7 was put before"):
            await buf.put(twice_here)
        with pytest.raises(RolloutTagError, match="group 0 is put in pieces"):
            await buf.put(make_group(0, first_id=100))
        g1, g2 = make_group(1), make_group(2)
        with pytest.raises(RolloutTagError, match="group 1 is put in pieces"):
            await buf.put(g1[:2] + g2 + g1[2:])
        for tag in ("sample_id", "group_id"):
            sample = make_group(5)
            del sample[1][tag]  # type: ignore[misc]
            with pytest.raises(RolloutTagError, match=f"no '{tag}' tag"):
                await buf.put(sample)
        sample = make_group(5)
        sample[0]["sample_id"] = True
        with pytest.raises(RolloutTagError, match="'sample_id' must be an int"):
            await buf.put(sample)
        assert await buf.status() == _empty(unclaimed=4, put_total=4)
        await buf.put(make_group(1))  # none of the failed puts reserved ids or groups
        assert ids(await buf.claim(8)) == list(range(8))

    _run(scenario)


def test_clear_of_an_id_not_claimed_raises_and_clears_nothing() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=16)
        await buf.put(make_group(0) + make_group(1) + make_group(2))
        claimed = ids(await buf.claim(8))
        await buf.clear(claimed[:2], "dropped")
        before = await buf.status()
        for bad, state in [(9, "unclaimed"), (50, "never put"), (0, "cleared already")]:
            with pytest.raises(ValueError, match=f"cannot clear sample {bad}: it is not claimed \\({state}\\)"):
                await buf.clear([claimed[2], bad], "consumed")  # the good id first: it must stay claimed
        with pytest.raises(ValueError, match="cleared already"):
            await buf.clear([claimed[2], claimed[2]], "consumed")
        with pytest.raises(ValueError, match="'trained'"):
            await buf.clear([claimed[2]], "trained")  # type: ignore[arg-type]
        assert await buf.status() == before
        await buf.clear(claimed[2:], "consumed")
        assert await buf.status() == _empty(unclaimed=4, consumed=6, dropped=2, put_total=12, claim_cursor=8,
                                            consumed_ids=frozenset(claimed[2:]), dropped_ids=frozenset(claimed[:2]))

    _run(scenario)


def test_status_follows_every_step() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=12)
        assert await buf.status() == _empty()
        await buf.put(make_group(0) + make_group(1))
        assert await buf.status() == _empty(unclaimed=8, put_total=8)
        first = ids(await buf.claim(4))
        assert await buf.status() == _empty(unclaimed=4, claimed=4, put_total=8, claim_cursor=4)
        await buf.put(make_group(2))
        second = ids(await buf.claim(8))
        status = await buf.status()
        assert status == _empty(claimed=12, put_total=12, claim_cursor=12) and status.size == 12
        await buf.clear(second[:4], "dropped")
        await buf.clear(first + second[4:], "consumed")
        status = await buf.status()
        assert status == _empty(consumed=8, dropped=4, put_total=12, claim_cursor=12,
                                consumed_ids=frozenset(first + second[4:]), dropped_ids=frozenset(second[:4]))
        assert status.size == 0

    _run(scenario)


def test_samples_do_not_alias_the_buffer() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=8)
        put = make_group(0)
        await buf.put(put)
        put[0]["completion_ids"].append(99)  # the producer's later edit
        put[1]["sample_id"] = 42
        claimed = await buf.claim(4)
        assert claimed == make_group(0)
        # nothing the buffer reports reads a claimed sample back, so look inside
        claimed[0]["completion_ids"].clear()
        claimed[0]["sample_id"] = 77
        held: dict[int, RolloutSample] = buf._claimed
        assert held[0] == make_group(0)[0] and all(held[s["sample_id"]] is not s for s in claimed[1:])
        await buf.clear([0, 1, 2, 3], "consumed")
        assert (await buf.status()).consumed_ids == frozenset({0, 1, 2, 3})

    _run(scenario)


# --- as a Ray actor -------------------------------------------------------------------------

GROUP = 8


def test_two_consumers_racing_one_producer_lose_and_duplicate_nothing(ray_cluster) -> None:
    """1,024 samples in groups of 8 through an actor of capacity 64: the producer waits on clears,
    two consumers (claims of 8 and of 16) race for every group; every id comes out exactly once."""
    import ray

    total_groups = 128
    put_ids = [s["sample_id"] for g in range(total_groups) for s in make_group(g, GROUP)]
    from posttrain.distributed.worker_group import RayActor

    buf = RayActor(RolloutBuffer, 64, name="test_rollout_buffer").handle
    try:
        assert ray.get_actor("test_rollout_buffer")  # findable by its name

        async def produce() -> None:
            g = 0
            while g < total_groups:  # one or two groups a put
                batch = [s for k in range(g, min(g + 1 + g % 2, total_groups)) for s in make_group(k, GROUP)]
                await buf.put.remote(batch, timeout_s=10)
                g += len(batch) // GROUP

        async def consume(n: int, done: asyncio.Event, out: list[list[RolloutSample]]) -> None:
            while True:
                try:
                    got = await buf.claim.remote(n, timeout_s=0.2)
                except BufferTimeoutError:
                    if done.is_set() and (await buf.status.remote()).unclaimed < n:
                        return
                    continue
                out.append(got)
                await buf.clear.remote(ids(got), "consumed")

        async def scenario() -> tuple[list[list[RolloutSample]], list[list[RolloutSample]]]:
            done = asyncio.Event()
            a: list[list[RolloutSample]] = []
            b: list[list[RolloutSample]] = []
            consumers = [asyncio.create_task(consume(8, done, a)), asyncio.create_task(consume(16, done, b))]
            await produce()
            done.set()
            await asyncio.gather(*consumers)
            return a, b

        a, b = asyncio.run(asyncio.wait_for(scenario(), 60))
        assert a and b  # both consumers got work: they raced
        for claims, n in ((a, 8), (b, 16)):
            for got in claims:
                assert len(got) == n and all(c == GROUP for c in Counter(s["group_id"] for s in got).values())
        got_ids = [s["sample_id"] for claims in (a, b) for got in claims for s in got]
        assert Counter(got_ids) == Counter(put_ids)
        status = ray.get(buf.status.remote())
        assert status == _empty(consumed=len(put_ids), put_total=len(put_ids), claim_cursor=len(put_ids),
                                consumed_ids=frozenset(put_ids))
        assert status.size == 0
    finally:
        ray.kill(buf)


def test_errors_reach_the_caller_of_the_actor_as_themselves(ray_cluster) -> None:
    import ray

    from posttrain.algorithms.async_actors import RolloutBufferClient
    from posttrain.distributed.worker_group import RayActor

    buf = RayActor(RolloutBuffer, 8).handle
    try:
        with pytest.raises(BufferTimeoutError, match="claim of 4 samples timed out"):
            ray.get(buf.claim.remote(4, timeout_s=0.05))
        ray.get(buf.put.remote(make_group(0)))
        with pytest.raises(RolloutTagError, match="sample 0 was put before"):
            ray.get(buf.put.remote(make_group(3, first_id=0)))
        with pytest.raises(ValueError, match="not claimed"):
            ray.get(buf.clear.remote([0], "consumed"))
        with pytest.raises(ValueError, match="capacity"):
            RolloutBufferClient(capacity=0)  # checked before an actor starts
    finally:
        ray.kill(buf)


# --- behaviours the automatic mutation run (tests/mutation/run_auto.sh) found untested ------------


def test_the_buffer_reads_only_the_sample_and_group_ids() -> None:
    """Only ``sample_id`` and ``group_id`` are the buffer's business: a sample without the other
    tags (weight version, seq_len: the filters' and the fan-out's) goes through."""
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=4)
        await buf.put([{"sample_id": 0, "group_id": 0}, {"sample_id": 1, "group_id": 0}])  # type: ignore[list-item]
        assert ids(await buf.claim(2)) == [0, 1]

    _run(scenario)


def test_a_claim_of_one_sample_and_a_claim_of_the_whole_capacity_are_allowed() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=4)
        await buf.put(make_group(0, size=1))
        assert ids(await buf.claim(1)) == [0]
        await buf.put(make_group(1, size=3))
        await buf.clear([0], "consumed")
        await buf.put(make_group(2, size=1))
        assert ids(await buf.claim(4)) == [3, 4, 5, 2]  # put order: group 1 (ids 3-5), then group 2

    _run(scenario)


def test_put_and_claim_wait_a_minute_by_default() -> None:
    import inspect

    for method in (RolloutBuffer.put, RolloutBuffer.claim):
        assert inspect.signature(method).parameters["timeout_s"].default == 60.0


def test_the_put_errors_are_whole_sentences_naming_the_sample() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(capacity=7)
        with pytest.raises(ValueError, match=r"^cannot put 8 samples into a buffer of capacity 7 "
                                             r"\(it would wait forever\)$"):
            await buf.put(make_group(0, size=8))
        g1, g2 = make_group(1, size=2), make_group(2, size=2)
        with pytest.raises(RolloutTagError, match=r"^sample 3: group 1 is put in pieces "
                                                  r"\(put each group whole, its samples together\)$"):
            await buf.put(g1[:1] + g2 + g1[1:])

    _run(scenario)


def test_the_buffer_actor_is_asked_of_ray_named_and_with_no_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The actor only holds data: it must reserve no CPU (a reserved one would starve the workers of
    a 2-CPU cluster), carry the name it is found by, and be checked for its capacity before Ray is
    asked. A stand-in ``ray`` records the calls (the real actor: the two Ray tests above)."""
    import types

    from posttrain.algorithms.async_actors import RolloutBufferClient
    from posttrain.distributed import worker_group

    calls: list[tuple[str, object]] = []

    class _Actor:
        def options(self, **kwargs: object) -> _Actor:
            calls.append(("options", kwargs))
            return self

        def remote(self, *args: object) -> str:
            calls.append(("remote", args))
            return "handle"

    fake = types.SimpleNamespace(remote=lambda cls: calls.append(("actor class", cls)) or _Actor())
    monkeypatch.setattr(worker_group, "ray", fake)
    assert RolloutBufferClient(3, name="buf").actor.handle == "handle"  # type: ignore[attr-defined]
    assert calls == [("actor class", RolloutBuffer), ("options", {"num_cpus": 0, "name": "buf"}), ("remote", (3,))]
    calls.clear()
    with pytest.raises(ValueError, match="capacity"):
        RolloutBufferClient(0)
    assert calls == []


def test_a_buffer_of_capacity_one_holds_a_sample() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(1)
        await buf.put(make_group(0, size=1))
        assert ids(await buf.claim(1)) == [0]

    _run(scenario)


def test_claiming_a_one_sample_group_ahead_of_a_bigger_group_splits_nothing() -> None:
    async def scenario() -> None:
        buf = RolloutBuffer(8)
        await buf.put(make_group(0, size=1) + make_group(1, size=2, first_id=1))
        assert ids(await buf.claim(1)) == [0]
        assert ids(await buf.claim(2)) == [1, 2]

    _run(scenario)


def test_the_loops_handle_clears_each_sample_as_what_happened_to_it(ray_cluster) -> None:
    """``RolloutBufferClient``, as the async loop uses it: a step's claim cleared as the kept
    (consumed) and the stale (dropped) samples, each id under its own outcome; a claim that
    times out is the buffer's own one-line error."""
    from posttrain.algorithms.async_actors import RolloutBufferClient

    buffer = RolloutBufferClient(capacity=16)
    try:
        buffer.actor.call("put", make_group(0, GROUP) + make_group(1, GROUP))
        claimed = buffer.claim(2 * GROUP, timeout_s=10)
        kept, dropped = claimed[:GROUP], claimed[GROUP:]
        buffer.clear(consumed=kept, dropped=dropped)
        status = buffer.status()
        assert (status.consumed_ids, status.dropped_ids) == (frozenset(ids(kept)), frozenset(ids(dropped)))
        assert status.size == 0
        with pytest.raises(BufferTimeoutError):
            buffer.claim(GROUP, timeout_s=0.1)
    finally:
        buffer.kill()
