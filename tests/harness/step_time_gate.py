"""The step-time gate's job, shared by its test (tests/unit/models/policy/test_reference_timing.py)
and its calibration (benchmarks/train_over_reference.py): a fresh Hugging Face worker on the tiny
test model training GRPO-shaped batches with ``policy.reference_timing_period=1``, healthy or with
a slowdown injected into its train step."""

from __future__ import annotations

import statistics

import torch
from harness.policy_backends import make_worker

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.data.batch import TokenBatch, make_batch


def grpo_batch(seed: int, rows: int = 16) -> TokenBatch:
    """A GRPO-shaped batch of the tiny vocabulary: ``rows`` rows, 12 prompt tokens, 3-11 completion tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(2, 17, (12,), generator=g).tolist() for _ in range(rows)]
    comps = [torch.randint(2, 17, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
             for _ in range(rows)]
    return make_batch(prompts, comps, pad_id=0)


def slowed(worker, extra_forwards: int):
    """``worker`` whose every micro-batch forward runs ``extra_forwards`` more times without gradients."""
    plain = worker._completion_logprobs

    def with_recompute(model, batch, top_k, top_p, with_entropy=False):
        if with_entropy:  # the train forward (scoring passes have no entropy)
            with torch.no_grad():
                for _ in range(extra_forwards):
                    plain(model, batch, top_k, top_p, with_entropy)
        return plain(model, batch, top_k, top_p, with_entropy)

    worker._completion_logprobs = with_recompute
    return worker


def gate_worker(path: str, seed: int = 0, **policy):
    """A fresh worker of the gate's job: fp32, one global batch of 16 rows per call, the reference
    timed on every call (``policy`` overrides any of it)."""
    cfg = {"reference_timing_period": 1, "train_global_batch_size": 16, "train_micro_batch_size": 16,
           "precision": "fp32", **policy}
    return make_worker("hf", path, seed=seed, **cfg)


def train_calls(worker, n: int, seed: int = 0) -> list[tuple]:
    """``n`` ``train_step`` calls of ``worker`` on the gate's batches (the same for the same ``seed``):
    what each returned, ``(metrics, version, peak GiB, old logprobs, timing)``."""
    out = []
    for step in range(n):
        key = seed * 1000 + step
        advantages = torch.randn(16, generator=torch.Generator().manual_seed(key))
        out.append(worker.train_step(grpo_batch(key), {"advantages": advantages}, ClippedPGLoss(kl_coef=0.0)))
    return out


def median_ratio(path: str, steps: int, extra_forwards: int = 0, seed: int = 0) -> float:
    """The median ``timing/train_over_reference`` of one fresh worker over calls 3..``steps`` (the
    first two warm up), ``extra_forwards`` > 0: of a worker slowed by :func:`slowed`."""
    worker = gate_worker(path, seed)
    if extra_forwards:
        slowed(worker, extra_forwards)
    ratios = [timing["timing/train_over_reference"] for *_, timing in train_calls(worker, steps, seed)]
    return statistics.median(ratios[2:])
