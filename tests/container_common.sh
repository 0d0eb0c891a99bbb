# shellcheck shell=bash
# Shared by tests/run_unit_in_docker.sh and tests/run_functional_in_docker.sh (source it):
#   container_run <command...>   runs <command> in $CONTAINER with the repository mounted as its
#                                working directory; the container's exit status is the caller's.
# Environment:
#   CONTAINER             image to run (required)
#   CONTAINER_ENGINE      docker (default) or podman
#   CONTAINER_ENGINE_ARGS global engine options, before `run` (e.g. podman's --runtime runc)
#   CONTAINER_RUN_ARGS    extra `run` options (e.g. --pull=never --network host)
#   CI=true               never allocate a terminal (-it), as on CI runners
# Mounted: the repository at /opt/posttrain (where the image's editable install points), the
# model-hub cache (HF_HOME or ~/.cache/huggingface), posttrain's tiny-model cache
# (POSTTRAIN_CACHE or ~/.cache/posttrain) and the uv cache (UV_CACHE_DIR or ~/.cache/uv).
# GSM8K ships inside the repository (data/gsm8k), so it comes with the repository mount.
set -euo pipefail

CONTAINER_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONTAINER_WORKDIR=/opt/posttrain

container_die() { echo "$(basename "$0"): $*" >&2; exit 2; }

# GPUs present when `nvidia-smi -L` lists at least one.
container_host_has_gpus() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# Prints the engine's `run` options, one per line.
container_run_options() {
  local engine=$1
  echo --rm
  echo --workdir="$CONTAINER_WORKDIR"
  # Not root-owned leftovers: docker and rootful podman run as the caller's uid:gid; rootless
  # podman maps the caller to itself with keep-id (there the caller is already "root" otherwise).
  if [ "$engine" = podman ] && [ "$(id -u)" != 0 ]; then
    echo --userns=keep-id
  fi
  echo --user="$(id -u):$(id -g)"
  # HOME must be writable for an arbitrary uid; Ray wants more shared memory than docker's 64 MB.
  echo --env=HOME=/tmp
  echo --shm-size="${CONTAINER_SHM_SIZE:-8g}"
  # A terminal only for a person at one: never on CI, never when stdin is a pipe (docker refuses -t then).
  if [ "${CI:-}" != true ] && [ -t 0 ]; then echo -it; fi
  if container_host_has_gpus; then
    if [ "$engine" = docker ]; then echo --gpus=all; else echo --device=nvidia.com/gpu=all; fi
  fi
  local hub=${HF_HOME:-$HOME/.cache/huggingface}
  local tiny=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
  local uv=${UV_CACHE_DIR:-$HOME/.cache/uv}
  mkdir -p "$hub" "$tiny" "$uv"
  echo --volume="$CONTAINER_REPO:$CONTAINER_WORKDIR"
  echo --volume="$hub:/cache/huggingface"
  echo --volume="$tiny:/cache/posttrain"
  echo --volume="$uv:/cache/uv"
  echo --env=CI="${CI:-}"
}

container_run() {
  [ -n "${CONTAINER:-}" ] || container_die "set CONTAINER to the image to run, e.g. CONTAINER=posttrain:gpu (build: docker/Dockerfile, docs/testing.md)"
  local engine=${CONTAINER_ENGINE:-docker}
  case "$engine" in
    docker|podman) ;;
    *) container_die "CONTAINER_ENGINE='$engine' is not supported: use docker or podman" ;;
  esac
  command -v "$engine" >/dev/null 2>&1 || container_die "CONTAINER_ENGINE=$engine: '$engine' not found on PATH"
  local options engine_args run_args
  mapfile -t options < <(container_run_options "$engine")
  read -r -a engine_args <<<"${CONTAINER_ENGINE_ARGS:-}"
  read -r -a run_args <<<"${CONTAINER_RUN_ARGS:-}"
  echo "== $engine run $CONTAINER: $*" >&2
  exec "$engine" "${engine_args[@]}" run "${options[@]}" "${run_args[@]}" "$CONTAINER" "$@"
}
