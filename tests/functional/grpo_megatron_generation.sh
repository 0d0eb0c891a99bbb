#!/usr/bin/env bash
# GRPO with a Megatron policy AND Megatron generation (generation.backend=megatron: megatron-core's
# static-batch inference loop and KV cache, posttrain's sampler) on one GPU, judged by grpo.sh's
# rules: the weight-sync probe after every refit, the engine/trainer logprob agreement on every
# step's rollouts (token_mult_prob_error), the reward trend and the held-out sampling-accuracy
# gain (MIN_VAL_GAIN, default 0.02). Full fp32 (no TF32) on both sides.
# By default the engine is in place (generation.colocated=true): the policy's own worker samples
# from the model it trains, and a refit publishes the weight version and runs the probe, copying
# nothing. With generation.colocated=false the engine is a Ray worker of its own on the policy's
# GPU (half each) holding its own GPTModel; each refit sends the policy's weights in Hugging Face
# names over CUDA IPC and the engine converts them.
#   uv run bash tests/functional/grpo_megatron_generation.sh [generation.colocated=false] [key.sub=value ...]
# Without a GPU: "needs 1 GPU, found 0", exit 2.
# The bounds' source for this script: `check-metrics calibrate` on 5 healthy runs (SEED=0-4, in place,
# one H200, the 5 runs side by side on it, each pinned to 2-3 Xeon host cores, Nov 27), false-alarm rate
# 0.01: healthy [min, max], recommended bound (rec). Broken: SEED=0 under advantage_sign_flipped fails
# the gain (-0.200), the reward trend, grad norm > 0 and groups kept > 0.
#   gain >= 0.02               [0.129, 0.306], mean 0.246, sd 0.079, rec -0.077: 0.02 is 2.9 sd under the
#                              mean (grpo_megatron.sh says why it is kept)
#   reward last 10% > first    last - first in [0.091, 0.308], rec > -0.122
#   grad norm < 100            [8.9, 19.3], rec 31;   loss < 10: [0.028, 0.072], rec 0.119
#   median ratio min > 0.5     [0.707, 0.952], rec 0.34;   median ratio max < 2: [1.06, 1.36], rec 1.82
#   mean clip fraction < 0.05  [0.002, 0.015], rec 0.034;   max clip fraction < 0.3: [0.063, 0.125], rec 0.21
#   probe errors < 3e-4        0 in every run: in place, the engine is the trained model (no copy to differ)
#   engine/trainer token_mult_prob_error < 1.05 (pack): 1 to 7 digits in every run
#   entropy > 0.05 (pack)      [0.142, 0.255], rec < 0 (no floor from these runs; kept)
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_gpus 1
require_extra mcore megatron.core "$@"
BACKEND=megatron grpo_functional grpo_megatron_generation policy.backend=megatron \
  cluster.gpus_per_worker=0.5 policy.precision=fp32 policy.tf32=false "$@"
