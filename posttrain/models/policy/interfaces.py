"""What the algorithms need from a policy, whatever the backend (Hugging Face, Megatron)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from posttrain.data.batch import TokenBatch
from posttrain.weight_sync.refit import RefitSource

Metrics = dict[str, float]


@dataclass(frozen=True)
class TrainResult:
    """What one :meth:`PolicyInterface.train` call reports, all of it at once.

    Attributes:
        metrics: averaged over the call's optimizer steps (``PolicyWorkerBase.train``).
        weight_version: the policy's weight version after the call (completed optimizer
            steps, skipped ones included).
        peak_memory_gib: peak resident memory of the policy worker processes, GiB (the largest).
        old_logprobs: ``[B, L]`` float32 logprobs of the batch under the weights the call
            started from, scored by the worker in the call (rank 0's); None when the loss
            reads none.
        timing: ``timing/train_worker``, ``timing/reference_step`` (s) and
            ``timing/train_over_reference`` on the calls that timed the plain torch reference
            (``policy.reference_timing_period``; rank 0's), else empty.
    """

    metrics: Metrics
    weight_version: int
    peak_memory_gib: float
    old_logprobs: torch.Tensor | None
    timing: dict[str, float] = field(default_factory=dict)


class LossFn(Protocol):
    """A picklable loss over one micro-batch (see ``posttrain.algorithms.loss_functions``).

    Called as ``loss_fn(logprobs [B, L], data, num_tokens) -> (loss, metrics)``; ``data``
    holds the micro-batch's ``completion_mask`` and any per-sample tensors the driver sent.
    Metrics are per-micro-batch contributions: keys ending in ``_min`` / ``_max`` are reduced
    with min / max across micro-batches, all others are summed.

    A loss that reads ``data["old_logprobs"]`` (the policy the train call starts from) says so
    with a true class attribute ``uses_old_logprobs``: the worker then scores them itself
    when the driver sends none (see ``PolicyWorkerBase.train``). Without the attribute, none.
    """

    def __call__(self, logprobs: torch.Tensor, data: dict[str, torch.Tensor],
                 num_tokens: float) -> tuple[torch.Tensor, Metrics]: ...


class PolicyInterface(RefitSource, Protocol):
    """A trainable policy: logprobs, a train step, and the refit's sending side (``RefitSource``)."""

    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 logprobs of the completion tokens (current or reference policy)
        under the sampling distribution (temperature, top-k, top-p; ``whole_vocab``: the
        temperature only)."""
        ...

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> TrainResult:
        """One training step over ``batch`` (one or more optimizer steps): its metrics, the new
        weight version, peak memory and the old logprobs, in one :class:`TrainResult`."""
        ...

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The current weights (Hugging Face names, CPU tensors), fetched to the caller."""
        ...

    @property
    def weight_version(self) -> int:
        """Number of completed ``train`` calls; the generation engine must report the same."""
        ...
