#!/usr/bin/env bash
# Automatic mutation testing (mutmut 3) of the pure-Python core, module by module, and the per-module
# table: mutants, killed, survived, equivalent (justified), timeout, score. docs/testing.md,
# "Automatic mutation testing".
#
#   uv run --group test bash tests/mutation/run_auto.sh [--keep] [--children N] [MODULE ...]
#
# MODULE: a row of tests/mutation/auto_report.py's MODULES (chat, environments, probe, ops, rules, the
# harness file by file: harness_shards, ...); default: every row of its DEFAULT_ORDER, smallest first
# (those scoring >= 95%; the harness rows still under it run by name).
# mutmut's settings (what it mutates, which tests run) are pyproject.toml's [tool.mutmut]; it works
# in mutants/ (a copy of posttrain/, tests/, examples/ and docs/; git ignores it). Each mutant runs only the
# tests that called its function, one mutant at a time unless --children N (or $MUTMUT_CHILDREN).
# A fresh mutants/ each run, unless --keep: then mutmut reuses what it already has (only the
# mutated modules' sources are copied anew when they change, not the rest of posttrain/).
# Survivors mutmut could not be made to miss are justified in tests/mutation/equivalent.toml.
# Installs nothing. Exit 0: every module scores >= 95%; 1: one does not (its survivors are
# printed), or an entry of equivalent.toml matches no survivor; 2: mutmut itself failed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"

keep=0
children=${MUTMUT_CHILDREN:-1}
modules=()
while [ $# -gt 0 ]; do
  case $1 in
    --keep) keep=1 ;;
    --children) children=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) echo "run_auto.sh: unknown option $1" >&2; exit 2 ;;
    *) modules+=("$1") ;;
  esac
  shift
done

report=(python tests/mutation/auto_report.py)
# validates the module names (default: all, smallest first): `module pattern...` lines, mutmut's
# name patterns of each module's mutants
mapfile -t lines < <("${report[@]}" globs "${modules[@]}")
[ ${#lines[@]} -gt 0 ] || exit 2
modules=()
for line in "${lines[@]}"; do modules+=("${line%% *}"); done

command -v mutmut >/dev/null || { echo "run_auto.sh: mutmut not found: run it with uv run --group test" >&2; exit 2; }
[ "$keep" = 1 ] || rm -rf mutants
mkdir -p mutants
# A kept mutants/ may hold a module's files as plain copies (made before it was in only_mutate), which
# mutmut would take for mutated ones: removed, so that mutmut mutates them. Its test stats were taken
# on those copies (no test calls a mutated function there), so they go too: mutmut takes them anew.
mapfile -t plain < <("${report[@]}" unmutated "${modules[@]}")
if [ ${#plain[@]} -gt 0 ]; then
  rm -f "${plain[@]}" mutants/mutmut-stats.json
fi
# torch in each forked mutant worker: one thread, so --children N uses N cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
seconds_file=mutants/run_auto_seconds.txt
: > "$seconds_file"

for i in "${!modules[@]}"; do
  module=${modules[$i]}
  read -r -a patterns <<< "${lines[$i]#* }"
  log=mutants/run_auto_$module.log
  echo "== $module: mutmut run ${patterns[*]} (log: $log)"
  start=$(date +%s)
  if ! mutmut run --max-children "$children" "${patterns[@]}" > "$log" 2>&1; then
    tr '\r' '\n' < "$log" | tail -n 40
    echo "run_auto.sh: mutmut failed on $module (log: $log)" >&2
    exit 2
  fi
  echo "$module $(( $(date +%s) - start ))" >> "$seconds_file"
  # mutmut's last progress line: done/all and its status counts
  tr '\r' '\n' < "$log" | grep -E ' [0-9]+/[0-9]+  ' | tail -n 1 || true
done

echo
"${report[@]}" report --seconds "$seconds_file" "${modules[@]}"
