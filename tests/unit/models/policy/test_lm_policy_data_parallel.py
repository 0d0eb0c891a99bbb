"""A data-parallel policy (``Policy`` with ``policy.data_parallel_size=2``: two HF policy workers
on Ray, FSDP2 over gloo) against one worker trained in process on the same rows: the call's
metrics and weights, its old logprobs in the batch's row order, the weights a refit sends, and a
resume from its checkpoint. One pair of rank actors serves the module (their start is most of its
cost); the driver-level runs, recorded rollouts and engines included, are
``tests/integration/test_data_parallel*.py``.

The call (``LAYOUT``): 19 rows in global batches of 10, two rows a micro-batch, so two optimizer
steps; the second global batch (9 rows) splits 4 / 5, and rank 0 runs an idle micro-batch in it;
the old logprobs are scored first (several steps) in chunks of 3 rows, 3 chunks on rank 0 and 4
on rank 1 (rank 0 runs an idle chunk). At lr 1e-2 the second step's ratios leave 1 (0.19-0.30 to
2.35-3.37, clip fraction 0.09-0.23, KL 0.09-0.17).

Calibration: DP=2 against the single worker, batch seeds 0-5 (Nov 28), on the AMD EPYC's 2 cores and
on the GPU host's Xeon pinned to 2 CPUs (torch 2.11, GPU hidden); the test runs seed 0. Seen failing:
the data-parallel mutants (gradients averaged: grad norm 2.43 against 4.86).

| quantity | largest gap, EPYC (seed) | largest gap, Xeon (seed) | at seed 0 (EPYC) | bound |
|---|---|---|---|---|
| grad norm, entropy, KL, ratio extremes, relative | 5.5e-6 (ratio max, 2) | 6.2e-6 (2) | 2.1e-7 | 1e-4 |
| loss, absolute | 2.9e-7 (2) | 3.2e-7 (2) | 3.3e-8 | 1e-5 |
| clip fraction, counts, lr | 0.0 | 0.0 | 0.0 | 0.02 (a token flipping at the clip boundary), else equal |
| old logprobs, normwise relative | 0.0 | 0.0 | 0.0 | 1e-5 |
| weights, of the update | 9.4e-6 (2) | 1.03e-5 (2) | 3.6e-6 | 2e-3 |

The ratio extremes of the second step are single tokens after an Adam step, where the ranks'
summation order shows most: hence 1e-4, not the integration tests' 1e-5 (their recorded layouts
saw at most 4.7e-7). Broken, the call is off by a factor: gradients averaged instead of summed
halve the grad norm, a loss over each rank's own tokens doubles it, rank 0's metrics alone halve
the loss, the ranks' ratio extremes summed double them, an idle micro-batch's placeholder read as
data makes the ratio minimum 0; old logprobs stacked in rank order move rows 5-13; a refit of each
rank's own shard sends no whole tensor; a resume that starts AdamW afresh takes another step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch
from harness.policy_backends import worker_cfg
from harness.worker_parity import distance, mixed_batch
from safetensors.torch import load_file

from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import PolicyWorkerConfig
from posttrain.data.batch import TokenBatch
from posttrain.distributed.ray_cluster import RayVirtualCluster
from posttrain.distributed.sharding import global_batch_shards
from posttrain.errors import ConfigError
from posttrain.models.policy.hf_policy_worker import HfPolicyWorkerImpl
from posttrain.models.policy.lm_policy import Policy

ROWS = 19
LAYOUT = {"lr": 1e-2, "train_global_batch_size": 10, "train_micro_batch_size": 2, "logprob_batch_size": 3}
LOSS = ClippedPGLoss(kl_coef=0.1)
# the metrics' bounds (the table above): relative, absolute, else exactly equal
RELATIVE = {"grad_norm": 1e-4, "entropy": 1e-4, "kl": 1e-4, "probs_ratio_min": 1e-4, "probs_ratio_max": 1e-4}
ABSOLUTE = {"loss": 1e-5, "clip_fraction": 0.02}
WEIGHTS_REL = 2e-3
OLD_LOGPROBS_REL = 1e-5


def cfg(data_parallel_size: int) -> PolicyWorkerConfig:
    return worker_cfg("hf", data_parallel_size=data_parallel_size, **LAYOUT)


def grpo_inputs(worker: HfPolicyWorkerImpl, seed: int) -> tuple[TokenBatch, dict[str, torch.Tensor]]:
    """``ROWS`` rows of mixed lengths, their advantages and the reference policy's logprobs (the
    initial weights'); the old logprobs are left to the policy to score."""
    batch = mixed_batch(worker.model.config.vocab_size, rows=ROWS, seed=seed)
    advantages = torch.randn(ROWS, generator=torch.Generator().manual_seed(seed))
    return batch, {"advantages": advantages, "ref_logprobs": worker.get_logprobs(batch, reference=True)}


