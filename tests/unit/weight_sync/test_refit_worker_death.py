"""A worker lost mid-refit over the broadcast transport (``weight_sync.refit``): the refit raises
the death, one line naming the worker, not the live side's closed socket.

The live side of a gloo collective fails first when its peer dies (its socket closed), so the
refit must wait for both sides together (``worker_group.wait_both``) at each of its two
collectives: joining the group, and sending/receiving the weights. Each side here is a real
Ray worker group whose calls behave as the real ones do when a peer dies (the multi-node fault
test kills a real worker node mid-run; this isolates the refit's own waiting, in seconds).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import ray

from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.worker_group import Pending, RayWorkerGroup
from posttrain.errors import WorkerDiedError
from posttrain.weight_sync.refit import _broadcast


@ray.remote
class Side:
    """One side of the refit's collective: loses its peer (gloo's closed socket) or dies."""

    def __init__(self, tag: str, rank: int):
        pass

    def lose_the_peer(self) -> None:
        time.sleep(0.5)  # the peer dies first; gloo then reports a closed connection
        raise RuntimeError("[gloo] Connection closed by peer")

    def die(self) -> None:
        os._exit(1)


def pending(group: RayWorkerGroup, call: str, method: str) -> Pending[Any]:
    return Pending(group.gather, group.submit_all(call), method, lambda answers: answers[0])


class Policy:
    """The policy side of ``_broadcast`` (``RefitSource``'s broadcast methods): its worker dies in
    ``dies_in`` ("join" or "send")."""

    def __init__(self, group: RayWorkerGroup, dies_in: str, engines: Any):
        self.group, self.dies_in = group, dies_in
        self.broadcast_peer = engines if dies_in == "send" else None  # "send": the group already joined

    def serve_weight_broadcast(self, timeout_s: float) -> tuple[str, int]:
        return "127.0.0.1", 1

    def start_joining_broadcast(self, world_size: int, timeout_s: float) -> Pending[Any]:
        return pending(self.group, "die", "join_weight_broadcast")

    def start_broadcast(self, bucket_bytes: int, probe: Any) -> Pending[Any]:
        return pending(self.group, "die", "broadcast_weights")


class Engines:
    """The engines' side (``RefitTarget``): their calls fail on the closed socket."""

    num_engines, refit_bucket_bytes = 1, 1 << 20

    def __init__(self, group: RayWorkerGroup):
        self.group = group

    def start_joining_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> Pending[Any]:
        return pending(self.group, "lose_the_peer", "join_weight_broadcast")

    def start_receiving(self, version: int, probe: Any) -> Pending[Any]:
        return pending(self.group, "lose_the_peer", "receive_weights")


@pytest.mark.parametrize(("dies_in", "method"), [("join", "join_weight_broadcast"), ("send", "broadcast_weights")])
def test_a_policy_worker_lost_mid_refit_is_the_error_not_the_engines_closed_socket(ray_cluster, dies_in, method):
    clusters = [RayVirtualCluster(1, num_cpus=0.5) for _ in range(2)]
    engine_group = RayWorkerGroup(clusters[0], Side, "engine")
    policy_group = RayWorkerGroup(clusters[1], Side, "policy")
    try:
        policy_group.wait_ready("policy")
        engines = Engines(engine_group)
        policy = Policy(policy_group, dies_in, engines)
        with pytest.raises(WorkerDiedError, match=rf"^Side worker 0 died during {method}: ") as err:
            _broadcast(policy, engines, 1, None, None)
        assert "\n" not in str(err.value)
    finally:
        for group in (engine_group, policy_group):
            group.shutdown()
        for cluster in clusters:
            cluster.shutdown()
