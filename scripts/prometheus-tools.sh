#!/usr/bin/env bash
# Prometheus and promtool for the monitoring tests (tests/test_prometheus.py), never a running service:
#
#   1. `prometheus` and `promtool` on PATH (Debian's package: 2.42)           -> used as they are
#   2. build/tools/prometheus/usr/bin/{prometheus,promtool}                     -> extracted earlier (3.)
#   3. root with apt: `apt-get install -y --no-install-recommends prometheus`   (CI, a fresh Debian container)
#   4. apt without root: `apt-get download prometheus` + `dpkg-deb -x` into build/tools/prometheus
#      (the Go binaries are static; nothing is installed system-wide)
#
# Usage: scripts/prometheus-tools.sh           install what is missing, print "prometheus=PATH promtool=PATH"
#        scripts/prometheus-tools.sh --check   install nothing; exit 1 when missing
# Env:   PROMETHEUS_TOOLS_DIR=build/tools/prometheus
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${PROMETHEUS_TOOLS_DIR:-$ROOT/build/tools/prometheus}"

found() {
  local p t
  p="$(command -v prometheus || true)"; t="$(command -v promtool || true)"
  if [[ -n "$p" && -n "$t" ]]; then echo "prometheus=$p promtool=$t"; return 0; fi
  if [[ -x "$DEST/usr/bin/prometheus" && -x "$DEST/usr/bin/promtool" ]]; then
    echo "prometheus=$DEST/usr/bin/prometheus promtool=$DEST/usr/bin/promtool"; return 0
  fi
  return 1
}

found && exit 0
[[ "${1:-}" == "--check" ]] && { echo "prometheus-tools: prometheus/promtool missing" >&2; exit 1; }
command -v apt-get >/dev/null || { echo "prometheus-tools: no apt-get; install Prometheus >= 2.42 (prometheus, promtool) on PATH" >&2; exit 1; }

if [[ "$(id -u)" == 0 ]]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-cache show prometheus >/dev/null 2>&1; then apt-get update -qq; fi
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
else
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && apt-get download prometheus >/dev/null) || {
    echo "prometheus-tools: 'apt-get download prometheus' failed (no package lists? run 'apt-get update' as root, or install prometheus)" >&2; exit 1; }
  mkdir -p "$DEST"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$DEST"
fi
found || { echo "prometheus-tools: installed, but prometheus/promtool still not found" >&2; exit 1; }
