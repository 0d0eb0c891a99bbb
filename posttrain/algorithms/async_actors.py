"""The driver's handles on the two actors of asynchronous GRPO, as ``Policy`` and ``EngineGroup``
are the handles on theirs: typed calls that wait for their answer and re-raise an actor's
one-line error as itself (``distributed.worker_group.get_unwrapped``), so the loop holds no raw
actor handle and calls no ``ray.get``.
"""

from __future__ import annotations

from typing import Any

import ray

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.rollout_producer import RolloutProducer
from posttrain.data.types import MathProblem
from posttrain.distributed.worker_group import get_unwrapped
from posttrain.models.generation.interfaces import Generation
from posttrain.rollouts.buffer import BufferStatus, start_rollout_buffer
from posttrain.rollouts.samples import RolloutSample


class RolloutBufferClient:
    """A :class:`~posttrain.rollouts.buffer.RolloutBuffer` actor, started with ``capacity`` samples.

    Raises:
        ValueError: ``capacity`` not an int >= 1 (before an actor starts).
    """

    def __init__(self, capacity: int):
        self.actor: Any = start_rollout_buffer(capacity)  # the producer puts into it directly

    def claim(self, n: int, timeout_s: float) -> list[RolloutSample]:
        """The next ``n`` unclaimed samples, FIFO (``RolloutBuffer.claim``).

        Raises:
            BufferTimeoutError: not ``n`` samples within ``timeout_s``.
        """
        return get_unwrapped([self.actor.claim.remote(n, timeout_s=timeout_s)])[0]

    def clear(self, consumed: list[RolloutSample], dropped: list[RolloutSample]) -> None:
        """Clear a step's claimed samples: ``consumed`` trained on, ``dropped`` as too stale."""
        get_unwrapped([self.actor.clear.remote([s["sample_id"] for s in consumed], "consumed"),
                       self.actor.clear.remote([s["sample_id"] for s in dropped], "dropped")])

    def status(self) -> BufferStatus:
        """A snapshot of the buffer's counts and cleared ids."""
        return get_unwrapped([self.actor.status.remote()])[0]

    def kill(self) -> None:
        """End the actor (its samples go with it)."""
        ray.kill(self.actor)


class RolloutProducerClient:
    """A :class:`~posttrain.algorithms.rollout_producer.RolloutProducerImpl` actor sampling
    steps ``first_batch, first_batch + 1, ...`` with ``engine`` into ``buffer``, started.

    A threaded actor, so ``pause``/``resume``/``check`` are served while its sampling thread
    works; it reserves no CPU: the engines it drives hold the resources.
    """

    def __init__(self, engine: Generation, buffer: RolloutBufferClient, model_path: str,
                 problems: list[MathProblem], cfg: GRPOMasterConfig, first_batch: int):
        self.actor: Any = RolloutProducer.options(  # type: ignore[attr-defined]
            num_cpus=0, max_concurrency=4).remote(engine, buffer.actor, model_path, problems, cfg, first_batch)
        get_unwrapped([self.actor.start.remote()])

    def check(self) -> float:
        """Raise the producer's error, if it had one; else its seconds of sampling so far."""
        return get_unwrapped([self.actor.check.remote()])[0]

    def pause(self) -> float:
        """Stop sampling after the batch in flight (waited for); what :meth:`check` returns."""
        return get_unwrapped([self.actor.pause.remote()])[0]

    def resume(self, trained: int) -> None:
        """Sample again, up to step ``trained + 1 + max_staleness``."""
        get_unwrapped([self.actor.resume.remote(trained)])

    def kill(self) -> None:
        """End the actor and its sampling thread."""
        ray.kill(self.actor)
