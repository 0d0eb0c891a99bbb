# Shared by tests/functional/*.sh (source it): run a job -> dump its metrics -> check rules.
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   functional_setup <name>          # sets REPO, WORK=tests/functional/<name> (emptied)
#   run_job <script.py> args...      # runs an examples/ entry point, times it into $WORK/times.txt
#   config_value <yaml> <key> [key.sub=value ...]   # a config value after the overrides (num_steps)
#   check_run <log_dir> --expect-steps N [--pack P] <rules...>
#                                    # TensorBoard -> $WORK/metrics.json -> tests/check_metrics.py
#   grpo_functional <name> [key.sub=value ...]   # SFT warm start -> GRPO -> the GRPO rules
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

# The GRPO functional test (grpo.sh, grpo_non_colocated.sh differ only in placement):
# SFT warm start to held-out greedy accuracy 0.35, measurably non-zero but far from 1, so
# GRPO groups have reward variance to learn from (from warm starts at 0.30, GRPO gains came
# slower; from 0.5 and up there is less headroom: see docs/testing.md), then GRPO on vLLM
# (BACKEND=hf to run it on Hugging Face generate), then its rules. SEED seeds the model
# init, the SFT and the GRPO run. Overrides go to run_grpo.py.
grpo_functional() {
  local name=$1; shift
  functional_setup "$name"
  local seed=${SEED:-0} config=examples/configs/grpo_arithmetic.yaml
  local overrides=(generation.backend="${BACKEND:-vllm}" "$@")
  # The step the run must reach (grpo.num_steps after the overrides): a run that ends early fails.
  local expect_steps tenth
  expect_steps=$(config_value "$config" grpo.num_steps "${overrides[@]}")
  tenth=$(( (expect_steps + 9) / 10 ))  # steps in the first / last 10% of the run

  run_job examples/run_sft.py --config examples/configs/sft_arithmetic.yaml \
    sft.stop_at_val_accuracy=0.35 sft.seed="$seed" model.tiny.seed="$seed" generation.backend="${BACKEND:-vllm}" \
    logger.log_dir="$WORK/sft_logs" checkpoint.save_path="$WORK/warm_start"

  run_job examples/run_grpo.py --config "$config" \
    model.path="$WORK/warm_start" grpo.seed="$seed" logger.log_dir="$WORK/logs" "${overrides[@]}"

  # val/accuracy is logged at step 0 (before any update) and at the last step. The grpo pack
  # adds: loss, grad norm and KL finite on every step, grad norm non-zero, reward groups with
  # variance on every step, entropy above a floor, loss / grad norm / entropy / KL / reward not
  # constant over the run, engine/trainer logprob agreement on the rollouts. Probability ratios are judged by their median over steps: the per-step min/max
  # are the extremes of ~1,000 tokens, and one token's ratio fell to 0.007 in a healthy run
  # (seed 2). The weight-sync probe after every refit (the run itself stops past
  # generation.refit_probe.max_logprob_error) must stay at float rounding: fp32 on both sides.
  check_run "$WORK/logs" --expect-steps "$expect_steps" --pack grpo \
    'mean(data["val/accuracy"], -1) - data["val/accuracy"]["0"] >= 0.15' \
    "mean(data[\"train/reward_mean\"], -$tenth) > mean(data[\"train/reward_mean\"], 1, $((tenth + 1)))" \
    'max(data["train/grad_norm"]) < 100' \
    'max(data["train/loss"]) < 10' \
    'median(data["train/probs_ratio_min"]) > 0.5' \
    'median(data["train/probs_ratio_max"]) < 2' \
    'mean(data["train/clip_fraction"]) < 0.05' \
    'max(data["train/clip_fraction"]) < 0.3' \
    'max(data["train/refit_logprob_error"]) < 1e-4' \
    'max(data["train/refit_token_mult_prob_error"]) - 1 < 1e-4'
}
