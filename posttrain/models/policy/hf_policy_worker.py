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
from posttrain.models.policy.base_policy_worker import PolicyWorkerBase
from posttrain.utils.checkpoint import atomic_dir


class HfPolicyWorkerImpl(PolicyWorkerBase):
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

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _optimizer_step(self) -> float:
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg["max_grad_norm"]).item()
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
        return grad_norm

    def _next_lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Current weights, Hugging Face parameter names, detached CPU tensors."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

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


@ray.remote
class HfPolicyWorker(HfPolicyWorkerImpl):
    """Ray actor wrapper of :class:`HfPolicyWorkerImpl` (no logic of its own)."""
