"""The Hugging Face policy worker's optimizer step, in process (no Ray): a gradient that
overflowed to +inf is skipped as a NaN one is, not clipped and applied."""

from __future__ import annotations

import math

import torch
from harness.policy_backends import worker_cfg
from harness.worker_parity import distance, mixed_batch
from integration.shard_fault import ShardFaultWorker

from posttrain.algorithms.loss_functions import ClippedPGLoss


def test_a_step_whose_gradient_overflowed_to_inf_is_skipped_and_the_next_one_trains(tiny_model_path) -> None:
    """The first optimizer step finds +inf in one element of the gradient (``ShardFaultWorker``:
    a worker that trains alone holds the whole gradient). Its norm is +inf; clipping by it would
    turn that element NaN and every other one 0, and AdamW's weight decay would still move every
    weight: the step must be skipped and counted, the weights left bit for bit, and the next call
    train as usual."""
    worker = ShardFaultWorker(tiny_model_path, worker_cfg("hf", lr=1e-2))
    batch = mixed_batch(worker.model.config.vocab_size, rows=4)
    extra = {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}
    before = worker.get_weights()
    skipped = worker.train(batch, extra, ClippedPGLoss())
    assert math.isinf(skipped["grad_norm"]) and skipped["skipped_optimizer_steps"] == 1, skipped
    assert distance(worker.get_weights(), before) == 0.0
    trained = worker.train(batch, extra, ClippedPGLoss())
    assert math.isfinite(trained["grad_norm"]) and trained["skipped_optimizer_steps"] == 0, trained
    after = worker.get_weights()
    assert all(torch.isfinite(t).all() for t in after.values()) and distance(after, before) > 0
