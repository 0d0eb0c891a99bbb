#!/usr/bin/env bash
# Picks the CI level (docs/testing.md "CI levels"): prints L0, L1 or L2.
#   bash .github/ci_level.sh <event name> <PR labels as JSON> [workflow_dispatch level]
# push (to main) -> L1; workflow_dispatch -> the level asked for; pull_request -> the highest
# CI:L<n> label; no label -> L0. Anything else is an error (exit 2), never a silent L0.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: ci_level.sh <event> <labels json> [dispatch level]" >&2; exit 2; }
event=$1 labels=$2 asked=${3:-}
case "$event" in
  push) echo L1 ;;
  workflow_dispatch)
    case "$asked" in
      L0|L1|L2) echo "$asked" ;;
      *) echo "ci_level.sh: workflow_dispatch level '$asked' is not L0, L1 or L2" >&2; exit 2 ;;
    esac ;;
  pull_request)
    level=L0
    for l in L1 L2; do
      if [[ "$labels" == *"\"CI:$l\""* ]]; then level=$l; fi
    done
    echo "$level" ;;
  *) echo "ci_level.sh: event '$event' has no CI level" >&2; exit 2 ;;
esac
