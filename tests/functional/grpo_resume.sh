#!/usr/bin/env bash
# Checkpoint / resume (the "Level 1" check): the GRPO job of grpo.sh (Hugging Face engine, so
# the comparison can be exact) runs once uninterrupted as the reference; then again with
# checkpoints every SAVE_PERIOD steps, SIGKILLed (driver and Ray together) at a random moment
# after the first checkpoint, and started again with the same command: it must resume from
# the newest complete checkpoint, reach the last step with every step logged once, learn
# (grpo.sh's rules), and log what the reference logged (every train/* and val/* metric
# within 1e-6).
#   uv run bash tests/functional/grpo_resume.sh [key.sub=value ...]
#   SEED=1 ... (seeds the model init, SFT and GRPO); KILL_SEED=N picks the kill moment
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
export BACKEND=${BACKEND:-hf}
steps=${STEPS:-200} save_period=${SAVE_PERIOD:-40}
grpo_functional grpo_resume grpo.num_steps="$steps" "$@"  # the reference run, with its rules
reference=$WORK/logs/metrics.json

ckpt=$WORK/checkpoints logs=$WORK/resumed_logs
args=(examples/run_grpo.py --config examples/configs/grpo_arithmetic.yaml model.path="$WORK/warm_start"
      grpo.seed="${SEED:-0}" generation.backend="$BACKEND" grpo.num_steps="$steps" logger.log_dir="$logs"
      checkpoint.dir="$ckpt" checkpoint.save_period="$save_period" "$@")
# Its own session, so that the kill takes Ray's processes (started by the driver) with it.
setsid python "${args[@]}" > "$WORK/killed_run.log" 2>&1 &
pid=$!
until compgen -G "$ckpt/step_*/COMPLETE" >/dev/null; do
  kill -0 "$pid" 2>/dev/null || { echo "the run ended before its first checkpoint" >&2; exit 1; }
  sleep 1
done
delay=$(python -c "import random; print(random.Random(${KILL_SEED:-$RANDOM}).uniform(0, 20))")
sleep "$delay"
kill -KILL -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
echo "== killed the run (SIGKILL, its whole session) ${delay%.*} s after its first checkpoint; checkpoints:" \
     "$(cd "$ckpt" && echo step_*)"
if [ -f "$ckpt/step_$steps/COMPLETE" ]; then
  echo "the run finished before it was killed: nothing would be resumed" >&2
  exit 1
fi

# The same command: it must resume from the newest complete checkpoint (a run that started
# over would match the reference too: the job is deterministic), so its output must say so.
run_job "${args[@]}" | tee "$WORK/resumed_run.log"
if ! grep -q "^resumed from $ckpt/step_[0-9]* " "$WORK/resumed_run.log"; then
  echo "the second run did not resume from a checkpoint in $ckpt" >&2
  exit 1
fi
# The shared sampling-accuracy bound (common.sh's table is for 300 steps). At 200 steps, on the HF
# engine: `check-metrics calibrate` with grpo.sh's rules on this script's resumed runs (SEED=KILL_SEED=0-4,
# AMD EPYC, 2 cores, Nov 27; each resumed run equal to its reference within 1e-6), rate 0.01: gain
# [0.156, 0.250], mean 0.190, sd 0.036, rec 0.041: 0.02 is 4.7 sd under the mean. The other shared
# rules' healthy ranges sit inside grpo.sh's (grad norm [6.7, 49.5], clip fraction max [0.063, 0.106]).
check_run "$logs" --expect-steps "$steps" --pack grpo \
  "mean(data[\"val/sampling_accuracy\"], -1) - data[\"val/sampling_accuracy\"][\"0\"] >= ${MIN_VAL_GAIN:-0.02}"
compare_runs "$reference" "$logs/metrics.json" 1e-6
