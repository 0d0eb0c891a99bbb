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

# Each bound's source: `check-metrics calibrate` on 5 healthy runs (sft.seed = model.tiny.seed = 0..4, one
# H200, the 5 runs side by side, each pinned to 2-3 Xeon host cores, Nov 27), false-alarm rate 0.01:
#   last-5 loss < 0.8 x first-2    last - 0.8 x first in [-1.510, -1.338], rec < -1.13
#   last val loss < 0.8 x step 0   last - 0.8 x first in [-1.557, -1.380], rec < -1.14
#   grad norm < 100                [5.3, 22.1], rec 39; kept as a divergence guard
# Kept at 0.8 x, as sft.sh (whose broken run, grads_zeroed_before_step, ends +1.10 above it): the
# healthy runs fall to ~0.3 x their start. No Megatron-side mutant zeroes the gradients, so no broken
# run was measured here; sft.sh's shows what a run that does not learn logs on these rules.
check_run "$WORK/logs" --expect-steps "$EXPECT_STEPS" --pack sft \
  'mean(data["train/loss"], -5) < 0.8 * mean(data["train/loss"], 1, 2)' \
  'mean(data["val/loss"], -1) < 0.8 * data["val/loss"]["0"]' \
  'max(data["train/grad_norm"]) < 100'
