#!/usr/bin/env bash
# llama.cpp, the independent oracle (tests/test_model_source.py runs the original GGUF on it) and the engine
# benchmark's peer: llama-cpp-python built from its sdist (CPU only, this machine's ISA), installed into its own venv
# under build/tools/llama-cpp so the project's environment stays light.
#
# Hash-pinned like the project's venv: requirements-llama-cpp.lock pins every file that goes in (the sdist, its
# runtime dependencies, the build backend scikit-build-core and its dependencies, pip), and pip installs with
# --require-hashes. The sdist is built WITHOUT build isolation, because pip cannot hash-check what an isolated build
# environment downloads; the backend comes from the lock instead. cmake, ninja and a C/C++ compiler are the
# system's (Debian 12: cmake 3.25, ninja 1.11, gcc 12), as the unpinned build used them too.
#
# llama.cpp's own HTTP server (continuous batching over --parallel slots, the aggregate-throughput peer) is built
# with --server from the llama.cpp sources vendored in that same locked sdist (vendor/llama.cpp), so both peers run
# the same llama.cpp.
#
# Usage: bench/llama_cpp_setup.sh           install when missing or made from another lock (~4-6 min on 2 cores
#                                           the first time; pip's wheel cache makes a rebuild of the same sdist quick),
#                                           then print the venv's python
#        bench/llama_cpp_setup.sh --check   install nothing; exit 1 when missing or stale
#        bench/llama_cpp_setup.sh --server  build llama-server when missing or made from another sdist or flags
#                                           (~5 min on 2 cores), then print the binary's path
#        bench/llama_cpp_setup.sh --lock    rewrite requirements-llama-cpp.lock (uv, as `make lock` uses it)
# Env:   LLAMA_CPP_VENV=build/tools/llama-cpp       where the venv goes
#        LLAMA_SERVER_DIR=build/tools/llama-server  where llama-server goes (bin/llama-server)
#        PYTHON=python3                             the interpreter for the venv (3.11, as the lock is resolved for)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLAMA_CPP_VENV:-$ROOT/build/tools/llama-cpp}"
LOCK="$ROOT/requirements-llama-cpp.lock"
VERSION="0.3.36"
PY="${PYTHON:-python3}"
STAMP="$VENV/.installed-from-lock"  # the sha256 of the lock this venv was installed from

