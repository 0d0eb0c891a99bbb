"""An independent re-implementation of the policy's train step, to check a run against.

Written from the formulas, not from posttrain's code: the completion tokens of each row are
found from ``prompt_lens`` / ``completion_lens`` by explicit position lists (not
``posttrain.ops``), the losses follow the papers (GRPO: DeepSeekMath, arXiv:2402.03300, Eq. 3
and the k3 KL of its Eq. 4; token-level aggregation over the global batch: Dr. GRPO,
arXiv:2503.20783, Sec. 3.1; SFT: the token-mean NLL of the response), the optimizer is
``torch.optim.AdamW`` with a linear warmup written out here, and clipping is the total L2 norm.

:class:`ReplayTrainer` starts from the run's initial weights and is fed the recorded training
batches in order; before each call its weights must equal those the run's step started from,
and its metrics the ones the run logged. Any config key the policy worker ignores, and any
metric computed over the wrong tokens, makes the two part ways.

Notation: B rows of a training batch, S sequence length, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posttrain.data.batch import TokenBatch


@dataclass(frozen=True)
class TrainerSpec:
    """The config values the replay trains with (those of the run, or deliberately others).

    ``clip_eps`` / ``kl_coef`` are None for SFT (NLL loss); ``top_k`` / ``top_p`` are the
    sampling truncation GRPO's tokens were drawn with (0 and 1.0: none).
    """

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    warmup_steps: int
    max_grad_norm: float
    global_batch_size: int
    temperature: float
    clip_eps: float | None = None
    kl_coef: float | None = None
    top_k: int = 0
    top_p: float = 1.0

    @classmethod
    def of(cls, cfg, loss: str) -> TrainerSpec:
        """From a loaded ``GRPOMasterConfig`` (``loss="grpo"``) or ``SFTMasterConfig`` (``"sft"``)."""
        p = cfg.policy
        grpo = cfg.grpo if loss == "grpo" else None
        return cls(p.lr, p.weight_decay, (p.betas[0], p.betas[1]), p.warmup_steps, p.max_grad_norm,
                   p.train_global_batch_size, cfg.generation.temperature,
                   grpo.clip_eps if grpo else None, grpo.kl_coef if grpo else None,
                   cfg.generation.top_k, cfg.generation.top_p)


def completion_tokens(batch: TokenBatch) -> list[list[tuple[int, int]]]:
    """Per row, ``(position, token)`` of each completion token, from the lengths alone."""
    rows = []
    for b in range(len(batch)):
        p, n = int(batch.prompt_lens[b]), int(batch.completion_lens[b])
        rows.append([(p + j, int(batch.input_ids[b, p + j])) for j in range(n)])
    return rows


def dropped_by_sampler(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``[n, V]`` bool: the tokens a top-k-then-top-p sampler drops at each of ``n`` positions of
    tempered logits ``[n, V]``, worked out in descending order: beyond the k largest (ties with the
    k-th stay), then every token once the renormalised mass of the ones kept before it reaches p."""
    ranked, order = scaled.detach().sort(dim=-1, descending=True)
    if top_k:
        kth = min(top_k, ranked.shape[-1]) - 1
        ranked = ranked.masked_fill(ranked < ranked[:, kth : kth + 1], float("-inf"))
    mass_before = ranked.softmax(-1).cumsum(-1) - ranked.softmax(-1)  # [n, V], descending order
    drop = torch.isinf(ranked) | (mass_before >= top_p)
    return torch.zeros_like(drop).scatter(-1, order, drop)


