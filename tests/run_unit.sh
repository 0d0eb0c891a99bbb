#!/usr/bin/env bash
# Unit tests: picks the test configuration, checks its uv extra, runs pytest.
#   uv run --group test bash tests/run_unit.sh [--hf-gated] [--mcore-only | --vllm-only | --nightly-only] [--repeat N] [pytest args / paths...]
# The configurations (flag -> marker filter, uv extra, package) are the table in
# tests/configurations.toml; posttrain.testing.harness.configurations turns the arguments into pytest's.
# A user's -m EXPR replaces the configuration's marker filter; other arguments and paths go to pytest.
# --repeat N runs the tests N times in fresh processes and prints their pass rates (posttrain.testing.harness.repeat).
# --help prints the configurations, their extras and the exit codes.
# Exit status: pytest's; 2 for a usage error, an unknown flag (with a did-you-mean) or a missing
# extra (the `uv run --extra ...` line to use is printed); 5 when the configuration selected no
# test or every selected test was skipped: nothing was tested, so CI cannot go green; with --repeat, 3 when
# the only problems were infrastructure errors (docs/testing.md, "Flake hunting").
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
# Write bytecode even where PYTHONDONTWRITEBYTECODE is set (CI machines, many containers): without it
# every process of the tier (each xdist worker, Ray actor and pytester subprocess) compiled posttrain
# afresh and pytest re-rewrote the asserts of ~360 modules at each start (docs/testing.md, "Bytecode").
# The files go to the git-ignored __pycache__ folders; where the tree is read-only Python skips them.
unset PYTHONDONTWRITEBYTECODE
# One GPU count for the plan (which extra) and for the gpu(n) skips in pytest.
if [ -z "${POSTTRAIN_NUM_GPUS:-}" ]; then
  POSTTRAIN_NUM_GPUS=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU ' || true)
fi
export POSTTRAIN_NUM_GPUS

plan=$(mktemp)
trap 'rm -f "$plan"' EXIT
status=0
python -m posttrain.testing.harness.configurations --table tests/configurations.toml plan -- "$@" >"$plan" || status=$?
if [ "$status" = 3 ]; then  # --help: the usage is in the plan's place
  cat "$plan"
  exit 0
fi
[ "$status" = 0 ] || exit "$status"
mapfile -d '' cmd <"$plan"  # python -m pytest ARGS..., or the --repeat runner around them

set +e
"${cmd[@]}"
status=$?
set -e
if [ "$status" = 4 ]; then  # pytest's own usage error (e.g. an unknown short option): ours is 2
  echo "run_unit.sh: pytest refused the arguments (see above): exit 2" >&2
  exit 2
fi
if [ "$status" = 5 ]; then
  echo "run_unit.sh: nothing was tested (no test selected, or every selected test skipped): exit 5" >&2
fi
exit "$status"
