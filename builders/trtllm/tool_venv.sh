#!/usr/bin/env bash
# Create the project's tool venv (DEST) so that it reads the TensorRT-LLM version of the image it runs in,
# whichever of the two layouts the image has (the GPU Dockerfile runs this; tests/test_trtllm_docker.py runs it
# in both layouts with a stand-in tensorrt_llm distribution):
#
#   (a) tensorrt_llm in the system Python's dist-packages (TensorRT-LLM's own docker/Dockerfile.multi
#       `tritonrelease` stage: pip install into /usr/local/lib/python3.12/dist-packages);
#   (b) tensorrt_llm in a venv that is first on PATH (tensorrtllm_backend r26.07
#       dockerfile/Dockerfile.triton.trt_llm_backend: `python3.12 -m venv /opt/venv-tritonserver`,
#       ENV PATH=/opt/venv-tritonserver/bin:$PATH, then `pip3 install tensorrt_llm==1.2.1`).
#
# Why not `python3 -m venv --system-site-packages DEST`: a venv made from a venv's python is made from the
# *base* interpreter (sys._base_executable), so in layout (b) DEST sees the system site-packages but not
# /opt/venv-tritonserver's, and the tensorrt_llm metadata lookup fails ("TensorRT-LLM is not installed").
# So: find the interpreter that can read tensorrt_llm's metadata (python3 on PATH first, as the image runs it),
# create DEST from it without --system-site-packages, and append exactly that interpreter's site directories
# to DEST's sys.path with a .pth file (plain paths, nothing executed). DEST's own packages stay first, so the
# project's locked protobuf/pydantic never replace what TensorRT-LLM uses, and the same code path serves both
# layouts. The check at the end fails the image build when DEST still cannot read the version.
#
# Usage: tool_venv.sh DEST [python -m venv options, e.g. --without-pip]
# Prints the interpreter that has tensorrt_llm on stdout; TRTLLM_PYTHON=path tries that interpreter first.
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 DEST [venv options]" >&2
    exit 64
fi
dest=$1
shift
probe='import importlib.metadata as m; print(m.version("tensorrt_llm"))'

candidates=()
if [[ -n "${TRTLLM_PYTHON:-}" ]]; then candidates+=("$TRTLLM_PYTHON"); fi
if on_path=$(command -v python3); then candidates+=("$on_path"); fi
candidates+=(/opt/venv-tritonserver/bin/python3 /usr/local/bin/python3 /usr/bin/python3)

found=""
version=""
for py in "${candidates[@]}"; do
    [[ -x "$py" ]] || continue
    if version=$("$py" -c "$probe" 2>/dev/null); then
        found=$py
        break
    fi
done
if [[ -z "$found" ]]; then
    echo "tool_venv: no Python here can read tensorrt_llm's package metadata (tried: ${candidates[*]});" \
        "this image has no TensorRT-LLM" >&2
    exit 1
fi
echo "tool_venv: tensorrt_llm $version found by $found" >&2

"$found" -m venv "$@" "$dest"
site_dir=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$found" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site_dir/tensorrt_llm_image.pth"

got=$("$dest/bin/python" -c "$probe" 2>/dev/null || true)
if [[ "$got" != "$version" ]]; then
    echo "tool_venv: $dest reads tensorrt_llm version '${got}', $found reads '$version'" >&2
    exit 1
fi
echo "$found"
