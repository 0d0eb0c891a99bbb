"""The engine contract: every method an engine worker has, in one base class.

An engine worker is the class a ``ray.remote`` wrapper puts in an actor (one per engine);
``EngineGroup`` drives a group of them, and its calls are exactly the methods below. The refit
side (``update_weights``, ``join_weight_broadcast``, ``receive_weights``, with one strictness)
is inherited from ``weight_sync.receiver.WeightReceiver``; what an engine implements there is
:meth:`refit_shapes`, :meth:`_load_weights` and :meth:`refit_device`.

Construction: ``Worker(model_path, cfg, rank=r)`` with ``cfg`` a ``GenerationWorkerConfig``.
A new engine is this class's subclass in a folder of its own plus one row in
``backends.BACKENDS`` (``register_backend``).
"""

from __future__ import annotations

from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.weight_sync.receiver import WeightReceiver


class EngineWorker(WeightReceiver):
    """Base class of every engine worker (see the module doc); the methods without a body here
    raise ``NotImplementedError`` until a subclass implements them."""

    def start(self) -> None:
        """Finish starting (load what the constructor left; a failure is an exception with one
        line, collected by ``EngineGroup.wait_ready``). Default: nothing left to do."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt (``Generation.generate``): tokens, their logprobs
        under the sampling distribution, and the weight version that produced them."""
        raise NotImplementedError

    def gpu_uuid(self) -> str | None:
        """The UUID of the engine's GPU (None on a CPU): the refit transport depends on it."""
        raise NotImplementedError

    def shutdown(self) -> None:
        """Release what the engine holds before its actor is killed (default: nothing)."""
