"""The driver's handles on the two actors of asynchronous GRPO, as ``Policy`` and ``EngineGroup``
are the handles on theirs: typed calls that wait for their answer and re-raise an actor's
one-line error as itself, so the loop holds no raw actor handle and calls no ``ray.get``.

Both actors are started through the run's transport (``distributed/transport.py``), as every
worker is: Ray actors by default, objects of this process under ``InProcessTransport``.
"""

from __future__ import annotations

from posttrain.algorithms.grpo_config import GRPOMasterConfig
from posttrain.algorithms.rollout_producer import RolloutProducer
from posttrain.data.types import MathProblem
from posttrain.distributed.transport import Actor, current_transport
from posttrain.models.generation.interfaces import Generation
from posttrain.rollouts.buffer import BufferStatus, RolloutBuffer, check_capacity
from posttrain.rollouts.samples import RolloutSample


class RolloutBufferClient:
    """A :class:`~posttrain.rollouts.buffer.RolloutBuffer` actor, started with ``capacity`` samples
    (an asyncio actor that reserves no CPU: it only holds data).

    Raises:
        ValueError: ``capacity`` not an int >= 1 (before an actor starts).
    """

    def __init__(self, capacity: int, name: str | None = None):
        # the producer puts into it directly: it is handed this handle
        self.actor: Actor = current_transport().actor(RolloutBuffer, check_capacity(capacity), name=name)

    def claim(self, n: int, timeout_s: float) -> list[RolloutSample]:
        """The next ``n`` unclaimed samples, FIFO (``RolloutBuffer.claim``).

        Raises:
            BufferTimeoutError: not ``n`` samples within ``timeout_s``.
        """
        return self.actor.call("claim", n, timeout_s=timeout_s)

    def clear(self, consumed: list[RolloutSample], dropped: list[RolloutSample]) -> None:
        """Clear a step's claimed samples: ``consumed`` trained on, ``dropped`` as too stale."""
        self.actor.call("clear", [s["sample_id"] for s in consumed], "consumed")
        self.actor.call("clear", [s["sample_id"] for s in dropped], "dropped")

    def status(self) -> BufferStatus:
        """A snapshot of the buffer's counts and cleared ids."""
        return self.actor.call("status")

    def kill(self) -> None:
        """End the actor (its samples go with it)."""
        self.actor.kill()


class RolloutProducerClient:
    """A :class:`~posttrain.algorithms.rollout_producer.RolloutProducer` actor sampling
    steps ``first_batch, first_batch + 1, ...`` with ``engine`` into ``buffer``, started.

    A threaded actor, so ``pause``/``resume``/``check`` are served while its sampling thread
    works; it reserves no CPU: the engines it drives hold the resources.
    """

    def __init__(self, engine: Generation, buffer: RolloutBufferClient, model_path: str,
                 problems: list[MathProblem], cfg: GRPOMasterConfig, first_batch: int):
        self.actor: Actor = current_transport().actor(RolloutProducer, engine, buffer.actor, model_path, problems,
                                                      cfg, first_batch, max_concurrency=4)
        self.actor.call("start")

    def check(self) -> float:
        """Raise the producer's error, if it had one; else its seconds of sampling so far."""
        return self.actor.call("check")

    def pause(self) -> float:
        """Stop sampling after the batch in flight (waited for); what :meth:`check` returns."""
        return self.actor.call("pause")

    def resume(self, trained: int) -> None:
        """Sample again, up to step ``trained + 1 + max_staleness``."""
        self.actor.call("resume", trained)

    def config_reads(self) -> frozenset[str]:
        """The config keys the producer read through its copy of the run's config."""
        return self.actor.call("config_reads")

    def kill(self) -> None:
        """End the actor and its sampling thread."""
        self.actor.kill()
