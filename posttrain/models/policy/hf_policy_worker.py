"""Policy worker on a Hugging Face causal LM (torch): logprobs, train step, weights, checkpoints.

``HfPolicyWorkerImpl`` is plain Python (unit tests construct it directly); ``HfPolicyWorker``
is the thin ``ray.remote`` wrapper the driver-side :class:`posttrain.models.policy.lm_policy.Policy`
places on a virtual cluster.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import ray
import torch

from posttrain.data.batch import TokenBatch
from posttrain.models.policy.interfaces import LossFn, Metrics
from posttrain.ops import compute_entropy, compute_logprobs, masked_sum
from posttrain.utils.checkpoint import atomic_dir
from posttrain.utils.memory import peak_rss_gib


def _reduce(acc: Metrics, new: Metrics) -> Metrics:
    """Merge micro-batch metrics: ``*_min`` by min, ``*_max`` by max, the rest summed."""
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


class HfPolicyWorkerImpl:
    """Holds the trained model, a frozen reference copy, and AdamW.

    Args:
        model_path: Hugging Face model directory.
        cfg: a ``PolicyConfig`` as a dict (lr, weight_decay, max_grad_norm,
            train_global_batch_size, train_micro_batch_size, logprob_batch_size,
            num_threads, temperature, and optionally ``device``: "cpu" (default) or "cuda"
            — the Ray actor of a GPU bundle sees its GPU as ``cuda:0``).
        seed: torch seed.
        rank: rank in the worker group.
    """

    def __init__(self, model_path: str, cfg: dict[str, Any], seed: int = 0, rank: int = 0):
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        torch.set_num_threads(cfg["num_threads"])
        torch.manual_seed(seed + rank)
        self.cfg = cfg
        self.device = torch.device(cfg.get("device", "cpu"))
        # transformers wraps PreTrainedModel.to in a decorator that mypy reads as unbound.
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.device)  # type: ignore[arg-type]
        self.model.train()
        # The KL penalty is measured against the policy as it was at the start of training.
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"], betas=tuple(cfg["betas"])
        )
        warmup = cfg["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
        self.weight_version = 0

    def _forward_logits(self, model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
        return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, S, V]

    @torch.no_grad()
    def get_logprobs(self, batch: TokenBatch, reference: bool = False) -> torch.Tensor:
        """``[B, L]`` float32 completion logprobs under the current (or reference) policy."""
        model = self.reference if reference else self.model
        was_training = model.training
        model.eval()
        chunks = []
        for start in range(0, len(batch), self.cfg["logprob_batch_size"]):
            mb = batch.select(slice(start, start + self.cfg["logprob_batch_size"])).to(self.device)
            logits = self._forward_logits(model, mb)
            chunks.append(compute_logprobs(logits, mb.input_ids, mb.prompt_lens, mb.completion_mask.shape[1],
                                           self.cfg["temperature"]))
        model.train(was_training)
        return torch.cat(chunks).cpu()

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor], loss_fn: LossFn) -> Metrics:
        """Optimizer steps over ``batch`` in global batches of ``train_global_batch_size`` rows,
        each accumulated over micro-batches of ``train_micro_batch_size`` rows.

        Args:
            batch: the rows to train on, B of them.
            extra: per-row tensors the loss reads (``[B]`` or ``[B, L]``), e.g. advantages.
            loss_fn: see :class:`LossFn`.

        Returns:
            Metrics averaged over optimizer steps (``*_min``/``*_max`` reduced as such),
            plus ``grad_norm`` (pre-clip L2 norm), ``entropy`` (nats/token, of the sampling
            distribution at the generation temperature), ``lr``,
            ``num_optimizer_steps``. A step whose gradient is not finite is skipped (the
            weights stay as they were) and counted in ``skipped_optimizer_steps``.
        """
        gbs, mbs = self.cfg["train_global_batch_size"], self.cfg["train_micro_batch_size"]
        lr = float(self.scheduler.get_last_lr()[0])  # the lr of this call's first optimizer step
        steps: list[Metrics] = []
        skipped = 0
        batch = batch.to(self.device)
        extra = {k: v.to(self.device) for k, v in extra.items()}
        for g_start in range(0, len(batch), gbs):
            rows = slice(g_start, g_start + gbs)
            num_tokens = max(batch.completion_mask[rows].sum().item(), 1.0)
            self.optimizer.zero_grad(set_to_none=True)
            step_metrics: Metrics = {}
            for m_start in range(g_start, min(g_start + gbs, len(batch)), mbs):
                mrows = slice(m_start, min(m_start + mbs, g_start + gbs))
                mb = batch.select(mrows)
                logits = self._forward_logits(self.model, mb)
                width = mb.completion_mask.shape[1]
                logprobs = compute_logprobs(logits, mb.input_ids, mb.prompt_lens, width, self.cfg["temperature"])
                data = {"completion_mask": mb.completion_mask, **{k: v[mrows] for k, v in extra.items()}}
                loss, metrics = loss_fn(logprobs, data, num_tokens)
                loss.backward()
                with torch.no_grad():
                    entropy = compute_entropy(logits.detach(), mb.prompt_lens, width, self.cfg["temperature"])
                    metrics["entropy"] = (masked_sum(entropy, mb.completion_mask) / num_tokens).item()
                _reduce(step_metrics, metrics)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_grad_norm"]).item()
            if math.isfinite(grad_norm):
                self.optimizer.step()
                self.scheduler.step()
            else:
                skipped += 1
            step_metrics["grad_norm"] = grad_norm
            steps.append(step_metrics)
        self.weight_version += 1
        out = {k: (min if k.endswith("_min") else max if k.endswith("_max") else _mean)([s[k] for s in steps])
               for k in steps[0]}
        out.update(lr=lr, num_optimizer_steps=float(len(steps)),
                   skipped_optimizer_steps=float(skipped))
        return out

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights, Hugging Face parameter names, detached CPU tensors."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def get_weight_version(self) -> int:
        return self.weight_version

    def save_checkpoint(self, path: str, tokenizer_path: str | None = None) -> None:
        """Atomically write the model (Hugging Face format, loadable as a new ``model.path``),
        the optimizer state and the weight version to directory ``path``."""
        with atomic_dir(Path(path)) as tmp:
            self.model.save_pretrained(tmp)
            if tokenizer_path:
                from transformers import AutoTokenizer

                AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(tmp)
            torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                        "weight_version": self.weight_version}, tmp / "trainer_state.pt")

    def load_checkpoint(self, path: str) -> None:
        """Restore model weights, optimizer state and weight version from ``save_checkpoint``."""
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.load_state_dict(loaded.state_dict())
        state = torch.load(Path(path) / "trainer_state.pt", weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.weight_version = state["weight_version"]

    def peak_memory_gib(self) -> float:
        """Peak resident memory of this worker process, GiB."""
        return peak_rss_gib()


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@ray.remote
class HfPolicyWorker(HfPolicyWorkerImpl):
    """Ray actor wrapper of :class:`HfPolicyWorkerImpl` (no logic of its own)."""
