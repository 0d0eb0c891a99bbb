"""What every policy worker does the same way, whatever holds the model (torch, megatron-core).

A backend supplies the forward pass and the optimizer step; this class owns the loops the
algorithms rely on - logprobs in chunks, global batches accumulated over micro-batches,
the loss objects, entropy, skipping non-finite steps, metric reduction - so the backends
cannot drift apart in what a "train step" means.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from posttrain.config import PolicyWorkerConfig, engine_dtype
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


class PolicyWorkerBase(WeightSender):
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
    def get_logprobs(self, batch: TokenBatch, reference: bool = False, whole_vocab: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs under the current (or reference) policy's
        sampling distribution (the generation temperature, top-k and top-p: what the engine
        sampled the completions from), computed in chunks of ``logprob_batch_size`` rows.
        ``whole_vocab``: at the temperature over the whole vocabulary, no top-k / top-p (the
        weight-sync probe, whose random tokens no sampler would keep)."""
        top_k, top_p = (0, 1.0) if whole_vocab else (self.cfg.top_k, self.cfg.top_p)
        chunks = []
        with self._scoring_model(reference) as model:
            was_training = model.training
            model.eval()
            for start in range(0, len(batch), self.cfg.logprob_batch_size):
                mb = batch.select(slice(start, start + self.cfg.logprob_batch_size)).to(self.device)
                logits = self._forward_logits(model, mb)
                chunks.append(compute_logprobs(logits, mb.input_ids, mb.prompt_lens, mb.completion_mask.shape[1],
                                               self.cfg.temperature, top_k, top_p))
            model.train(was_training)
        return torch.cat(chunks).cpu()

    def train_step(self, batch: TokenBatch, extra: dict[str, torch.Tensor],
                   loss_fn: LossFn) -> tuple[Metrics, int, float, torch.Tensor | None]:
        """:meth:`train`, then what the driver asks next, in the same call: ``(metrics,
        weight_version after the step, peak resident memory GiB, old logprobs)``, the last
        :attr:`old_logprobs` (``[B, L]`` float32 on the CPU, or None)."""
        metrics = self.train(batch, extra, loss_fn)
        old = self.old_logprobs.cpu() if self.old_logprobs is not None else None
        return metrics, self.weight_version, peak_rss_gib(), old

    def refit_dtype(self) -> torch.dtype:
        return getattr(torch, engine_dtype(self.cfg.resolved_precision))

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> Metrics:
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

        Args:
            batch: the rows to train on, B of them.
            extra: per-row tensors the loss reads (``[B]`` or ``[B, L]``), e.g. advantages.
            loss_fn: see :class:`LossFn`; it normalises by the global batch's token count, so
                the accumulated micro-batch gradients are the global batch's token mean.

        Returns:
            Metrics averaged over optimizer steps (``*_min``/``*_max`` reduced as such),
            plus ``grad_norm`` (pre-clip L2 norm), ``entropy`` (nats/token, of the sampling
            distribution: the generation temperature, top-k and top-p), ``lr``,
            ``num_optimizer_steps``. A step whose gradient is not finite is skipped (the
            weights stay as they were) and counted in ``skipped_optimizer_steps``.
        """
        gbs, mbs = self.cfg.train_global_batch_size, self.cfg.train_micro_batch_size
        lr = self._next_lr()  # the lr of this call's first optimizer step
        steps: list[Metrics] = []
        skipped = 0
        scores_old = getattr(loss_fn, "uses_old_logprobs", False)
        from_forward = scores_old and len(batch) <= gbs  # one optimizer step: old = this forward's
        self.old_logprobs = self.get_logprobs(batch) if scores_old and not from_forward else None
        batch = batch.to(self.device)
        extra = {k: v.to(self.device) for k, v in extra.items()}
        if self.old_logprobs is not None and "old_logprobs" not in extra:
            extra["old_logprobs"] = self.old_logprobs.to(self.device)
        forward_old: list[torch.Tensor] = []
        for g_start in range(0, len(batch), gbs):
            rows = slice(g_start, g_start + gbs)
            num_tokens = max(batch.completion_mask[rows].sum().item(), 1.0)
            self._zero_grad()
            step_metrics: Metrics = {}
            for m_start in range(g_start, min(g_start + gbs, len(batch)), mbs):
                mrows = slice(m_start, min(m_start + mbs, g_start + gbs))
                mb = batch.select(mrows)
                logits = self._forward_logits(self.model, mb)
                width = mb.completion_mask.shape[1]
                logprobs, entropy = compute_logprobs_and_entropy(logits, mb.input_ids, mb.prompt_lens, width,
                                                                 self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)
                data = {"completion_mask": mb.completion_mask, **{k: v[mrows] for k, v in extra.items()}}
                if from_forward:
                    forward_old.append(logprobs.detach())
                    data.setdefault("old_logprobs", forward_old[-1])
                loss, metrics = loss_fn(logprobs, data, num_tokens)
                loss.backward()
                metrics["entropy"] = (masked_sum(entropy, mb.completion_mask) / num_tokens).item()
                reduce_metrics(step_metrics, metrics)
            grad_norm = self._optimizer_step()
            if not math.isfinite(grad_norm):
                skipped += 1
            step_metrics["grad_norm"] = grad_norm
            steps.append(step_metrics)
        if forward_old:
            self.old_logprobs = torch.cat(forward_old)
        self.weight_version += 1
        out = {k: (min if k.endswith("_min") else max if k.endswith("_max") else _mean)([s[k] for s in steps])
               for k in steps[0]}
        out.update(lr=lr, num_optimizer_steps=float(len(steps)),
                   skipped_optimizer_steps=float(skipped))
        return out

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