def saved_weights(policy: Policy, path: Path) -> dict[str, torch.Tensor]:
    """The weights of ``policy``'s checkpoint written to ``path`` now (gathered to rank 0)."""
    policy.save_checkpoint(str(path))
    return load_file(str(path / "model.safetensors"))


@dataclass
class Step:
    """One call of both policies on the same rows from the same initial weights."""

    initial: dict[str, torch.Tensor]
    one: dict[str, float]  # the single worker's metrics
    two: dict[str, float]  # the data-parallel policy's
    old_one: torch.Tensor  # [B, L] old logprobs the single worker scored
    old_two: torch.Tensor | None  # the data-parallel policy's, as the driver put them together
    w_one: dict[str, torch.Tensor]
    w_two: dict[str, torch.Tensor]


@dataclass
class Pair:
    """The module's data-parallel policy, its single-worker counterpart, and their first call."""

    two_ranks: Policy
    single: HfPolicyWorkerImpl
    step: Step


def first_step(two_ranks: Policy, single: HfPolicyWorkerImpl, out: Path) -> Step:
    """The first call of both on the same rows (the tests start wherever it left them)."""
    batch, extra = grpo_inputs(single, seed=0)
    initial = single.get_weights()
    one = single.train(batch, extra, LOSS)
    result = two_ranks.train(batch, extra, LOSS)
    assert single.old_logprobs is not None
    return Step(initial, one, result.metrics, single.old_logprobs, result.old_logprobs, single.get_weights(),
                saved_weights(two_ranks, out))


@pytest.fixture(scope="module")
def pair(ray_cluster, tiny_model_path, tmp_path_factory) -> Iterator[Pair]:
    """A ``Policy`` of two data-parallel HF workers (Ray actors, half a CPU each) and one worker of
    the same config in process, after their first call, for the module. One fixture, not three:
    the harness waits 2 s after each wider-scoped fixture of a Ray test for its actors to settle.
    The call comes first: a checkpoint written before any optimizer step has run makes torch's
    ``get_state_dict`` create AdamW's state with a zero-gradient step, and the first call would then
    take a smaller step than the single worker's."""
    cluster = RayVirtualCluster(2, num_cpus=0.5)
    policy = None
    try:
        policy = Policy(cluster, tiny_model_path, cfg(2), seed=0, bundle_indices=[0, 1])
        single = HfPolicyWorkerImpl(tiny_model_path, cfg(1), seed=0)  # built while the actors start
        policy.wait_ready()
        yield Pair(policy, single, first_step(policy, single, tmp_path_factory.mktemp("dp") / "step_1"))
    finally:
        if policy is not None:
            policy.shutdown()
        cluster.shutdown()