lock_sha() { sha256sum "$LOCK" | cut -d' ' -f1; }
ok() {
  [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$(lock_sha)" ]] &&
    "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')" 2>/dev/null
}

if [[ "${1:-}" == "--lock" ]]; then
  # The input is these three lines; the pins already in the lock are uv's preferences (only what must, moves).
  UV="$(cd "$ROOT" && "$PY" -c 'import sys; sys.path.insert(0, "scripts"); import lock; print(lock.ensure_uv())')"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  [[ -f "$LOCK" ]] && cp "$LOCK" "$work/out.lock"
  printf '%s\n' "llama-cpp-python==$VERSION" "scikit-build-core" "pip" |
    "$UV" pip compile --quiet --generate-hashes --no-header --native-tls --python-version 3.11 \
      --python-platform x86_64-manylinux_2_36 --no-binary llama-cpp-python - -o "$work/out.lock"
  { cat <<EOF
# requirements-llama-cpp.lock: the llama.cpp venv (build/tools/llama-cpp, made by bench/llama_cpp_setup.sh), every
# file pinned with its sha256: llama-cpp-python's sdist (built here, CPU, native ISA), its dependencies, its build
# backend (installed first; the sdist is built without build isolation so nothing unpinned enters) and pip.
# Made by \`bench/llama_cpp_setup.sh --lock\` (uv pip compile, CPython 3.11, Linux x86_64 glibc 2.36); do not edit.
EOF
    cat "$work/out.lock"; } > "$LOCK"
  echo "$LOCK: $(grep -c '^[a-z0-9]' "$LOCK") pinned"
  exit 0
fi

need_build_tools() {
  for tool in cmake ninja cc c++; do
    command -v "$tool" >/dev/null || { echo "llama-cpp: building llama.cpp needs $tool on PATH" >&2; exit 1; }
  done
}
# Everything in the lock but the sdist (pip, the build backend, the runtime dependencies), each file hash-checked and
# reinstalled, so a venv left by an older install holds exactly the locked bytes afterwards.
install_deps() {
  mkdir -p "$(dirname "$VENV")"
  test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
  local deps
  deps="$(mktemp)"
  awk '/^[A-Za-z0-9]/ { skip = ($0 ~ /^llama-cpp-python==/) } !skip' "$LOCK" > "$deps"
  "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps --only-binary :all: --force-reinstall \
    -r "$deps" >&2
  rm -f "$deps"
}

if [[ "${1:-}" == "--server" ]]; then
  SERVER_DIR="${LLAMA_SERVER_DIR:-$ROOT/build/tools/llama-server}"
  BIN="$SERVER_DIR/bin/llama-server"
  SERVER_STAMP="$SERVER_DIR/.built-from"  # the sdist's sha256 and the cmake flags the binary was built with
  sdist_sha="$(awk '/^llama-cpp-python==/ { p = 1 } p && /--hash=sha256:/ { sub(/.*--hash=sha256:/, ""); print; exit }' "$LOCK")"
  # CPU only, this machine's ISA and OpenMP as the Python build; static, so the one binary is all that is kept.
  # No web UI (its assets would be fetched from Hugging Face at build time) and no HTTPS (OpenSSL): the benchmark
  # talks plain HTTP on 127.0.0.1. LLAMA_CURL is gone from this llama.cpp (ignored); OFF says what is meant.
  cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON -DGGML_CUDA=OFF
    -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
  want="$sdist_sha ${cmake_args[*]}"
  if [[ -x "$BIN" && -f "$SERVER_STAMP" && "$(cat "$SERVER_STAMP")" == "$want" ]]; then
    echo "$BIN"
    exit 0
  fi
  need_build_tools
  # pip fetches the sdist: hash-checked (--require-hashes) and, to read its metadata, run through the locked build
  # backend of the llama-cpp venv (no build isolation, as for the install), so that venv must hold the lock's tools.
  ok || install_deps
  start=$(date +%s)
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  # The lock's llama-cpp-python entry: its line and the --hash continuation lines after it.
  awk '/^llama-cpp-python==/ { p = 1 } p { print } p && !/\\$/ { exit }' "$LOCK" > "$work/requirements.txt"
  "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation --require-hashes \
    -r "$work/requirements.txt" -d "$work" >&2
  sdist="$work/llama_cpp_python-$VERSION.tar.gz"
  # pip checked it already; checked here too, so what gets built is provably the lock's file.
  echo "$sdist_sha  $sdist" | sha256sum --check --quiet - >&2
  mkdir "$work/src"
  tar -xzf "$sdist" -C "$work/src" --strip-components=1
  cmake -S "$work/src/vendor/llama.cpp" -B "$work/build" "${cmake_args[@]}" >&2
  cmake --build "$work/build" --target llama-server --parallel "$(nproc)" >&2
  rm -f "$SERVER_STAMP"
  install -D -m 755 "$work/build/bin/llama-server" "$BIN"
  echo "$want" > "$SERVER_STAMP"
  echo "llama-server: built from llama-cpp-python $VERSION's sdist in $(( $(date +%s) - start )) s" >&2
  echo "$BIN"
  exit 0
fi

if ok; then
  echo "$VENV/bin/python"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "llama-cpp: not installed in $VENV from $(basename "$LOCK") (run bench/llama_cpp_setup.sh)" >&2
  exit 1
fi
need_build_tools
rm -f "$STAMP"
start=$(date +%s)
install_deps
# Then the sdist, checked against its locked hash and built with the locked backend. An installed llama-cpp-python
# of the locked version is kept: PyPI never replaces a released file, so it was built from these same bytes.
# CPU build: GGML_NATIVE uses the host's AVX-512/VNNI; no BLAS, CUDA, tests, examples or server.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"$VENV/bin/python" -m pip install --require-hashes --no-deps --no-build-isolation --no-binary llama-cpp-python \
  -r "$LOCK" >&2
"$VENV/bin/python" -m pip check >&2
ok_import() { "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$VERSION')"; }
ok_import || { echo "llama-cpp: llama-cpp-python $VERSION installed but does not import" >&2; exit 1; }
lock_sha > "$STAMP"
echo "llama-cpp: installed from $(basename "$LOCK") in $(( $(date +%s) - start )) s" >&2
echo "$VENV/bin/python"
