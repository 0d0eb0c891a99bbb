"""The engine contract: every method an engine worker has, in one base class.

An engine worker is the class a ``ray.remote`` wrapper puts in an actor (one per engine);
``EngineGroup`` drives a group of them, and its calls are exactly the methods below. The refit
side (``update_weights``, ``join_weight_broadcast``, ``receive_weights``, with one strictness)
is inherited from ``weight_sync.receiver.WeightReceiver``; what an engine implements there is
:meth:`refit_shapes`, :meth:`_load_weights` and :meth:`refit_device`.

Construction: ``Worker(model_path, cfg, rank=r)`` with ``cfg`` a ``GenerationWorkerConfig``, kept as
``self.cfg`` (``config_reads`` answers which of the run's keys the engine read through it).
A new engine is this class's subclass in a folder of its own plus one row in
``backends.BACKENDS`` (``register_backend``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.config_reads import ReadsConfig
from posttrain.data.batch import TokenBatch, make_batch
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.ops import compute_logprobs
from posttrain.weight_sync.receiver import WeightReceiver


def teacher_forced_logprobs(forward: Callable[[TokenBatch], torch.Tensor], prompts: list[list[int]],
                            completions: list[list[int]], temperature: float, pad_id: int,
                            device: torch.device) -> list[list[float]]:
    """Per row, ``log p(completion[t] | prompt + completion[:t])`` at ``temperature`` over the whole
    vocabulary, from one prefill of each right-padded sequence: an engine's ``score``.

    Args:
        forward: the engine's model, ``TokenBatch`` -> ``[B, S, V]`` logits (V: the real vocabulary).
        prompts, completions: token ids per row (``completions[i]`` may be empty).
        temperature: > 0.
        pad_id: written into the padding (never read: the padding is right of every real token).
        device: where the batch goes.

    Returns:
        One list per row, as long as its completion.
    """
    if not prompts:
        return []
    batch = make_batch(prompts, completions, pad_id).to(device)
    width = batch.completion_mask.shape[1]
    logprobs = compute_logprobs(forward(batch), batch.input_ids, batch.prompt_lens, width, temperature).cpu()  # [B, L]
    return [row[: len(c)] for row, c in zip(logprobs.tolist(), completions, strict=True)]


class EngineWorker(WeightReceiver, ReadsConfig):
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
