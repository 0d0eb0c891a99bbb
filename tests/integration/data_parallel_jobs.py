"""The data-parallel GRPO job the integration tests replay (``test_data_parallel*.py``): a
recorded step of the arithmetic task, replayed by one worker or by two FSDP2 ranks."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from posttrain.algorithms import grpo
from posttrain.config import load_config

GRPO_YAML = "examples/configs/grpo_arithmetic.yaml"
JOB = ["grpo.num_prompts_per_step=4", "grpo.completions_per_prompt=8", "grpo.seed=0",
       "data.arithmetic.operand_digits=1", "generation.max_new_tokens=3", "grpo.kl_coef=0.1", "policy.lr=1e-2",
       "grpo.val_period=0",
       "data.arithmetic.num_val=8", "generation.backend=hf", "cluster.cpus_per_worker=0.5"]
# 32 rows in global batches of 3, one row a micro-batch: 11 optimizer steps a call, and in each
# rank 0 holds 1 row of 3, rank 1 holds 2, so rank 0 runs an idle micro-batch every step; the old
# logprobs are scored first (several steps), in chunks of 4 rows: 3 chunks on rank 0, 6 on rank 1
UNEVEN = ["policy.train_global_batch_size=3", "policy.train_micro_batch_size=1", "policy.logprob_batch_size=4"]
EQUAL = ("train/reward_mean", "train/completion_length", "train/fraction_groups_kept", "train/num_optimizer_steps")
RELATIVE = {"train/grad_norm": 1e-5, "train/entropy": 1e-5, "train/kl": 1e-5}
LOSS_ABS, WEIGHTS_REL = 1e-6, 2e-3


def replay(model_path: str, rollouts: Path, out: Path, *overrides: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """A Ray run replaying ``rollouts``: its metrics and the weights it exported."""
    from safetensors.torch import load_file

    cfg = load_config(GRPO_YAML, [f"model.path={model_path}", *JOB, f"grpo.load_rollouts={rollouts}",
                                  f"logger.log_dir={out / 'log'}", f"checkpoint.save_path={out / 'final'}", *overrides],
                      grpo.GRPOMasterConfig)
    return grpo.train(cfg), load_file(str(out / "final" / "model.safetensors"))


def distance(a: dict, b: dict) -> float:
    return math.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum().item() for k in a))
