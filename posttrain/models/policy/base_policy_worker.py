"""What every policy worker does the same way, whatever holds the model (torch, megatron-core).

A backend supplies the forward pass and the optimizer step; this class owns the loops the
algorithms rely on - logprobs in chunks, global batches accumulated over micro-batches,
the loss objects, entropy, skipping non-finite steps, metric reduction - so the backends
cannot drift apart in what a "train step" means.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.config import PolicyWorkerConfig, engine_dtype
from posttrain.config_reads import ReadsConfig
from posttrain.data.batch import TokenBatch
from posttrain.models.policy.interfaces import LossFn, Metrics
from posttrain.ops import compute_logprobs, compute_logprobs_and_entropy, masked_sum
from posttrain.utils.memory import peak_rss_gib
from posttrain.weight_sync.sender import WeightSender


def reduce_metrics(acc: Metrics, new: Metrics) -> Metrics:
    """Merge micro-batch metrics into ``acc``: ``*_min`` by min, ``*_max`` by max, the rest summed."""
    for key, value in new.items():
        if key not in acc:
            acc[key] = value
        elif key.endswith("_min"):
            acc[key] = min(acc[key], value)
        elif key.endswith("_max"):
            acc[key] = max(acc[key], value)
        else:
            acc[key] += value
    return acc


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass
class MicroBatch:
    """One micro-batch of a global batch: its rows, the loss's per-row tensors of those rows,
    and whether it is an idle one (a data-parallel rank short of rows: one masked template row)."""

    batch: TokenBatch
    extra: dict[str, torch.Tensor]
    idle: bool = False


class PolicyWorkerBase(WeightSender, ReadsConfig):
    """Logprobs and the train step over a backend's model; the refit's sending side is
    inherited (``weight_sync.sender.WeightSender``).

    Subclasses set ``cfg`` (a ``PolicyConfig`` dict plus ``temperature``), ``device``,
    ``model`` (trained), ``reference`` (frozen initial policy) and ``weight_version``, and
    implement :meth:`_forward_logits`, :meth:`_zero_grad`, :meth:`_optimizer_step` and
    :meth:`_next_lr`.
    """

    cfg: PolicyWorkerConfig
    rank: int
    device: torch.device
    model: Any  # a torch module; typed Any so each backend keeps its own model class's methods
    reference: Any
    weight_version: int
    # [B, L] logprobs of the last train call's batch under the weights that call started from
    # (None: its loss reads none); see ``train``.
    old_logprobs: torch.Tensor | None = None
    # what each backward pass is multiplied by: N for N data-parallel ranks whose gradients the
    # backend averages, where the global batch's gradient is their sum
    gradient_scale: float = 1.0

    @contextlib.contextmanager
    def _scoring_model(self, reference: bool) -> Iterator[torch.nn.Module]:
        """The model that scores for :meth:`get_logprobs`: the frozen reference or the trained
        one (a backend whose reference shares the trained model's weights overrides this).

        Raises:
            ValueError: the reference is asked for and this worker keeps none (``cfg.reference``).
        """
        if reference and self.reference is None:
            raise ValueError("reference logprobs asked of a policy worker built without a reference policy "
                             "(policy worker config reference=false: the run's loss has no KL term)")
        yield self.reference if reference else self.model

    def _forward_logits(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        """``[B, S, V]`` logits of ``batch`` (on ``self.device``), V the true vocabulary size."""
        raise NotImplementedError

    def _completion_logprobs(self, model: torch.nn.Module, batch: TokenBatch, top_k: int, top_p: float,
                             with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[B, L]`` float32 logprobs of ``batch``'s completion tokens under ``model``'s sampling
        distribution (the run's temperature, ``top_k``, ``top_p``) and, ``with_entropy``, the
        ``[B, L]`` entropies (no grad): from the full logits (:meth:`_forward_logits`). A backend
        may score them without those (the HF worker's ``policy.logprob_chunk_tokens``)."""
        return self._logprobs_from_logits(self._forward_logits(model, batch), batch, top_k, top_p, with_entropy)

    def _logprobs_from_logits(self, logits: torch.Tensor, batch: TokenBatch, top_k: int, top_p: float,
                              with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_completion_logprobs` of ``batch`` from its ``[B, S, V]`` logits."""
        width, temperature = batch.completion_mask.shape[1], self.cfg.temperature
        if with_entropy:
            return compute_logprobs_and_entropy(logits, batch.input_ids, batch.prompt_lens, width, temperature, top_k,
                                                top_p)
        return compute_logprobs(logits, batch.input_ids, batch.prompt_lens, width, temperature, top_k, top_p), None

    def _zero_grad(self) -> None:
        """Clear accumulated gradients before a global batch."""
        raise NotImplementedError

    def _optimizer_step(self) -> float:
        """Clip the accumulated gradients to ``max_grad_norm`` and step, unless their norm is
        not finite (then the weights stay as they were). Returns the pre-clip L2 norm."""
        raise NotImplementedError

    def _next_lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        raise NotImplementedError

    @torch.no_grad()
    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False,
                     template: TokenBatch | None = None) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs under the current (or reference) policy's
        sampling distribution (the generation temperature, top-k and top-p: what the engine
        sampled the completions from), computed in chunks of ``logprob_batch_size`` rows.
        ``whole_vocab``: at the temperature over the whole vocabulary, no top-k / top-p (the
        weight-sync probe, whose random tokens no sampler would keep). ``template``: this
        data-parallel rank scores its own rows, and runs idle forwards on the template row until
        it has run as many chunks as the rank with the most (the sharded weights are gathered
        by every rank together).

        Raises:
            ValueError: a row of ``batch`` that is not right-padded (:meth:`TokenBatch.check_right_padded`).
        """
        batch.check_right_padded()  # attended causally without a padding mask (Megatron; hf on a GPU)
        top_k, top_p = (0, 1.0) if whole_vocab else (self.cfg.top_k, self.cfg.top_p)
        size = self.cfg.logprob_batch_size
        num_chunks = math.ceil(len(batch) / size)
        if template is not None:
            num_chunks = int(self._across_ranks([float(num_chunks)], "max")[0])
        chunks = [batch.completion_mask.new_zeros((0, batch.completion_mask.shape[1]))]
        with self._scoring_model(reference) as model:
            was_training = model.training
            model.eval()
            for c in range(num_chunks):
                idle = c * size >= len(batch)
                mb = (template if idle and template is not None else batch.select(slice(c * size, (c + 1) * size)))
                mb = mb.to(self.device)
                logprobs, _ = self._completion_logprobs(model, mb, top_k, top_p)
                if not idle:
                    chunks.append(logprobs.cpu())
            model.train(was_training)
        return torch.cat(chunks)

    def train_step(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn,
                   step_rows: list[int] | None = None,
                   template: TokenBatch | None = None
                   ) -> tuple[Metrics, int, float, torch.Tensor | None, dict[str, float]]:
        """:meth:`train` (a data-parallel rank: on its rows, ``step_rows`` and ``template`` as
        there), then what the driver asks next, in the same call: ``(metrics, weight_version
        after the step, peak resident memory GiB, old logprobs, timing)``, the last
        :attr:`old_logprobs` (``[B, L]`` float32 on the CPU, or None); ``timing`` is
        :attr:`TrainResult.timing`, measured on every ``policy.reference_timing_period``-th call
        (``models.policy.reference_timing``), else empty."""
        period = self.cfg.reference_timing_period
        timed = period > 0 and (self.weight_version + 1) % period == 0
        start = time.perf_counter()
        metrics = self.train(batch, extra, loss_fn, step_rows=step_rows, template=template)
        timing: dict[str, float] = {}
        if timed:
            train_seconds = time.perf_counter() - start
            mbs = self.cfg.train_micro_batch_size
            micro = [batch.select(slice(i, i + mbs)).to(self.device) for i in range(0, len(batch), mbs)]
            reference = self._reference_seconds(micro)
            timing = {"timing/train_worker": train_seconds, "timing/reference_step": reference,
                      "timing/train_over_reference": train_seconds / reference}
        old = self.old_logprobs.cpu() if self.old_logprobs is not None else None
        return metrics, self.weight_version, peak_rss_gib(), old, timing

    def _reference_seconds(self, micro: list[TokenBatch]) -> float:
        """Seconds of plain torch's forward and backward of this worker's model over ``micro``
        (``reference_timing.reference_forward_backward_seconds``); a backend that has none
        raises NotImplementedError (the config refuses the key there)."""
        raise NotImplementedError(f"{type(self).__name__} has no plain torch reference step")

    def refit_dtype(self) -> torch.dtype:
        return getattr(torch, engine_dtype(self.cfg.resolved_precision))

    def _across_ranks(self, values: list[float], op: str) -> list[float]:
        """``values`` reduced over the data-parallel ranks (``op``: "sum" or "max"); a worker
        that trains alone returns them as they are."""
        return values

    def _reduce_over_ranks(self, metrics: Metrics) -> Metrics:
        """A global batch's metrics summed over the data-parallel ranks (each rank's are its rows'
        share of the global token mean), ``*_min`` / ``*_max`` by min / max; ``grad_norm`` and
        the lr are the same on every rank."""
        keys = sorted(k for k in metrics if k != "grad_norm")
        total = self._across_ranks([-metrics[k] if k.endswith("_min") else metrics[k] if k.endswith("_max") else 0.0
                                    for k in keys], "max")
        summed = self._across_ranks([0.0 if k.endswith(("_min", "_max")) else metrics[k] for k in keys], "sum")
        out = {k: (-t if k.endswith("_min") else t if k.endswith("_max") else v)
               for k, t, v in zip(keys, total, summed, strict=True)}
        return {**out, **({"grad_norm": metrics["grad_norm"]} if "grad_norm" in metrics else {})}

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn,
              step_rows: list[int] | None = None, template: TokenBatch | None = None) -> Metrics:
        """Optimizer steps over ``batch`` in global batches of ``train_global_batch_size`` rows,
        each accumulated over micro-batches of ``train_micro_batch_size`` rows.

        The old logprobs (the policy the call starts from, the denominator of the PPO ratio)
        are scored here when the loss reads them (``loss_fn.uses_old_logprobs``) and ``extra``
        has none: when the call is one optimizer step, they are the train forward's own
        logprobs, detached (the weights do not change before the step, so a separate scoring
        pass would compute the same numbers; TRL's ``GRPOTrainer`` does the same at one
        generation per step); with several optimizer steps, a no-grad pass over the whole
        batch scores them first, as later steps start from updated weights. Either way they
        are kept in :attr:`old_logprobs` (``[B, L]`` float32) for the driver's engine-trainer
        comparison, also when ``extra`` brings its own (behaviour logprobs of off-policy samples).

        Data parallelism (``step_rows`` given): this rank holds ``step_rows[k]`` rows of global
        batch k; the token count that normalises the loss and the number of micro-batches are
        agreed over the ranks, a rank short of micro-batches runs idle ones on ``template``, and
        the metrics are reduced over the ranks, so every rank returns the global batch's.

        Args:
            batch: the rows to train on, B of them.
            extra: per-row tensors the loss reads (``[B]`` or ``[B, L]``), e.g. advantages.
            loss_fn: see :class:`LossFn`; it normalises by the global batch's token count, so
                the accumulated micro-batch gradients are the global batch's token mean.
            step_rows: this rank's rows of each global batch (data parallelism); None: global
                batches of ``train_global_batch_size`` rows.
            template: a row for idle micro-batches (data parallelism).

        Returns:
            Metrics averaged over optimizer steps (``*_min``/``*_max`` reduced as such),
            plus ``grad_norm`` (pre-clip L2 norm), ``entropy`` (nats/token, of the sampling
            distribution: the generation temperature, top-k and top-p), ``lr``,
            ``num_optimizer_steps``. A step whose gradient is not finite is skipped (the
            weights stay as they were) and counted in ``skipped_optimizer_steps``.

        Raises:
            ValueError: a row of ``batch`` that is not right-padded (:meth:`TokenBatch.check_right_padded`).
        """
        batch.check_right_padded()  # attended causally without a padding mask (Megatron; hf on a GPU)
        gbs, mbs = self.cfg.train_global_batch_size, self.cfg.train_micro_batch_size
        sharded = step_rows is not None
        if step_rows is None:
            step_rows = [min(gbs, len(batch) - start) for start in range(0, len(batch), gbs)]
        lr = self._next_lr()  # the lr of this call's first optimizer step
        steps: list[Metrics] = []
        skipped = 0
        scores_old = getattr(loss_fn, "uses_old_logprobs", False)
        from_forward = scores_old and len(step_rows) == 1  # one optimizer step: old = this forward's
        self.old_logprobs = (self.get_logprobs(batch, template=template if sharded else None)
                             if scores_old and not from_forward else None)
        batch = batch.to(self.device)
        extra = {k: v.to(self.device) for k, v in extra.items()}
        if self.old_logprobs is not None and "old_logprobs" not in extra:
            extra["old_logprobs"] = self.old_logprobs.to(self.device)
        forward_old: list[torch.Tensor] = []
        g_start = 0
        for rows_here in step_rows:
            g_end = g_start + rows_here
            # the global batch's tokens, over the ranks; as many micro-batches as the rank with the most
            num_tokens = max(self._across_ranks([batch.completion_mask[g_start:g_end].sum().item()], "sum")[0], 1.0)
            num_micro = self._across_ranks([float(math.ceil(rows_here / mbs))], "max")[0]
            self._zero_grad()
            micro = []
            for m in range(int(num_micro)):
                m_start = g_start + m * mbs
                if m_start >= g_end:  # this rank is short of micro-batches: one masked row, nothing learned
                    if template is None:
                        raise ValueError("a data-parallel rank short of micro-batches needs a template row")
                    micro.append(MicroBatch(template.to(self.device).masked(),
                                            {k: v.new_zeros((1, *v.shape[1:])) for k, v in extra.items()}, idle=True))
                else:
                    mrows = slice(m_start, min(m_start + mbs, g_end))
                    micro.append(MicroBatch(batch.select(mrows), {k: v[mrows] for k, v in extra.items()}))
            step_metrics = self._forward_backward(micro, loss_fn, num_tokens, forward_old if from_forward else None)
            grad_norm = self._optimizer_step()
            if not math.isfinite(grad_norm):
                skipped += 1
            step_metrics["grad_norm"] = grad_norm
            steps.append(self._reduce_over_ranks(step_metrics) if sharded else step_metrics)
            g_start = g_end
        if forward_old:
            self.old_logprobs = torch.cat(forward_old)
        elif from_forward:  # a data-parallel rank with no rows of this call
            self.old_logprobs = batch.completion_mask.new_zeros((0, batch.completion_mask.shape[1])).cpu()
        self.weight_version += 1
        out = {k: (min if k.endswith("_min") else max if k.endswith("_max") else _mean)([s[k] for s in steps])
               for k in steps[0]}
        out.update(lr=lr, num_optimizer_steps=float(len(steps)),
                   skipped_optimizer_steps=float(skipped))
        return out

    def _forward_backward(self, micro: list[MicroBatch], loss_fn: LossFn, num_tokens: float,
                          forward_old: list[torch.Tensor] | None) -> Metrics:
        """Forward and backward passes of one global batch's micro-batches, gradients accumulated
        (not stepped); returns their metrics reduced (:func:`reduce_metrics`). ``forward_old``:
        the loss's old logprobs are each micro-batch's own forward, detached, appended there
        (None: ``extra`` brings them). A backend with its own schedule overrides this."""
        step_metrics: Metrics = {}
        for mb in micro:
            logprobs, entropy = self._completion_logprobs(self.model, mb.batch, self.cfg.top_k, self.cfg.top_p,
                                                          with_entropy=True)
            loss, metrics = self._micro_loss(mb, logprobs, entropy, loss_fn, num_tokens, forward_old)
            (loss * self.gradient_scale).backward()
            reduce_metrics(step_metrics, metrics)
        return step_metrics

    def _micro_loss(self, mb: MicroBatch, logprobs: torch.Tensor, entropy: torch.Tensor | None, loss_fn: LossFn,
                    num_tokens: float, forward_old: list[torch.Tensor] | None) -> tuple[torch.Tensor, Metrics]:
        """One micro-batch's loss (its share of the global batch's token mean: ``loss_fn`` divides
        by ``num_tokens``, the global batch's token count) and metrics, from its ``[b, L]``
        logprobs and entropies."""
        assert entropy is not None
        data = {"completion_mask": mb.batch.completion_mask, **mb.extra}
        if forward_old is not None:
            if not mb.idle:
                forward_old.append(logprobs.detach())
            data.setdefault("old_logprobs", logprobs.detach())
        loss, metrics = loss_fn(logprobs, data, num_tokens)
        metrics["entropy"] = (masked_sum(entropy, mb.batch.completion_mask) / num_tokens).item()
        if mb.idle:  # no tokens: nothing to add, and no extreme to report
            metrics = {k: math.inf if k.endswith("_min") else -math.inf if k.endswith("_max") else 0.0
                       for k in metrics}
        return loss, metrics

    def export(self, path: str, tokenizer_path: str | None = None) -> None:
        """Write the final model to ``path`` (Hugging Face format, loadable as a new
        ``model.path``); by default what ``save_checkpoint`` writes."""
        self.save_checkpoint(path, tokenizer_path)

    def save_checkpoint(self, path: str, tokenizer_path: str | None = None) -> None:
        """Atomically write what :meth:`load_checkpoint` needs to continue training to ``path``."""
        raise NotImplementedError

    def parameter_counts(self) -> tuple[int, int]:
        """(trained, total) parameters of this worker's model (its shard, under tensor parallelism)."""
        params = list(self.model.parameters())
        return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)

    def get_weight_version(self) -> int:
        """Completed ``train`` calls."""
        return self.weight_version

    def peak_memory_gib(self) -> float:
        """Peak resident memory of this worker process, GiB."""
        return peak_rss_gib()
