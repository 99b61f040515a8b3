#!/usr/bin/env bash
# llama.cpp for the engine benchmark: llama-cpp-python built from its sdist (CPU only, this machine's ISA),
# installed into its own venv under build/tools/llama-cpp so the project's environment stays light.
#
# Usage: bench/llama_cpp_setup.sh           build and install when missing (~4-6 min on 2 cores), print python
#        bench/llama_cpp_setup.sh --check   install nothing; exit 1 when missing
# Env:   LLAMA_CPP_VENV=build/tools/llama-cpp    where the venv goes
#        PYTHON=python3.11                       the interpreter for the venv
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LLAMA_CPP_VENV:-$ROOT/build/tools/llama-cpp}"
PIN="llama-cpp-python==0.3.36"
PY="${PYTHON:-python3}"

ok() { [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '${PIN#*==}')" 2>/dev/null; }

if ok; then
  echo "$VENV/bin/python"
  exit 0
fi
if [[ "${1:-}" == "--check" ]]; then
  echo "llama-cpp: not installed in $VENV (run bench/llama_cpp_setup.sh)" >&2
  exit 1
fi

mkdir -p "$(dirname "$VENV")"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# CPU build from source: GGML_NATIVE uses the host's AVX-512/VNNI; no BLAS, CUDA, tests, examples or server.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF -DGGML_OPENMP=ON \
 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
start=$(date +%s)
"$VENV/bin/python" -m pip install --no-binary llama-cpp-python --no-cache-dir "$PIN" >&2
echo "llama-cpp: built $PIN in $(( $(date +%s) - start )) s" >&2
ok || { echo "llama-cpp: $PIN installed but does not import" >&2; exit 1; }
echo "$VENV/bin/python"
