#!/usr/bin/env bash
# Unit tests: picks the test configuration and runs pytest on tests/unit.
#   uv run --group test bash tests/run_unit.sh [--hf-gated] [--mcore-only | --vllm-only] [pytest args...]
# Default configuration: everything except tests marked hf_gated, mcore or vllm.
# Exit status is pytest's; "no tests collected" (pytest's 5) is a failure, never a pass.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0

hf_gated=0 only="" user_marker=0 args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --hf-gated) hf_gated=1 ;;
    --mcore-only|--vllm-only)
      if [ -n "$only" ]; then echo "run_unit.sh: $only and $1 cannot be combined" >&2; exit 2; fi
      only=${1#--}; only=${only%-only} ;;
    -m) user_marker=1; args+=("$1" "$2"); shift ;;
    *) args+=("$1") ;;
  esac
  shift
done

if [ "$user_marker" = 1 ]; then
  marker=()                       # the user's -m wins over the configuration
elif [ -n "$only" ]; then
  expr="$only"; [ "$hf_gated" = 1 ] || expr="$expr and not hf_gated"
  marker=(-m "$expr")
else
  expr="not mcore and not vllm"; [ "$hf_gated" = 1 ] || expr="$expr and not hf_gated"
  marker=(-m "$expr")
fi

set +e
python -m pytest "${marker[@]}" "${args[@]}"
status=$?
set -e
if [ "$status" = 5 ]; then
  echo "run_unit.sh: this configuration selected no tests (exit 5): nothing was tested" >&2
fi
exit "$status"
