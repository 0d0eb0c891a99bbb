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
# Every train/* metric of a step, DP=2 against DP=1: exactly equal (counts, the lr, the driver's
# rollout statistics), unless bounded here (the workers' reductions, in float; measured gaps in
# test_data_parallel.py's table). The clip fraction may move by a token flipping at the clip
# boundary (1/43 of a step's fraction here); a fraction of one rank's tokens is off by half.
EQUAL = ("train/reward_mean", "train/completion_length", "train/fraction_groups_kept", "train/num_optimizer_steps")
RELATIVE = {"train/grad_norm": 1e-5, "train/entropy": 1e-5, "train/kl": 1e-5, "train/probs_ratio_min": 1e-5,
            "train/probs_ratio_max": 1e-5, "train/token_mult_prob_error": 1e-5}
ABSOLUTE = {"train/loss": 1e-6, "train/clip_fraction": 0.02}
WEIGHTS_REL = 2e-3
# One train call, judged whole: (recording overrides, batch overrides). "two optimizer steps": 32
# rows in global batches of 16, 8 a rank: the second step's ratios leave 1 (clipped tokens, a KL
# term). "idle micro-batches": 3 prompts x 7 = 21 rows split 10 / 11 in one optimizer step, 2 rows
# a micro-batch: rank 0 runs 5 and one idle. "even": one optimizer step of 16 rows a rank (the GPU test).
LAYOUTS = {
    "even": ([], ["policy.train_global_batch_size=32", "policy.train_micro_batch_size=8"]),
    "two optimizer steps": ([], ["policy.train_global_batch_size=16", "policy.train_micro_batch_size=8"]),
    "idle micro-batches": (["grpo.num_prompts_per_step=3", "grpo.completions_per_prompt=7"],
                           ["policy.train_global_batch_size=22", "policy.train_micro_batch_size=2"]),
}


def replay(model_path: str, rollouts: Path, out: Path, *overrides: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """A Ray run replaying ``rollouts``: its metrics and the weights it exported."""
    from safetensors.torch import load_file

    cfg = load_config(GRPO_YAML, [f"model.path={model_path}", *JOB, f"grpo.load_rollouts={rollouts}",
                                  f"logger.log_dir={out / 'log'}", f"checkpoint.save_path={out / 'final'}", *overrides],
                      grpo.GRPOMasterConfig)
    return grpo.train(cfg), load_file(str(out / "final" / "model.safetensors"))


def assert_same_step(one: dict, w_one: dict, two: dict, w_two: dict, model_path: str, step: str = "1") -> None:
    """Step ``step`` of replay ``two`` is replay ``one``'s: the same train/* metrics, each equal or
    within its bound (``RELATIVE``, ``ABSOLUTE``), and the weights after the run within
    ``WEIGHTS_REL`` of the update from the initial model (the run's last step must be ``step``)."""
    from safetensors.torch import load_file

    ref = {k: v[step] for k, v in one.items() if step in v and k.startswith("train/")}
    got = {k: v[step] for k, v in two.items() if step in v and k.startswith("train/")}
    assert ref["train/grad_norm"] > 0 and abs(ref["train/loss"]) > 1e-3 and ref["train/num_optimizer_steps"] >= 1
    assert got.keys() == ref.keys(), sorted(got.keys() ^ ref.keys())
    for key, value in ref.items():
        gap = abs(got[key] - value)
        bound = RELATIVE[key] * abs(value) if key in RELATIVE else ABSOLUTE.get(key, 0.0)
        assert gap <= bound, (key, got[key], value)
    before = load_file(str(Path(model_path) / "model.safetensors"))
    shared = [k for k in w_one if k in before]
    update = distance({k: w_one[k] for k in shared}, {k: before[k] for k in shared})
    assert w_two.keys() == w_one.keys() and update > 0
    assert distance(w_two, w_one) <= WEIGHTS_REL * update, distance(w_two, w_one) / update


def distance(a: dict, b: dict) -> float:
    return math.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum().item() for k in a))
