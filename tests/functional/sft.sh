#!/usr/bin/env bash
# SFT of a tiny character-level model on GSM8K solutions; the training loss must fall.
#   uv run bash tests/functional/sft.sh [key.sub=value ...]   (overrides go to run_sft.py)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
functional_setup sft

run_job examples/run_sft.py --config examples/configs/sft_gsm8k.yaml logger.log_dir="$WORK/logs" "$@"

check_run "$WORK/logs" \
  'mean(data["train/loss"], -5) < 0.8 * mean(data["train/loss"], 1, 2)' \
  'mean(data["val/loss"], -1) < 0.8 * data["val/loss"]["0"]' \
  'min(data["train/grad_norm"]) > 0' \
  'max(data["train/grad_norm"]) < 100'
