#!/usr/bin/env bash
# Build the CPU image (Dockerfile.cpu) with podman, or docker where that is what the machine has. `make image`.
#
#   scripts/image_build.sh [TAG]        default TAG: triton-llm-stack:cpu
#
# Base image (BASE_IMAGE): when not given, the local Debian base of `make base-image` if it exists, else the public
# Python slim image; when that cannot be pulled (no registry reachable), the local base is built first
# (scripts/base_image.sh) and used.
# pip: the machine's own pip configuration (`pip config list`: certificate bundle, constraints, index URLs,
# find-links) is passed in at build time as a read-only volume, /run/host-pip/pip.conf, plus read-only volumes of
# the local directories it names; nothing of it lands in the image. Without one, the build uses PyPI and PyTorch's
# CPU index. Docker has no build volumes: it builds with PyPI and PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${1:-triton-llm-stack:cpu}
LOCAL_BASE=localhost/triton-llm-base:bookworm
PUBLIC_BASE=docker.io/library/python:3.11.7-slim-bookworm
ENGINE=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$ENGINE" ] || { echo "image_build.sh: neither podman nor docker is installed" >&2; exit 1; }
PYTHON=${PYTHON:-python3}

# The profile's engine: the one Dockerfile.cpu copies and the repository rendered in the image points at.
engine_dir=$(sed -n 's/^engine_dir: *//p' builders/profiles/cpu.yaml)
for need in "$engine_dir/config.json" "$engine_dir/rank0.safetensors" build/models/smollm2/tokenizer.json; do
  [ -f "$need" ] || { echo "image_build.sh: $need is missing: run 'make engine' first (make image does)" >&2; exit 1; }
done

if [ -z "${BASE_IMAGE:-}" ]; then
  if "$ENGINE" image exists "$LOCAL_BASE" 2>/dev/null; then
    BASE_IMAGE=$LOCAL_BASE
  elif "$ENGINE" image exists "$PUBLIC_BASE" 2>/dev/null || "$ENGINE" pull -q "$PUBLIC_BASE" >/dev/null 2>&1; then
    BASE_IMAGE=$PUBLIC_BASE
  else
    echo "image_build.sh: cannot pull $PUBLIC_BASE: building the local Debian base ($LOCAL_BASE) instead"
    scripts/base_image.sh "$LOCAL_BASE"
    BASE_IMAGE=$LOCAL_BASE
  fi
fi

args=(build -f Dockerfile.cpu -t "$TAG" --network host
      --build-arg "BASE_IMAGE=$BASE_IMAGE"
      --build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
      --build-arg "SOURCE=${SOURCE:-$(git remote get-url origin 2>/dev/null || echo "file://$PWD")}")

if [ "$(basename "$ENGINE")" = podman ]; then
  # Debian's podman here: crun refuses hybrid cgroups, and without explicit ulimits setrlimit is refused.
  # --format docker: the OCI image format has no HEALTHCHECK, so podman would drop the image's liveness check.
  args+=(--format docker --runtime "${OCI_RUNTIME:-runc}" --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
  pipdir=$(mktemp -d /tmp/triton-llm-pip.XXXXXX)
  trap 'rm -rf "$pipdir"' EXIT
  # The host's pip configuration as one [global] section; files it names are copied next to it, local directories
  # (find-links, file:// indexes) are mounted read-only at /run/host-pip-N and the configuration points there
  # (buildah leaves the empty mount points in the image: under /run, not beside the image's own /opt/venv).
  declare -A mounts=()
  n=0
  {
    echo "[global]"
    while IFS= read -r line; do
      key=${line%%=*}; key=${key#*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
      case $key in
        cert|client-cert|constraint|requirement)
          [ -f "$value" ] || continue
          cp "$value" "$pipdir/$key"; value=/run/host-pip/$key ;;
        find-links|index-url|extra-index-url)
          out=()
          for item in $value; do
            dir=${item#file://}
            if [ "$dir" = "$item" ] && [ "${item#/}" = "$item" ]; then out+=("$item"); continue; fi  # a URL
            # an index's pages link its files relatively (../../files/...): mount the folder above it
            top=$dir; [ "$key" = find-links ] || top=$(dirname "${dir%/}")
            [ -d "$top" ] || continue
            if [ -z "${mounts[$top]:-}" ]; then mounts[$top]=/run/host-pip-$n; n=$((n + 1)); fi
            inside=${mounts[$top]}${dir#"$top"}
            if [ "$dir" = "$item" ]; then out+=("$inside"); else out+=("file://$inside"); fi
          done
          value="${out[*]}" ;;
      esac
      echo "$key = $value"
    done < <("$PYTHON" -m pip config list 2>/dev/null | sort -t. -k2,2 -u)
  } >"$pipdir/pip.conf"
  if [ "$(wc -l <"$pipdir/pip.conf")" -gt 1 ]; then
    chmod -R a+rX "$pipdir"
    args+=(--volume "$pipdir:/run/host-pip:ro")
    for dir in "${!mounts[@]}"; do args+=(--volume "$dir:${mounts[$dir]}:ro"); done
    echo "image_build.sh: pip inside the build uses this machine's configuration: $(tail -n +2 "$pipdir/pip.conf" | cut -d' ' -f1 | tr '\n' ' ')"
  fi
fi

# IMAGE_BUILD_ARGS: more build options (e.g. --no-cache), split on spaces.
read -r -a more <<<"${IMAGE_BUILD_ARGS:-}"
args+=("${more[@]}")
echo "image_build.sh: $ENGINE ${args[*]} ."
start=$(date +%s)
"$ENGINE" "${args[@]}" .
echo "image_build.sh: $TAG built from $BASE_IMAGE in $(( $(date +%s) - start )) s"
