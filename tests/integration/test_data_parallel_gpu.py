"""The data-parallel HF policy on two GPUs (torch FSDP2 over NCCL, a GPU per rank): a recorded
GRPO step at DP=2 is the step at DP=1 on one GPU (fp32, no TF32), within test_data_parallel.py's
bounds; and in a GRPO run with a colocated engine (on rank 0's GPU) the engine serves the sharded
policy's weights after every refit. Skipped with fewer than 2 GPUs (CI never has them).

The bounds are the CPU test's (``data_parallel_jobs``: calibrated on AMD EPYC, seeds 0-5, with
~100x over what was seen there). On GPUs they are not calibrated: both tests passed in each of
two calls on 2 x H200 (Nov 26), and the gaps were not recorded. NCCL's reduction order differs
from gloo's, so the first runs on other GPU machines should record the gaps next to these
bounds. Broken, the step is off by a factor (the ``data_parallel_*`` mutants, caught on CPU by
the same ``assert_same_step``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from data_parallel_jobs import GRPO_YAML, JOB, LAYOUTS, UNEVEN, assert_same_step, replay
from recorded_rollouts import record_varied_rollouts

from posttrain.algorithms import grpo
from posttrain.config import load_config

_GPUS = torch.cuda.device_count()
pytestmark = [pytest.mark.gpu(2), pytest.mark.skipif(_GPUS < 2, reason=f"needs 2 GPUs, found {_GPUS}")]
ON_GPUS = ["cluster.gpus_per_worker=1", "policy.precision=fp32", "policy.tf32=false"]


def test_two_data_parallel_ranks_on_two_gpus_take_the_single_gpus_step(ray_cluster, tiny_model_path,
                                                                       tmp_path: Path) -> None:
    shape, batches = LAYOUTS["even"]
    rollouts = record_varied_rollouts(tmp_path / "rec", [f"model.path={tiny_model_path}", *JOB, *shape])
    one, w_one = replay(tiny_model_path, rollouts, tmp_path / "dp1", "grpo.num_steps=1", *shape, *batches, *ON_GPUS)
    two, w_two = replay(tiny_model_path, rollouts, tmp_path / "dp2", "grpo.num_steps=1", *shape, *batches, *ON_GPUS,
                        "policy.data_parallel_size=2")
    assert_same_step(one, w_one, two, w_two, tiny_model_path)


def test_a_colocated_engine_serves_the_data_parallel_policys_weights_on_gpus(ray_cluster, tiny_model_path,
                                                                            tmp_path: Path) -> None:
    cfg = load_config(GRPO_YAML, [f"model.path={tiny_model_path}", *JOB, "grpo.num_steps=2", *UNEVEN, *ON_GPUS,
                                  "policy.data_parallel_size=2", "generation.colocated=true",
                                  f"logger.log_dir={tmp_path}"], grpo.GRPOMasterConfig)
    metrics = grpo.train(cfg)
    assert set(metrics["train/refit_logprob_error"]) == {"1", "2"}
    assert all(v < 1e-6 for v in metrics["train/refit_logprob_error"].values()), metrics["train/refit_logprob_error"]
    assert metrics["train/kl"]["2"] > 0
