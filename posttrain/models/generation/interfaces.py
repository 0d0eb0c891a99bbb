"""The ``Generation`` interface: what algorithms need from an inference engine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from posttrain.weight_sync.refit import RefitTarget


@dataclass(frozen=True)
class SamplingParams:
    """How to sample.

    Attributes:
        max_new_tokens: completion length cap, tokens (EOS included when produced).
        temperature: > 0; ignored when ``greedy``.
        top_p: nucleus mass in (0, 1]; 1.0 disables it.
        top_k: 0 disables it. Top-k applies first, then top-p over the top-k tokens'
            renormalised probabilities (``posttrain.ops.sampling_mask``).
        greedy: argmax decoding (validation).
        seed: the sampling seed: the same seed, prompts and weights give the same samples
            (a resumed run samples what the uninterrupted one did); callers vary it per call
            (GRPO: per step). Each worker and prompt derives its own stream from it.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    seed: int = 0


@dataclass
class GenerationOutput:
    """Completions of a batch of prompts, in prompt order.

    Attributes:
        completion_ids: per prompt, the generated token ids, ending with EOS when the model
            stopped (not padded; length <= ``max_new_tokens``).
        logprobs: per prompt, the engine's logprob of each generated token under the
            distribution it was drawn from (same lengths as ``completion_ids``): the logits
            over ``temperature``, renormalised over the top-k / top-p tokens (vLLM's
            ``processed_logprobs``; greedy: the logits as they are). Every engine returns
            these, and the trainer scores the same (``posttrain.ops.compute_logprobs``): they
            are the behaviour logprobs of an importance ratio.
        weight_version: the engine's weight version when it generated.
    """

    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    weight_version: int


class Generation(RefitTarget, Protocol):
    """An inference engine that samples completions and takes weight updates (the refit
    side, ``RefitTarget``: ``weight_sync.refit``)."""

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt (repeat prompts for groups)."""
        ...

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs: per row, ``log p(completion[t] | prompt + completion[:t])``
        at ``temperature`` (same lengths as ``completions``). The weight-sync probe compares
        these with the trainer's logprobs of the same tokens after every refit."""
        ...

    def weight_version(self) -> int:
        """Version of the weights the engine generates with now."""
        ...

    def wait_ready(self) -> None:
        """Block until every worker is up; raises ``WorkerStartError`` (one line) if one is not."""
        ...

    def node_ids(self) -> list[str]:
        """The node each engine runs on (Ray's node id), in rank order."""
        ...

    def config_reads(self) -> frozenset[str]:
        """The run's config keys the engines read so far (``posttrain.config_reads``)."""
        ...

    def shutdown(self) -> None:
        """Stop the engine's workers (their reserved resources stay with the cluster)."""
        ...
