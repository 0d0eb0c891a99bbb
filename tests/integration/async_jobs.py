"""The asynchronous GRPO job the integration tests run (``test_async_grpo*.py``)."""

from __future__ import annotations

from pathlib import Path

from posttrain.algorithms import grpo
from posttrain.config import load_config

GRPO_YAML = str(Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_arithmetic.yaml")
STEPS, P, G, DP = 5, 4, 4, 3
N = P * G
LOOP = ["generation.backend=hf", "cluster.cpus_per_worker=0.5", "grpo.val_period=0", "policy.lr=1e-2",
        "grpo.num_steps=3"]
# A job the untrained tiny model earns rewards in: one-digit sums answered in one token, 8 per
# prompt (the producer actor scores with the real verifier; a test cannot patch it there), so
# some groups vary and the KL term acts once the weights moved: steps 2 and 3 train.
LEARNABLE = ["data.arithmetic.operand_digits=1", "generation.max_new_tokens=1", "grpo.completions_per_prompt=8",
             "grpo.kl_coef=0.1"]

# The smallest steps (2 prompts x 2 one-token completions, one validation problem, no weight-sync
# probe: most of such a step's time): for in-process tests of which step a sampling call is for, or
# of a claim that never gets one, not of learning or of refit.
SMALL_STEPS = ["grpo.num_prompts_per_step=2", "grpo.completions_per_prompt=2", "generation.max_new_tokens=1",
               "data.arithmetic.num_val=1", "generation.refit_probe.num_sequences=0"]


def async_cfg(model_path: str, *overrides: str) -> grpo.GRPOMasterConfig:
    return load_config(GRPO_YAML, [f"model.path={model_path}", f"grpo.num_steps={STEPS}",
                                   f"grpo.num_prompts_per_step={P}", f"grpo.completions_per_prompt={G}",
                                   "generation.max_new_tokens=3", "data.arithmetic.num_val=8",
                                   "grpo.async.enabled=true", "grpo.async.max_staleness=1", *overrides],
                       grpo.GRPOMasterConfig)
