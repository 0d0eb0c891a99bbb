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
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
require_gpus 1
require_extra mcore megatron.core "$@"
BACKEND=megatron grpo_functional grpo_megatron_generation policy.backend=megatron \
  cluster.gpus_per_worker=0.5 policy.precision=fp32 policy.tf32=false "$@"
