#!/usr/bin/env bash
# A local Debian 12 base image for Dockerfile.cpu, for machines that cannot reach an image registry (ours):
# debootstrap's minbase of bookworm plus Debian's Python 3.11 with its shared libpython (Triton's Python stub
# embeds Python through libpython3.11.so.1.0) and venv, imported into the local image store. `make base-image`
# runs it; `make image` then builds FROM it (BASE_IMAGE). Skipped when the image already exists (FORCE=1 rebuilds).
#
#   scripts/base_image.sh [IMAGE]       default IMAGE: localhost/triton-llm-base:bookworm
#
# Needs root, debootstrap and podman (or docker) and Debian's mirror (MIRROR, default http://deb.debian.org/debian).
set -euo pipefail

IMAGE=${1:-localhost/triton-llm-base:bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
ENGINE=${CONTAINER_ENGINE:-$(command -v podman || command -v docker || true)}
[ -n "$ENGINE" ] || { echo "base_image.sh: neither podman nor docker is installed" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "base_image.sh: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

if [ -z "${FORCE:-}" ] && "$ENGINE" image exists "$IMAGE" 2>/dev/null; then
  echo "base_image.sh: $IMAGE exists (FORCE=1 rebuilds it)"
  exit 0
fi

rootfs=$(mktemp -d /tmp/triton-llm-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
start=$(date +%s)
# python3.11 + libpython3.11 (the shared library the stub links), python3-venv (ensurepip for the image's venv),
# ca-certificates (TLS for pip and Python clients), tini (PID 1 of the image).
debootstrap --variant=minbase \
  --include=python3.11,libpython3.11,python3.11-venv,python3-venv,ca-certificates,tini \
  bookworm "$rootfs" "$MIRROR" >/tmp/triton-llm-base.debootstrap.log 2>&1 \
  || { tail -20 /tmp/triton-llm-base.debootstrap.log >&2; exit 1; }
# The same security updates a `apt-get upgrade` would bring are in the mirror's bookworm-security suite; keep the
# sources the image's own apt uses (Dockerfile.cpu installs nothing more from apt when tini is already present).
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
# Leftovers a base image should not carry: downloaded .debs, package lists, docs, man pages.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
  "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/* "$rootfs"/tmp/*
tar -C "$rootfs" --numeric-owner -c . | "$ENGINE" import \
  --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' - "$IMAGE" >/dev/null
echo "base_image.sh: $IMAGE built in $(( $(date +%s) - start )) s ($("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE") bytes)"
