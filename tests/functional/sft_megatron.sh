#!/usr/bin/env bash
# sft.sh with a Megatron (megatron-core) policy on one GPU (bf16 weights and compute, fp32
# master weights): SFT of the tiny character-level model on GSM8K solutions; the loss must fall.
#   uv run bash tests/functional/sft_megatron.sh [key.sub=value ...]   (brings in the mcore extra)
# Without a GPU: "needs 1 GPU, found 0", exit 2.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_gpus 1
require_extra mcore megatron.core "$@"
SFT_CONFIG=examples/configs/sft_gsm8k.yaml
overrides=(policy.backend=megatron policy.precision=bf16-mixed cluster.gpus_per_worker=0.5
           generation.backend="${BACKEND:-auto}" "$@")
validate examples/run_sft.py --config "$SFT_CONFIG" "${overrides[@]}"
functional_setup sft_megatron
EXPECT_STEPS=$(config_value "$SFT_CONFIG" sft.num_steps "${overrides[@]}")

run_job examples/run_sft.py --config "$SFT_CONFIG" logger.log_dir="$WORK/logs" "${overrides[@]}"

check_run "$WORK/logs" --expect-steps "$EXPECT_STEPS" --pack sft \
  'mean(data["train/loss"], -5) < 0.8 * mean(data["train/loss"], 1, 2)' \
  'mean(data["val/loss"], -1) < 0.8 * data["val/loss"]["0"]' \
  'max(data["train/grad_norm"]) < 100'
