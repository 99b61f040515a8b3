#!/usr/bin/env bash
# Prometheus and promtool for the monitoring tests (tests/test_prometheus.py), never a running service: Debian
# bookworm's package at a pinned version, its .deb checked against a pinned sha256 and unpacked into
# build/tools/prometheus (the Go binaries are static; nothing is installed system-wide, no root needed), so every
# machine runs the same bytes. A prometheus already on PATH is not used, for the same reason.
#
# Usage: scripts/prometheus-tools.sh           fetch what is missing, print "prometheus=PATH promtool=PATH"
#        scripts/prometheus-tools.sh --check   fetch nothing; exit 1 when missing
# Env:   PROMETHEUS_TOOLS_DIR=build/tools/prometheus
set -euo pipefail

VERSION="2.42.0+ds-5+deb12u1"
SHA256="81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${PROMETHEUS_TOOLS_DIR:-$ROOT/build/tools/prometheus}"

found() {
  [[ -x "$DEST/usr/bin/prometheus" && -x "$DEST/usr/bin/promtool" && "$(cat "$DEST/.version" 2>/dev/null)" == "$VERSION" ]] \
    && echo "prometheus=$DEST/usr/bin/prometheus promtool=$DEST/usr/bin/promtool"
}

found && exit 0
[[ "${1:-}" == "--check" ]] && { echo "prometheus-tools: prometheus $VERSION missing in $DEST" >&2; exit 1; }
command -v apt-get >/dev/null || { echo "prometheus-tools: needs apt-get (Debian) to fetch prometheus $VERSION" >&2; exit 1; }

tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"  # apt's _apt user downloads into it
download() { (cd "$tmp" && apt-get download -q "prometheus=$VERSION" >/dev/null 2>&1); }
if ! download; then
  [[ "$(id -u)" == 0 ]] || { echo "prometheus-tools: 'apt-get download prometheus=$VERSION' failed: run 'apt-get update' as root" >&2; exit 1; }
  apt-get update -qq
  download || { echo "prometheus-tools: prometheus=$VERSION is not in this machine's apt sources" >&2; exit 1; }
fi
deb=("$tmp"/prometheus_*.deb)
actual="$(sha256sum "${deb[0]}" | cut -d' ' -f1)"
[[ "$actual" == "$SHA256" ]] || { echo "prometheus-tools: ${deb[0]##*/} has sha256 $actual, expected $SHA256" >&2; exit 1; }
rm -rf "$DEST" && mkdir -p "$DEST"
dpkg-deb -x "${deb[0]}" "$DEST"
echo "$VERSION" > "$DEST/.version"
found || { echo "prometheus-tools: unpacked, but $DEST/usr/bin/{prometheus,promtool} are missing" >&2; exit 1; }
