"""A Megatron policy resumed from a checkpoint continues the run it was (GPU, extra ``mcore``).

    uv run --extra mcore --group test bash tests/run_unit.sh --mcore-only \
        tests/unit/models/megatron/test_megatron_resume.py

Tensor parallelism splits the optimizer's state over the ranks: each rank writes its own shard
and must read back its own (the shards have the same shapes, so reading another rank's raises
nothing and trains on with wrong Adam moments). And the GRPO loop on a Megatron policy resumes
as exactly as on the HF one (``tests/integration/test_checkpoint_resume.py``): a run of 4 steps
and a run of 2 resumed for 2 more log the same values for steps 3-4, the KL term (against the
initial model) included. The worker-level check that a loaded checkpoint leaves the reference at
the initial model runs over every backend there
(``test_a_loaded_checkpoint_trains_on_from_its_weights_against_the_initial_reference[megatron]``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from harness.policy_backends import worker_cfg
from integration.learnable_reward import low_digit_reward
from integration.same_run import assert_same_steps

from posttrain.algorithms import grpo, grpo_step
from posttrain.algorithms.loss_functions import ClippedPGLoss
from posttrain.config import load_config
from posttrain.data.batch import make_batch

pytestmark = pytest.mark.mcore
GRPO_YAML = str(Path(__file__).resolve().parents[4] / "examples" / "configs" / "grpo_arithmetic.yaml")


def _train_steps(policy, steps: int) -> list[dict[str, float]]:
    """``steps`` GRPO updates of ``policy`` on one fixed batch (two optimizer steps each)."""
    batch = make_batch([[2, 3, 4], [5, 6], [7, 8, 9, 10], [4, 4]], [[11, 12], [13], [14, 15, 16], [12, 3]], 0)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    return [policy.train(batch, {"advantages": advantages}, ClippedPGLoss()).metrics for _ in range(steps)]


def _max_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.gpu(2)
@pytest.mark.parametrize(("tensor_parallel", "pipeline_parallel"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_each_tensor_parallel_rank_restores_its_own_optimizer_state(ray_cluster, tiny_model_path, tmp_path,
                                                                     tensor_parallel, pipeline_parallel) -> None:
    """Two steps, a checkpoint, two more steps: a policy of two ranks (two tensor-parallel
    shards, or two pipeline stages) that loads the checkpoint takes the same two steps (metrics
    and gathered weights), so both ranks' Adam moments and the warmup position came back, each
    rank's its own."""
    from posttrain.distributed.ray_cluster import RayVirtualCluster
    from posttrain.models.policy.lm_policy import Policy

    cfg = worker_cfg("megatron", tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel, lr=1e-2,
                     warmup_steps=3, train_global_batch_size=2, train_micro_batch_size=1)
    ckpt = str(tmp_path / "ckpt")
    results = []
    for resume in (False, True):  # one policy at a time: each takes both GPUs
        cluster = RayVirtualCluster(2, num_cpus=1, num_gpus=1)
        policy = Policy(cluster, tiny_model_path, cfg, seed=0, bundle_indices=[0, 1])
        try:
            policy.wait_ready()
            if resume:
                policy.load_checkpoint(ckpt)
            else:
                _train_steps(policy, 2)
                policy.save_checkpoint(ckpt)
            results.append((_train_steps(policy, 2), policy.get_weights()))
        finally:
            policy.shutdown()
            cluster.shutdown()
    (logged, weights), (logged_resumed, weights_resumed) = results
    for step, resumed_step in zip(logged, logged_resumed, strict=True):
        for key, value in step.items():
            assert resumed_step[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    assert _max_gap(weights_resumed, weights) <= 1e-6


@pytest.mark.gpu(1)
def test_a_resumed_megatron_grpo_run_logs_what_the_uninterrupted_run_logged(ray_cluster, tiny_model_path, tmp_path,
                                                                            monkeypatch) -> None:
    """The exact-resume test of the HF policy, on Megatron (real Ray: the in-process runs drive
    the hf backend only): the policy and the hf engine share the GPU, fp32 without TF32 on both,
    a reward the untrained model earns (every step trains) and kl_coef 0.1."""
    monkeypatch.setattr(grpo_step, "math_reward", low_digit_reward)  # the sync loop scores in this process
    base = [f"model.path={tiny_model_path}", "policy.backend=megatron", "cluster.gpus_per_worker=0.5",
            "policy.precision=fp32", "policy.tf32=false", "generation.backend=hf", "grpo.num_prompts_per_step=4",
            "grpo.completions_per_prompt=4", "generation.max_new_tokens=3", "data.arithmetic.num_val=6",
            "grpo.val_period=0", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=4",
            "policy.lr=3e-3", "policy.warmup_steps=5", "grpo.kl_coef=0.1", "checkpoint.save_period=2"]

    def run(steps: int, name: str) -> dict[str, dict[str, float]]:
        return grpo.train(load_config(GRPO_YAML, [*base, f"grpo.num_steps={steps}", f"logger.log_dir={tmp_path / name}",
                                                  f"checkpoint.dir={tmp_path / (name + '_ckpt')}"],
                                      grpo.GRPOMasterConfig))

    whole = run(4, "whole")
    run(2, "log")
    resumed = run(4, "log")
    assert sorted(map(int, resumed["train/loss"])) == [1, 2, 3, 4]
    assert all(resumed["train/grad_norm"][s] > 0 and resumed["train/kl"][s] > 1e-3 for s in ("3", "4"))
    assert_same_steps(whole, resumed, range(3, 5))


@pytest.mark.gpu(1)
def test_a_checkpoint_of_another_rank_count_is_refused_in_one_line(ray_cluster, tiny_model_path, tmp_path) -> None:
    """A checkpoint holding the optimizer states of more ranks than the policy has (a tensor-parallel
    run's, resumed on one GPU) is refused, not half read; so is one holding fewer."""
    import shutil

    from posttrain.distributed.ray_cluster import RayVirtualCluster
    from posttrain.errors import ConfigError
    from posttrain.models.policy.lm_policy import Policy
    from posttrain.models.policy.megatron_policy_worker import OPTIMIZER_STATE

    cfg = worker_cfg("megatron", lr=1e-2, train_global_batch_size=2, train_micro_batch_size=1)
    ckpt = tmp_path / "ckpt"
    cluster = RayVirtualCluster(1, num_cpus=1, num_gpus=1)
    policy = Policy(cluster, tiny_model_path, cfg, seed=0, bundle_indices=[0])
    try:
        policy.wait_ready()
        policy.save_checkpoint(str(ckpt))
        rank0 = ckpt / OPTIMIZER_STATE.format(rank=0)
        shutil.copy(rank0, ckpt / OPTIMIZER_STATE.format(rank=1))  # as if written by 2 ranks
        with pytest.raises(ConfigError, match=r"was written with policy.megatron.tensor_model_parallel_size x "
                                              r"pipeline_model_parallel_size=2; this run has 1 "):
            policy.load_checkpoint(str(ckpt))
        for rank in (0, 1):
            (ckpt / OPTIMIZER_STATE.format(rank=rank)).unlink()
        with pytest.raises(ConfigError, match=r"pipeline_model_parallel_size=0; this run has 1 "):
            policy.load_checkpoint(str(ckpt))
    finally:
        policy.shutdown()
        cluster.shutdown()
