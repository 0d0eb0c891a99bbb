# Shared by tests/functional/*.sh (source it): run a job -> dump its metrics -> check rules.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   functional_setup <name>          # sets REPO, WORK=tests/functional/<name> (emptied)
#   run_job <script.py> args...      # runs an examples/ entry point, times it into $WORK/times.txt
#   check_run <log_dir> <rules...>   # TensorBoard -> $WORK/metrics.json -> tests/check_metrics.py
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Ray must not rebuild worker environments through uv (slow, needs the network).
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
export PYTHONUNBUFFERED=1

functional_setup() {
  WORK="$REPO/tests/functional/$1"
  rm -rf "$WORK" && mkdir -p "$WORK"
  cd "$REPO"
  echo "== functional test '$1': work dir $WORK"
}

run_job() {
  local start=$SECONDS
  python "$@"
  echo "$(basename "$1") $((SECONDS - start)) s" | tee -a "$WORK/times.txt"
}

check_run() {
  local log_dir=$1; shift
  python tests/json_dump_tb_logs.py "$log_dir/tensorboard" --output "$WORK/metrics.json"
  python tests/check_metrics.py "$WORK/metrics.json" "$@" --json-report "$WORK/check_report.json"
}
