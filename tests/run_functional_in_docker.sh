#!/usr/bin/env bash
# A functional script inside a container (hermetic: the image holds every dependency).
#   CONTAINER=posttrain:gpu [CONTAINER_ENGINE=podman] bash tests/run_functional_in_docker.sh \
#       tests/functional/sft.sh [key.sub=value ...]
# Arguments after the script go to it; the exit status is the container's. Outputs land in
# tests/functional/<name>/ of this checkout. Options: tests/container_common.sh.
set -euo pipefail
# shellcheck source=tests/container_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/container_common.sh"
[ $# -gt 0 ] || container_die "usage: $0 tests/functional/<script>.sh [args...]"
script=$(realpath -m --relative-to="$CONTAINER_REPO" "$1")
shift
case "$script" in
  tests/functional/*.sh) ;;
  *) container_die "'$script' is not a script under tests/functional/ of this repository" ;;
esac
[ -f "$CONTAINER_REPO/$script" ] || container_die "'$script' does not exist"
container_run bash "$script" "$@"