def test_the_layout_has_two_optimizer_steps_and_an_idle_micro_batch() -> None:
    """What the other tests' call exercises (the module docstring's layout), as the driver shards it."""
    (rows_0, per_step_0), (rows_1, per_step_1) = global_batch_shards(ROWS, 10, 2)
    assert per_step_0 == [5, 4] and per_step_1 == [5, 5]  # 3 / 3 micro-batches, then 2 / 3
    assert rows_0 + rows_1 != list(range(ROWS))  # stacked in rank order, rows move


def test_two_ranks_take_the_single_workers_optimizer_steps(pair: Pair) -> None:
    """Every metric of the call (the ranks' reductions: sums, minima, maxima) and the weights after
    it are the single worker's, within the bounds."""
    step = pair.step
    assert step.one["num_optimizer_steps"] == 2 and step.one["grad_norm"] > 0 and abs(step.one["loss"]) > 1e-3
    assert step.one["probs_ratio_min"] < 1 < step.one["probs_ratio_max"] and step.one["kl"] > 0
    assert step.two.keys() == step.one.keys(), sorted(step.two.keys() ^ step.one.keys())
    for key, value in step.one.items():
        bound = RELATIVE[key] * abs(value) if key in RELATIVE else ABSOLUTE.get(key, 0.0)
        assert abs(step.two[key] - value) <= bound, (key, step.two[key], value)
    update = distance(step.w_one, step.initial)
    assert step.w_two.keys() <= step.w_one.keys() and update > 0
    gap = distance({k: step.w_two[k] for k in step.w_two}, {k: step.w_one[k] for k in step.w_two})
    assert gap <= WEIGHTS_REL * update, gap / update


def test_the_old_logprobs_come_back_in_the_batchs_row_order(pair: Pair) -> None:
    """Each rank scores its own rows before the first update; the driver puts them back in row order."""
    step = pair.step
    assert step.old_two is not None and step.old_two.shape == step.old_one.shape
    assert ((step.old_two - step.old_one).norm() / step.old_one.norm()).item() <= OLD_LOGPROBS_REL


def test_a_refit_sends_the_whole_model_the_checkpoint_holds(pair: Pair, tmp_path: Path) -> None:
    """The weights a refit puts in the object store (every rank gathers, rank 0 sends) are the
    whole model, equal to the checkpoint's, names and values."""
    saved = saved_weights(pair.two_ranks, tmp_path / "now")
    ref, _ = pair.two_ranks.put_weights()
    sent = ray.get(ref)
    assert saved.keys() <= sent.keys()
    for name, tensor in saved.items():
        assert torch.equal(sent[name], tensor), name


def test_a_resume_takes_the_uninterrupted_policys_next_step_and_refuses_another_size(pair: Pair,
                                                                                   tmp_path: Path) -> None:
    """Checkpoint, a call, back to the checkpoint, the same call: the metrics and weights equal
    bit for bit (AdamW's moments and step count come back too). One worker refuses the checkpoint
    in one line."""
    two_ranks, single = pair.two_ranks, pair.single
    batch, extra = grpo_inputs(single, seed=1)
    version = two_ranks.weight_version
    two_ranks.save_checkpoint(str(tmp_path / "ckpt"))
    whole = two_ranks.train(batch, extra, LOSS).metrics
    w_whole = two_ranks.get_weights()
    two_ranks.load_checkpoint(str(tmp_path / "ckpt"))
    resumed = two_ranks.train(batch, extra, LOSS).metrics
    assert resumed == whole and two_ranks.weight_version == version + 1
    w_resumed = two_ranks.get_weights()
    assert w_resumed.keys() == w_whole.keys() and all(torch.equal(w_resumed[k], w_whole[k]) for k in w_whole)
    assert distance({k: w_whole[k] for k in pair.step.w_two}, pair.step.w_two) > 0  # the call trained
    with pytest.raises(ConfigError, match=r"was written with policy.data_parallel_size=2; this run has 1 "
                                          r"\(resume with the same size\)$"):
        single.load_checkpoint(str(tmp_path / "ckpt"))
