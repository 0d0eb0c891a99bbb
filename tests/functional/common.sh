# Shared by tests/functional/*.sh (source it): run a job -> dump its metrics -> check rules.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   functional_setup <name>          # sets REPO, WORK=tests/functional/<name> (emptied)
#   run_job <script.py> args...      # runs an examples/ entry point, times it into $WORK/times.txt
#   config_value <yaml> <key> [key.sub=value ...]   # a config value after the overrides (num_steps)
#   check_run <log_dir> --expect-steps N [--pack P] <rules...>
#                                    # TensorBoard -> $WORK/metrics.json -> tests/check_metrics.py
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

# The value of <key> in <yaml> after the key.sub=value overrides the entry point also gets
# (OmegaConf dotlist merge, as posttrain.config.load_config applies them); fails if unset.
config_value() {
  python - "$@" <<'PY'
import sys
from omegaconf import OmegaConf
yaml, key, overrides = sys.argv[1], sys.argv[2], [a for a in sys.argv[3:] if "=" in a]
value = OmegaConf.select(OmegaConf.merge(OmegaConf.load(yaml), OmegaConf.from_dotlist(overrides)), key)
if value is None:
    sys.exit(f"config_value: {key} is not set in {yaml} {' '.join(overrides)}")
print(value)
PY
}

# A run that ended early must never pass: every check names the step the run must reach.
check_run() {
  local log_dir=$1; shift
  if [[ " $* " != *" --expect-steps "* && " $* " != *" --expect-steps="* ]]; then
    echo "check_run: pass --expect-steps N (the run's num_steps) so that a run that ended early fails" >&2
    return 2
  fi
  python tests/json_dump_tb_logs.py "$log_dir/tensorboard" --output "$WORK/metrics.json"
  python tests/check_metrics.py "$WORK/metrics.json" "$@" --output-json "$WORK/check_report.json" --github-summary
}
