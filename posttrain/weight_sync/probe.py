"""Weight-sync probe: after a refit, the engine and the trainer score the same fixed sequences.

A refit that did not arrive, arrived in part (a tensor missing), or was loaded under the
wrong names leaves the engine sampling from other weights than the trainer's, and nothing
else in a run notices until the importance ratios have made the updates meaningless. The
probe notices at once: with the same weights both sides give the same logprobs (to float
rounding), so any gap beyond a small bound is a broken refit.

With several engines the probe's rows are shared out (one contiguous shard per engine, as
``EngineGroup`` shards them), every engine gets at least one row, and the verdict is the worst
engine's: a refit that missed one engine of N fails however large N is, instead of being
diluted to 1/N of a pooled mean.
"""

from __future__ import annotations

import functools
import random
from typing import Any, Protocol

import torch

from posttrain.config import Precision, RefitProbeConfig
from posttrain.data.batch import TokenBatch, make_batch
from posttrain.distributed.sharding import contiguous_shards
from posttrain.errors import RefitProbeError
from posttrain.ops import masked_mean
from posttrain.weight_sync.receipt import ProbeRequest


class ProbeTrainer(Protocol):
    """The trainer side of the probe (the driver's policy)."""

    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor: ...


class ProbeEngines(Protocol):
    """The engine side of the probe (the driver's engine group)."""

    def score(self, prompts: list[list[int]], completions: list[list[int]], temperature: float) -> list[list[float]]:
        ...


def probe_sequences(token_ids: list[int], cfg: RefitProbeConfig) -> tuple[list[list[int]], list[list[int]]]:
    """``cfg.num_sequences`` (prompt, completion) pairs of tokens drawn from ``token_ids`` with
    ``cfg.seed``: the same sequences on every call, so every refit is judged alike.

    Returns:
        prompts (each ``cfg.prompt_tokens`` long) and completions (``cfg.completion_tokens``).
    """
    rng = random.Random(cfg.seed)
    prompts = [[rng.choice(token_ids) for _ in range(cfg.prompt_tokens)] for _ in range(cfg.num_sequences)]
    completions = [[rng.choice(token_ids) for _ in range(cfg.completion_tokens)] for _ in range(cfg.num_sequences)]
    return prompts, completions


def worst_engine_errors(engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor,
                        num_engines: int) -> dict[str, float]:
    """:func:`probe_errors` of each engine's rows (``num_engines`` contiguous shards of the
    ``[B, L]`` tensors, as ``EngineGroup`` shares the probe out), the largest of each metric.

    Raises:
        ValueError: an engine would get no row (``B < num_engines``).
    """
    shards = contiguous_shards(range(engine.shape[0]), num_engines)
    if any(not rows for rows in shards):
        raise ValueError(f"{engine.shape[0]} probe rows cannot cover {num_engines} engines")
    per_engine = [probe_errors(engine[rows], trainer[rows], mask[rows]) for rows in shards]
    return {key: max(errors[key] for errors in per_engine) for key in per_engine[0]}


