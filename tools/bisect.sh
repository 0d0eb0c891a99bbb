#!/usr/bin/env bash
# Find the commit that turned a check red: git bisect run on posttrain's verdicts (issue 36).
#   tools/bisect.sh [--repeat N] [--timeout S] [--setup CMD] [--report PATH] [--log-dir DIR] \
#       GOOD BAD -- COMMAND [ARG ...]
#   tools/bisect.sh --help
# The code, its exit-code contract and --repeat policy: posttrain/testing/git_bisect.py (standard
# library only: any python3 >= 3.11 runs it without the project's environment; PYTHON=... picks the
# interpreter). docs/testing.md, "Bisecting a red nightly".
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec "${PYTHON:-python3}" -I "$here/../posttrain/testing/git_bisect.py" "$@"
