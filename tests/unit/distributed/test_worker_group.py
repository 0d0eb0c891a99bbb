"""RayVirtualCluster and RayWorkerGroup on a real local Ray cluster."""

import os
import time

import pytest
import ray

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import RayWorkerGroup
from posttrain.errors import ConfigError, WorkerStartError


@ray.remote
class Echo:
    def __init__(self, tag: str, rank: int):
        self.tag, self.rank = tag, rank

    def whoami(self) -> tuple[str, int]:
        return self.tag, self.rank

    def double(self, xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    def add(self, xs: list[int], ys: list[int], scale: int = 1) -> list[int]:
        return [scale * (x + y) for x, y in zip(xs, ys, strict=True)]

    def die_if(self, rank: int) -> int:
        if self.rank == rank:
            os._exit(1)  # as the OOM killer or a segfault would, in the middle of the call
        return self.rank

    def refuse(self) -> None:
        raise ConfigError("checkpoint 'x' holds no LoRA adapter")

    def crash(self) -> None:
        raise KeyError("not a posttrain error")


@pytest.mark.slow(reason="real Ray worker actors")
def test_worker_group_fans_out_in_rank_order(ray_cluster):
    cluster = RayVirtualCluster(2, num_cpus=0.5)
    group = RayWorkerGroup(cluster, Echo, "t")
    try:
        assert group.run_all("whoami") == [("t", 0), ("t", 1)]
        assert group.run_sharded("double", [[1, 2], [3]]) == [[2, 4], [6]]
        # several shard lists: worker r gets the r-th shard of each
        assert group.run_sharded("add", [[1], [2, 3]], [[10], [20, 30]], scale=2) == [[22], [44, 66]]
        with pytest.raises(ValueError, match="3 shards for 2 workers"):
            group.run_sharded("double", [[1], [2], [3]])
        with pytest.raises(ValueError, match="1 shards for 2 workers"):
            group.run_sharded("add", [[1], [2]], [[1]])
        # a worker's one-line error reaches the driver as itself, not inside Ray's traceback
        with pytest.raises(ConfigError) as refused:
            group.run_all("refuse")
        assert type(refused.value) is ConfigError and str(refused.value) == "checkpoint 'x' holds no LoRA adapter"
        with pytest.raises(ray.exceptions.RayTaskError):  # anything else stays Ray's, with its traceback
            group.run_all("crash")
    finally:
        group.shutdown()
        cluster.shutdown()


@ray.remote
class FailsToStart:
    def __init__(self, rank: int):
        if rank == 1:
            try:
                open("/nonexistent/weights.bin")
            except OSError as exc:  # a chained error: the last one is the one to report
                raise ValueError("cannot load weights\nsecond line of the message") from exc


@pytest.mark.slow(reason="real Ray worker actors")
def test_wait_ready_passes_when_all_workers_start(ray_cluster):
    cluster = RayVirtualCluster(2, num_cpus=0.5)
    group = RayWorkerGroup(cluster, Echo, "t")
    try:
        group.wait_ready("echo worker")
        assert group.run_all("whoami") == [("t", 0), ("t", 1)]
    finally:
        group.shutdown()
        cluster.shutdown()


@pytest.mark.slow(reason="real Ray worker actors")
def test_a_constructor_error_is_one_line_at_wait_ready(ray_cluster):
    cluster = RayVirtualCluster(2, num_cpus=0.5)
    group = RayWorkerGroup(cluster, FailsToStart)
    try:
        with pytest.raises(WorkerStartError) as err:
            group.wait_ready("test worker")
        assert str(err.value) == "test worker did not start: ValueError: cannot load weights"
        assert group.workers == []  # killed: the Ray leak check would fail this test otherwise
    finally:
        group.shutdown()
        cluster.shutdown()


def test_oversized_cluster_is_a_clear_error(ray_cluster):
    with pytest.raises(ConfigError, match=r"needs 6 CPU \(3 bundles x 2\) but the Ray cluster has 2"):
        RayVirtualCluster(3, num_cpus=2)


@pytest.mark.slow(reason="real Ray worker actors")
def test_a_worker_that_dies_mid_call_is_one_line_naming_it(ray_cluster):
    from posttrain.errors import WorkerDiedError

    cluster = RayVirtualCluster(2, num_cpus=0.5)
    group = RayWorkerGroup(cluster, Echo, "t")
    try:
        group.wait_ready("echo worker")
        # (ray.kill from here raced with the call: the call could finish before the kill landed)
        with pytest.raises(WorkerDiedError, match=r"^Echo worker 1 died during die_if: ") as err:
            group.run_all("die_if", 1)
        assert "\n" not in str(err.value) and err.value.exit_code == 1
    finally:
        group.shutdown()
        cluster.shutdown()


def test_once_the_nodes_are_known_a_worker_that_dies_is_named_with_its_node(ray_cluster, monkeypatch):
    """The node of a lost worker is what tells a lost machine from a crashed process (the node that
    leaves the cluster: tests/integration/test_multinode.py); here the node lives on."""
    from posttrain.distributed import worker_group
    from posttrain.errors import WorkerDiedError

    monkeypatch.setattr(worker_group, "NODE_DEATH_WAIT_S", 0.0)  # the node is alive: no wait for the GCS's verdict
    cluster = RayVirtualCluster(2, num_cpus=0.5)
    group = RayWorkerGroup(cluster, Echo, "t")
    try:
        group.wait_ready("echo worker")
        node = group.node_ids()[1]
        address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}[node]
        with pytest.raises(WorkerDiedError) as err:
            group.run_all("die_if", 1)
        assert str(err.value).startswith(f"Echo worker 1 died during die_if on node {node[:8]} ({address}): ")
    finally:
        group.shutdown()
        cluster.shutdown()