def probe_errors(engine: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Disagreement of two logprob tensors ``[B, L]`` (float) over ``mask`` ``[B, L]`` (1 = token).

    Returns:
        ``train/refit_logprob_error``: mean ``|logp_engine - logp_trainer|`` (nats), and
        ``train/refit_token_mult_prob_error``: mean ``exp(|logp_engine - logp_trainer|)``
        (1.0 = exact; the multiplicative probability error of NeMo-RL's
        ``token_mult_prob_error``, here on the probe instead of on the rollouts).
    """
    gap = (engine - trainer).abs()
    return {
        "train/refit_logprob_error": masked_mean(gap, mask).item(),
        "train/refit_token_mult_prob_error": masked_mean(torch.exp(gap), mask).item(),
    }


# The probe's bound (mean |logp_engine - logp_trainer|, nats) per policy precision, used when
# ``max_logprob_error`` is ``auto``. fp32: both sides hold the same float32 weights and differ
# only in kernel order (0 to ~1e-6 measured), so 1e-3 is exact for the purpose. bf16: the
# engine holds the weights rounded to bfloat16 (relative error 2^-9) and its activations in
# bf16, so logits differ by ~2^-8 of their size; the probe's random tokens are unlikely ones
# (|logp| ~ 10-20 nats), hence ~0.05-0.1 nats. Measured on CPU (arithmetic warm start,
# bf16-mixed trainer vs bf16 HF engine, 5 probe seeds): healthy mean 0.059, max 0.095; one
# training step without a refit: 0.61-0.69. 0.2 keeps 2x over the healthy maximum. Re-measured
# on each run of test_precision.py::test_each_precisions_probe_bound_sits_where_its_derivation_puts_it.
PROBE_BOUNDS: dict[str, float] = {"fp32": 1e-3, "bf16": 0.2, "bf16-mixed": 0.2}


class RefitProbe:
    """Fixed probe sequences and the bound they are judged by.

    Args:
        cfg: the ``generation.refit_probe`` section.
        tokenizer: the run's tokenizer (probe tokens avoid its special tokens).
        temperature: the sampling temperature both sides score at (the trainer's
            logprobs are at the generation temperature), over the whole vocabulary: top-k
            and top-p do not apply (the probe's random tokens are outside any sampler's set).
        precision: the policy's resolved precision; picks the bound when
            ``cfg.max_logprob_error`` is ``auto`` (:data:`PROBE_BOUNDS`).
        num_engines: the engines the probe's rows are shared out over: there are at least
            as many sequences as engines (``max(cfg.num_sequences, num_engines)``), so none
            goes unprobed.
    """

    def __init__(self, cfg: RefitProbeConfig, tokenizer: Any, temperature: float, precision: Precision = "fp32",
                 num_engines: int = 1):
        special = set(getattr(tokenizer, "all_special_ids", []))
        vocab = [i for i in range(len(tokenizer)) if i not in special]
        self.num_engines = num_engines
        covering = cfg.model_copy(update={"num_sequences": max(cfg.num_sequences, num_engines)})
        self.prompts, self.completions = probe_sequences(vocab, covering)
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        self.bound = PROBE_BOUNDS[precision] if cfg.max_logprob_error == "auto" else cfg.max_logprob_error
        self.temperature = temperature

    @functools.cached_property
    def batch(self) -> TokenBatch:
        """The probe sequences as the trainer scores them (built once: they never change)."""
        return make_batch(self.prompts, self.completions, self.pad_id)

    @functools.cached_property
    def request(self) -> ProbeRequest:
        """The probe sequences as the engines score them (``Generation.update_weights``)."""
        return ProbeRequest(self.prompts, self.completions, self.temperature)

    def measure(self, policy: ProbeTrainer, generation: ProbeEngines, trainer: torch.Tensor | None = None,
                engine_rows: list[list[float]] | None = None) -> dict[str, float]:
        """Score the probe on both sides; the two ``train/refit_*`` metrics of :func:`probe_errors`,
        each the worst engine's (:func:`worst_engine_errors`).

        Args:
            trainer: the trainer's ``[B, L]`` logprobs of :attr:`batch` when already scored
                (by ``Policy.put_weights`` in a refit); else the policy is asked.
            engine_rows: the engines' scores of :attr:`request`, one row per sequence, when
                already scored (a refit's ``RefitReceipt``); else the engines are asked.

        Raises:
            ValueError: ``engine_rows`` does not hold one row per probe sequence.
        """
        batch = self.batch
        trainer = policy.get_logprobs(batch, whole_vocab=True) if trainer is None else trainer  # [B, L]
        if engine_rows is None:
            engine_rows = generation.score(self.prompts, self.completions, self.temperature)
        if len(engine_rows) != len(self.prompts):
            raise ValueError(f"the engines scored {len(engine_rows)} probe rows, the probe has {len(self.prompts)}")
        engine = torch.zeros_like(trainer)
        for b, row in enumerate(engine_rows):
            engine[b, : len(row)] = torch.tensor(row, dtype=engine.dtype)
        return worst_engine_errors(engine, trainer, batch.completion_mask, self.num_engines)

    def check(self, metrics: dict[str, float], version: int) -> None:
        """Raise when the probe error is over the bound (no bound: never).

        Raises:
            RefitProbeError: names the error, the bound and the weight version.
        """
        error = metrics["train/refit_logprob_error"]
        if self.bound is not None and not error <= self.bound:  # NaN fails too
            raise RefitProbeError(
                f"weight-sync probe failed after refit to version {version}: mean |logp_engine - logp_trainer| = "
                f"{error:.3g} > generation.refit_probe.max_logprob_error = {self.bound:g} (stale or partial refit)"
            )
