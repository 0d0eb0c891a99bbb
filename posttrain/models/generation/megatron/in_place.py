"""The megatron engine in place: generation from the Megatron policy's own model, no second copy.

``generation.backend=megatron`` with ``generation.colocated=true`` and ``policy.backend=megatron``
(tensor-parallel size 1). The policy workers sample with ``MegatronSampler`` over the model they
train, so a refit moves nothing: it publishes the policy's weight version to the engine side and
runs the weight-sync probe. Two halves:

- :class:`InPlaceEngineMixin`, inherited by ``MegatronPolicyWorkerImpl``: the engine's calls
  inside the policy worker (``engine_generate``, ``engine_score``, ``engine_publish``).
- :class:`InPlaceMegatronEngine`, the driver's ``Generation`` and ``RefitTarget`` over the
  policy's worker group (refit transport ``"in_place"``, ``weight_sync.refit``).

Why the engine can never read half-updated weights or a stale KV cache:

- A Ray actor runs one call at a time (the policy worker is a plain actor, ``max_concurrency``
  1), so a generation call starts only after a train call, optimizer step included, has
  returned, and no train call starts while one generates.
- The engine side serves a *published* version: a train step moves the policy to version
  v + 1 while the engine still serves v, and until the refit publishes v + 1 every generation
  or probe call is refused (``StaleWeightsError``): no completion is labelled with a version
  other than the weights that produced it.
- ``MegatronSampler`` builds an empty KV cache for every call and drops it at the end: no call
  reads keys or values of another call's prompts or weights.

Not built: tensor-parallel sizes above 1 (every rank would have to generate in lockstep),
and the asynchronous loop (its producer generates while the trainer trains; in place, the two
are one actor): both are refused with one line (``check_in_place``).
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.errors import ConfigError, StaleWeightsError
from posttrain.models.generation.interfaces import GenerationOutput, SamplingParams
from posttrain.weight_sync.receipt import ProbeRequest, RefitReceipt, refit_receipt

WHO = "megatron engine (in place)"
# The refit transport of this engine (``weight_sync.refit``): nothing is copied.
IN_PLACE = "in_place"


def check_in_place(tensor_parallel_size: int, num_engines: int = 1, asynchronous: bool = False,
                   pipeline_parallel_size: int = 1) -> None:
    """Refuse an in-place engine (``backends.serves_in_place``) this code does not serve.

    Args:
        tensor_parallel_size: ``policy.megatron.tensor_model_parallel_size``.
        num_engines: ``generation.num_workers`` (in place there is one: the policy's workers).
        asynchronous: the asynchronous GRPO loop asks.
        pipeline_parallel_size: ``policy.megatron.pipeline_model_parallel_size`` (megatron's
            inference loop over a pipeline of workers is not wired).

    Raises:
        ConfigError: one line naming the setting and what to set instead.
    """
    fix = "set generation.colocated=false for a megatron engine of its own"
    if tensor_parallel_size != 1:
        raise ConfigError(f"generation.backend=megatron in place (generation.colocated=true) serves "
                          f"policy.megatron.tensor_model_parallel_size=1 only, got {tensor_parallel_size}: {fix}")
    if pipeline_parallel_size != 1:
        raise ConfigError(f"generation.backend=megatron in place (generation.colocated=true) serves "
                          f"policy.megatron.pipeline_model_parallel_size=1 only, got {pipeline_parallel_size}: {fix}")
    if num_engines != 1:
        raise ConfigError(f"generation.backend=megatron in place (generation.colocated=true) is one engine, the "
                          f"policy's own workers, got generation.num_workers={num_engines}: {fix}")
    if asynchronous:
        raise ConfigError("async GRPO generates while it trains, and an in-place megatron engine is the policy "
                          f"worker itself (generation.backend=megatron, generation.colocated=true): {fix}")


class _ServedModel:
    """The engine side of one policy worker as ``refit_receipt`` reads it: the published version
    and the engine's own scoring."""

    def __init__(self, worker: InPlaceEngineMixin):
        self.worker = worker

    def weight_version(self) -> int:
        return self.worker.served_version

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        return self.worker.engine_score(prompts, completions, temperature)


class InPlaceEngineMixin:
    """The in-place engine's calls on a Megatron policy worker (see the module doc).

    Reads of the host worker: ``model`` (the trained model, DDP-wrapped), ``shape``
    (``GPTShape``: the true vocabulary), ``model_path`` (its EOS id), ``device``,
    ``weight_version`` (the trainer's) and ``_forward_logits``.
    """

    model: Any
    shape: Any
    model_path: str
    device: torch.device
    weight_version: int
    served_version: int = 0  # the version the engine side serves: the last one a refit published
    _sampler: Any = None

    _forward_logits: Any  # (model, TokenBatch) -> [B, S, V] logits, the policy worker's

    def _require_published(self) -> None:
        if self.served_version != self.weight_version:
            raise StaleWeightsError(f"{WHO}: the policy is at weight version {self.weight_version} but version "
                                    f"{self.served_version} is published: refit before generating or scoring")

    def _megatron_sampler(self) -> Any:
        if self._sampler is None:
            from transformers import AutoConfig

            from posttrain.models.megatron.inference import MegatronSampler
            from posttrain.models.megatron.model import unwrap

            eos_id = AutoConfig.from_pretrained(self.model_path).eos_token_id
            self._sampler = MegatronSampler(unwrap(self.model), self.shape.vocab_size, eos_id)
        return self._sampler

    def engine_generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """Sample one completion per prompt from the policy's current model (as a megatron engine
        of rank 0 samples: the same seed stream).

        Raises:
            StaleWeightsError: the policy has trained past the published version.
        """
        self._require_published()
        completions, logprobs = self._megatron_sampler().generate(prompts, params, seed=params.seed * 1_000_003)
        return GenerationOutput(completions, logprobs, self.served_version)

    @torch.no_grad()
    def engine_score(self, prompts: list[list[int]], completions: list[list[int]],
                     temperature: float) -> list[list[float]]:
        """Teacher-forced logprobs (``Generation.score``): one prefill of each sequence through
        the policy's model in ``eval()`` (dropout off), handed back in the mode it was in.

        Raises:
            StaleWeightsError: the policy has trained past the published version.
        """
        from posttrain.models.generation.engine import teacher_forced_logprobs
        from posttrain.models.megatron.model import unwrap

        self._require_published()
        model = unwrap(self.model)
        was_training = model.training
        model.eval()
        try:
            return teacher_forced_logprobs(lambda batch: self._forward_logits(model, batch), prompts, completions,
                                           temperature, self._megatron_sampler().eos_id, self.device)
        finally:
            model.train(was_training)

    def engine_weight_version(self) -> int:
        """The version the engine side serves (the last one a refit published)."""
        return self.served_version

    def engine_publish(self, version: int, probe: ProbeRequest | None = None) -> RefitReceipt:
        """The in-place refit: the engine side serves ``version`` from now on, and (with a
        ``probe``) scores it, in one call.

        Raises:
            StaleWeightsError: ``version`` is not the policy's (the engine would label
                completions with a version that did not produce them).
        """
        if version != self.weight_version:
            raise StaleWeightsError(f"{WHO}: a refit to weight version {version}, but the policy is at "
                                    f"{self.weight_version}")
        self.served_version = version
        return refit_receipt(_ServedModel(self), probe)


class InPlaceMegatronEngine:
    """``Generation`` (and ``RefitTarget``) served by a Megatron policy's own workers.

    Args:
        policy: the driver's ``Policy`` (``policy.backend=megatron``, tensor-parallel size 1);
            its workers are the engine (``InPlaceEngineMixin``).

    One engine: it starts and stops with the policy (:meth:`wait_ready` and :meth:`shutdown`
    have nothing of their own to do).
    """

    refit_setting = IN_PLACE
    refit_bucket_bytes = 0
    num_engines = 1

    def __init__(self, policy: Any):
        self.policy = policy

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> GenerationOutput:
        """See ``Generation.generate``; raises ``StaleWeightsError`` before a refit published
        the policy's last step."""
        return self.policy.group.run_all("engine_generate", prompts, params)[0]

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        """See ``Generation.score``."""
        return self.policy.group.run_all("engine_score", prompts, completions, temperature)[0]

    def update_weights(self, weights: Any, version: int, probe: ProbeRequest | None = None) -> RefitReceipt:
        """The in-place refit (``weights`` must be None: nothing is sent): publish ``version``
        and score ``probe``.

        Raises:
            ValueError: weights were sent (a transport other than ``in_place`` chose this engine).
            StaleWeightsError: ``version`` is not the policy's.
        """
        if weights is not None:
            raise ValueError(f"the {WHO} reads the policy's own weights: a refit sends it none")
        return self.policy.group.run_all("engine_publish", version, probe)[0]

    def weight_version(self) -> int:
        """The published version."""
        return self.policy.group.run_all("engine_weight_version")[0]

    def gpu_uuids(self) -> list[str | None]:
        return [self.policy.gpu_uuid()]

    def start_joining_broadcast(self, host: str, port: int, world_size: int, timeout_s: float) -> Any:
        raise ValueError(f"the {WHO} reads the policy's own weights: it joins no refit broadcast")

    def start_receiving(self, version: int, probe: ProbeRequest | None = None) -> Any:
        raise ValueError(f"the {WHO} reads the policy's own weights: it receives no refit broadcast")

    def wait_ready(self) -> None:
        """Nothing to wait for: the policy's workers are the engine."""

    def node_ids(self) -> list[str]:
        """The policy's workers' nodes: they are the engine."""
        return self.policy.node_ids()

    def config_reads(self) -> frozenset[str]:
        """Nothing of its own: the policy's workers are the engine (``Policy.config_reads``)."""
        return frozenset()

    def shutdown(self) -> None:
        """Nothing to stop: the policy's workers are the engine (``Policy.shutdown`` stops them)."""