@ray.remote
class Peer:
    """One side of a collective: fails as a socket whose peer vanished, dies, or answers."""

    def __init__(self, tag: str, rank: int):
        self.tag = tag

    def lose_the_peer(self) -> None:
        time.sleep(0.5)  # the peer dies first; gloo then reports a closed connection
        raise RuntimeError("[gloo] Connection closed by peer")

    def die(self) -> None:
        os._exit(1)

    def answer(self) -> str:
        time.sleep(0.2)
        return self.tag


@pytest.mark.parametrize("other", ["die", "answer"])
@pytest.mark.slow(reason="real Ray worker actors and a collective")
def test_a_collective_whose_peer_died_reports_the_death_not_the_closed_socket(ray_cluster, other):
    """``wait_both``: the receivers fail because the sender died mid-broadcast; the one line names the
    dead sender. A receiver that fails while its peer lives keeps its own error."""
    from posttrain.distributed.worker_group import Pending, wait_both
    from posttrain.errors import WorkerDiedError

    clusters = [RayVirtualCluster(1, num_cpus=0.5) for _ in range(2)]
    receivers, sender = RayWorkerGroup(clusters[0], Peer, "engine"), RayWorkerGroup(clusters[1], Peer, "policy")
    try:
        sender.wait_ready("sender")
        first = Pending(receivers.gather, receivers.submit_all("lose_the_peer"), "receive_weights", lambda a: a[0])
        second = Pending(sender.gather, sender.submit_all(other), "broadcast_weights", lambda a: a[0])
        if other == "die":
            with pytest.raises(WorkerDiedError, match=r"^Peer worker 0 died during broadcast_weights: "):
                wait_both(first, second)
            return
        with pytest.raises(ray.exceptions.RayTaskError, match="Connection closed by peer"):
            wait_both(first, second)
        # both sides answer: both values, the first side's first
        both = wait_both(Pending(receivers.gather, receivers.submit_all("answer"), "answer", lambda a: a[0]),
                         Pending(sender.gather, sender.submit_all("answer"), "answer", lambda a: a[0]))
        assert both == ("engine", "policy")
    finally:
        for group in (receivers, sender):
            group.shutdown()
        for cluster in clusters:
            cluster.shutdown()