def token_distributions(model: torch.nn.Module, batch: TokenBatch, temperature: float, top_k: int = 0,
                        top_p: float = 1.0) -> list[torch.Tensor]:
    """Per row, ``[n_b, V]`` log-probabilities of the sampling distribution (``temperature``,
    renormalised over the ``top_k`` / ``top_p`` tokens, each sampled token kept in its own
    position's set) that predicts each completion token: the logits one position earlier."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [B, S, V]
    out = []
    for b, tokens in enumerate(completion_tokens(batch)):
        before = torch.tensor([pos - 1 for pos, _ in tokens], dtype=torch.long)
        scaled = logits[b, before].float() / temperature  # [n_b, V]
        if top_k or top_p < 1.0:
            drop = dropped_by_sampler(scaled, top_k, top_p)
            drop[torch.arange(len(tokens)), torch.tensor([t for _, t in tokens], dtype=torch.long)] = False
            scaled = scaled.masked_fill(drop, float("-inf"))
        out.append(torch.log_softmax(scaled, dim=-1))
    return out


def token_logprobs(model: torch.nn.Module, batch: TokenBatch, temperature: float, top_k: int = 0,
                   top_p: float = 1.0) -> list[torch.Tensor]:
    """Per row, ``[n_b]`` logprob of each completion token (with grad when the model has it)."""
    dists = token_distributions(model, batch, temperature, top_k, top_p)
    return [d[torch.arange(len(toks)), torch.tensor([t for _, t in toks], dtype=torch.long)]
            for d, toks in zip(dists, completion_tokens(batch), strict=True)]


def padded(rows: list[torch.Tensor], width: int) -> torch.Tensor:
    """Per-row values -> ``[B, width]`` with zeros past each row (to compare with ``[B, L]`` tensors)."""
    out = torch.zeros(len(rows), width)
    for b, row in enumerate(rows):
        out[b, : len(row)] = row.detach()
    return out


class ReplayTrainer:
    """The policy's training, re-done: AdamW from the run's initial weights.

    Args:
        model: a Hugging Face causal LM holding the run's initial weights (it is trained).
        spec: the config values to train with.
    """

    def __init__(self, model: torch.nn.Module, spec: TrainerSpec):
        self.model = model.train()
        self.spec = spec
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=spec.betas,
                                           weight_decay=spec.weight_decay)
        self.optimizer_steps = 0

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def lr_of_next_step(self) -> float:
        """Linear warmup: optimizer step k (0-based) runs at ``lr * min(1, (k + 1) / warmup)``."""
        warmup = self.spec.warmup_steps
        return self.spec.lr * (min(1.0, (self.optimizer_steps + 1) / warmup) if warmup else 1.0)

    def _loss(self, batch: TokenBatch, extra: dict[str, torch.Tensor], rows: range) -> tuple[torch.Tensor, dict]:
        """Loss and metrics of global batch ``rows`` at the current weights."""
        spec = self.spec
        sub = batch.select(slice(rows.start, rows.stop))
        dists = token_distributions(self.model, sub, spec.temperature, spec.top_k, spec.top_p)
        toks = completion_tokens(sub)
        num_tokens = sum(len(t) for t in toks)
        total = torch.zeros(())
        kl_sum = clipped = entropy = 0.0
        ratios: list[float] = []
        for i, (dist, row) in enumerate(zip(dists, toks, strict=True)):
            b = rows.start + i
            with torch.no_grad():
                entropy += float(-(dist.exp() * dist).nan_to_num(nan=0.0).sum())  # 0 * -inf: a dropped token
            for j, (_, token) in enumerate(row):
                logp = dist[j, token]
                if spec.clip_eps is None:  # SFT: negative log-likelihood of the response token
                    total = total - logp
                    continue
                adv, old = float(extra["advantages"][b]), float(extra["old_logprobs"][b, j])
                ratio = torch.exp(logp - old)
                low, high = 1 - spec.clip_eps, 1 + spec.clip_eps
                surrogate = torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
                total = total - surrogate
                if spec.kl_coef:  # (at kl_coef 0 the run neither sends reference logprobs nor logs kl)
                    log_r = (float(extra["ref_logprobs"][b, j]) - logp).clamp(-20.0, 20.0)
                    k3 = torch.exp(log_r) - log_r - 1  # k3 estimator of KL(pi || pi_ref)
                    total = total + spec.kl_coef * k3
                    kl_sum += float(k3.detach())
                r = float(ratio.detach())
                ratios.append(r)
                # the clip takes the gradient away: ratio above 1+eps with A > 0, below 1-eps with A < 0
                clipped += float((adv > 0 and r > high) or (adv < 0 and r < low))
        loss = total / max(num_tokens, 1)
        metrics = {"loss": float(loss.detach()), "entropy": entropy / max(num_tokens, 1)}
        if spec.clip_eps is not None:
            metrics.update(clip_fraction=clipped / max(num_tokens, 1),
                           probs_ratio_min=min(ratios, default=1.0), probs_ratio_max=max(ratios, default=1.0))
            if spec.kl_coef:
                metrics["kl"] = kl_sum / max(num_tokens, 1)
        return loss, metrics

    def old_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """``[B, L]`` logprobs of the completion tokens under the current weights, no grad
        (eval mode), zeros past each row: the old policy of a train call starting now."""
        self.model.eval()
        with torch.no_grad():
            old = padded(token_logprobs(self.model, batch, self.spec.temperature, self.spec.top_k, self.spec.top_p),
                         batch.completion_mask.shape[1])
        self.model.train()
        return old

    def train(self, batch: TokenBatch, extra: dict[str, torch.Tensor]) -> dict[str, float]:
        """One train call: optimizer steps over consecutive global batches; the metrics the
        worker reports (means over optimizer steps; ratio min/max over all of them). GRPO
        without ``old_logprobs`` in ``extra`` (the run's worker scored them in the call) takes
        the weights the call starts from as the old policy, for every one of its steps."""
        gbs = self.spec.global_batch_size
        if self.spec.clip_eps is not None and "old_logprobs" not in extra:
            extra = {**extra, "old_logprobs": self.old_logprobs(batch)}
        per_step, lr_first = [], self.lr_of_next_step()
        for start in range(0, len(batch), gbs):
            self.optimizer.zero_grad(set_to_none=True)
            loss, metrics = self._loss(batch, extra, range(start, min(start + gbs, len(batch))))
            loss.backward()
            # the total L2 norm, summed in float64 (a float32 sum over ~10^6 squares drifts ~1e-5)
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in self.model.parameters()
                                 if p.grad is not None))
            scale = min(1.0, self.spec.max_grad_norm / (norm + 1e-6))
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_of_next_step()
            self.optimizer.step()
            self.optimizer_steps += 1
            per_step.append({**metrics, "grad_norm": norm})
        out = {k: sum(s[k] for s in per_step) / len(per_step) for k in per_step[0]}
        for k, reduce in (("probs_ratio_min", min), ("probs_ratio_max", max)):
            if k in out:
                out[k] = reduce(s[k] for s in per_step)
        out.update(lr=lr_first, num_optimizer_steps=float(len(per_step)), skipped_optimizer_steps=0.0)
        return out


def assert_metrics_match(logged: dict[str, float], replayed: dict[str, float], where: str,
                         rel: float = 1e-4, abs_: float = 1e-6) -> None:
    """Every replayed metric equals the logged one (``where`` names the step in the message)."""
    for key, value in replayed.items():
        got = logged.get(key)
        assert got is not None, f"{where}: {key} not logged"
        assert math.isclose(got, value, rel_tol=rel, abs_tol=abs_), f"{where}: {key} logged {got!r}, replay {value!r}"


# The key projection's bias shifts every attention logit of a query by the same amount, which a
# softmax ignores: its gradient is zero in exact arithmetic, so what each side computes is float
# noise (~1e-3 here) that Adam, dividing by its own square root, turns into steps of ~lr.
# It cannot change a logprob; the two runs' values of it are not comparable.
NOISE_ONLY = ("self_attn.k_proj.bias",)


def max_weight_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same names (``NOISE_ONLY``
    tensors left out)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if not k.endswith(NOISE_ONLY))
