#!/usr/bin/env bash
# SFT of a tiny character-level model on GSM8K solutions; the training loss must fall.
#   uv run bash tests/functional/sft.sh [key.sub=value ...]   (overrides go to run_sft.py)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
SFT_CONFIG=examples/configs/sft_gsm8k.yaml
validate examples/run_sft.py --config "$SFT_CONFIG" "$@"
functional_setup sft
EXPECT_STEPS=$(config_value "$SFT_CONFIG" sft.num_steps "$@")  # a run that ends early fails

run_job examples/run_sft.py --config "$SFT_CONFIG" logger.log_dir="$WORK/logs" "$@"

# The sft pack adds: loss and grad norm finite on every step, grad norm non-zero, entropy
# above a floor, val/loss finite.
check_run "$WORK/logs" --expect-steps "$EXPECT_STEPS" --pack sft \
  'mean(data["train/loss"], -5) < 0.8 * mean(data["train/loss"], 1, 2)' \
  'mean(data["val/loss"], -1) < 0.8 * data["val/loss"]["0"]' \
  'max(data["train/grad_norm"]) < 100'
