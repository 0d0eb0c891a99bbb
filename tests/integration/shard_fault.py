"""A gradient that is not finite in one data-parallel rank's shard only, for the data-parallel tests.

A NaN that enters through the data (an advantage, a logprob) reaches every rank's shard: FSDP2's
reduce-scatter sums the ranks' gradients before each rank keeps its part. What can poison one
shard alone is the sharded gradient itself (an overflow in one parameter's gradient), and then
only the norm over the whole gradient sees it. :class:`ShardFaultTransport` runs a real run with
the HF policy worker replaced by :class:`ShardFaultWorker`, which writes +inf into the last rank's
shard of one parameter's gradient before the run's first optimizer step (the whole gradient of a
worker that trains alone): every rank must then skip that step and count it, or the ranks'
shards part ways. The transport is chosen (``use_transport``), the library is not patched.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import ray
import torch

from posttrain.distributed.transport import Cluster, RayTransport, WorkerGroup
from posttrain.models.policy.hf_policy_worker import HfPolicyWorker, HfPolicyWorkerImpl

# The worker's class travels to Ray's workers by value: they cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ShardFaultWorker(HfPolicyWorkerImpl):
    """The HF policy worker whose first optimizer step finds +inf (an overflow) in the first element
    of the last data-parallel rank's shard of the first trainable parameter's gradient."""

    faulted = False

    def _optimizer_step(self) -> float:
        if not self.faulted and self.rank == self.data_parallel_size - 1:
            grad = next(p.grad for p in self.trainable_parameters() if p.grad is not None)
            local = grad.to_local() if hasattr(grad, "to_local") else grad  # this rank's rows, same storage
            with torch.no_grad():
                local.view(-1)[0] = math.inf
        self.faulted = True
        return super()._optimizer_step()


class ShardFaultTransport(RayTransport):
    """Ray, with every group of a worker class in ``faulty`` made of its faulty subclass (default:
    the HF policy worker's, :class:`ShardFaultWorker`)."""

    def __init__(self, faulty: dict[Any, type] | None = None):
        self.faulty = faulty or {HfPolicyWorker: ShardFaultWorker}

    def group(self, cluster: Cluster, actor_cls: Any, *args: Any, bundle_indices: Sequence[int] | None = None,
              reserve: bool = True, **kwargs: Any) -> WorkerGroup:
        if actor_cls in self.faulty:
            actor_cls = ray.remote(self.faulty[actor_cls])
        return super().group(cluster, actor_cls, *args, bundle_indices=bundle_indices, reserve=reserve, **kwargs)
