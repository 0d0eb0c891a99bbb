#!/usr/bin/env bash
# The unit tier inside a container (hermetic: the image holds every dependency).
#   CONTAINER=posttrain:gpu [CONTAINER_ENGINE=podman] bash tests/run_unit_in_docker.sh [run_unit.sh args...]
# Arguments go to tests/run_unit.sh; the exit status is the container's. Options: tests/container_common.sh.
set -euo pipefail
# shellcheck source=tests/container_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/container_common.sh"
container_run bash tests/run_unit.sh "$@"
