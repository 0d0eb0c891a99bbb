#!/usr/bin/env bash
# GRPO on 2-digit addition from a short SFT warm start; the rules prove the run learned.
#   uv run bash tests/functional/grpo.sh [key.sub=value ...]   (overrides go to run_grpo.py)
#   SEED=1 uv run bash tests/functional/grpo.sh                 (seeds the model init, SFT and GRPO)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
functional_setup grpo
SEED=${SEED:-0}

# Warm start: SFT until held-out greedy accuracy is measurably non-zero but far from 1,
# so GRPO groups have reward variance to learn from.
run_job examples/run_sft.py --config examples/configs/sft_arithmetic.yaml \
  sft.stop_at_val_accuracy=0.3 sft.seed="$SEED" model.tiny.seed="$SEED" logger.log_dir="$WORK/sft_logs" checkpoint.save_path="$WORK/warm_start"

run_job examples/run_grpo.py --config examples/configs/grpo_arithmetic.yaml \
  model.path="$WORK/warm_start" grpo.seed="$SEED" logger.log_dir="$WORK/logs" "$@"

# val/accuracy is logged at step 0 (before any update) and at the last step.
check_run "$WORK/logs" \
  'mean(data["val/accuracy"], -1) - data["val/accuracy"]["0"] >= 0.15' \
  'mean(data["train/reward_mean"], -20) > mean(data["train/reward_mean"], 1, 21)' \
  'min(data["train/grad_norm"]) > 0' \
  'max(data["train/grad_norm"]) < 100' \
  'max(data["train/loss"]) - min(data["train/loss"]) > 0' \
  'max(data["train/loss"]) < 10' \
  'min(data["train/probs_ratio_min"]) > 0.05' \
  'max(data["train/probs_ratio_max"]) < 20' \
  'mean(data["train/clip_fraction"]) < 0.05' \
  'max(data["train/clip_fraction"]) < 0.3' \
  'max(data["train/token_mult_prob_error"]) < 1.05' \
  'min(data["train/entropy"]) > 0'
