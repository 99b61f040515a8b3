# GPU image: NVIDIA Triton with the TensorRT-LLM backend, this project, and the TensorRT-LLM example scripts.
# It builds engines (python -m builders engine --target trtllm) and serves them; engines only run on the
# TensorRT-LLM / TensorRT version and GPU architecture that built them, so build and serve with this image.
#
#   docker build -t triton-llm-stack:gpu .
#   docker run --rm --gpus all --shm-size=2g --stop-timeout 90 -p 8000-8002:8000-8002 -p 9000:9000 \
#       -v "$PWD/build/gpu/llama-fp8:/engines/llama:ro" triton-llm-stack:gpu
#
# Engines are mounted at /engines/llama by default (the build output directory: engine/, tokenizer/,
# model_repository/). To bake one into the image instead: --build-arg BAKE_ENGINE=<path in the build context>.
# Not built or run in this repository's CI (no Docker engine, no GPU there); hadolint checks this file.
FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The project's tool venv (/opt/venv: builder CLI, engine check, the serve entry point and the OpenAI front door,
# whose fastapi/uvicorn/prometheus-client come from requirements-gpu.lock too) must read the version of
# the TensorRT-LLM this image has, and the image may keep it in the system Python or in /opt/venv-tritonserver
# first on PATH (tensorrtllm_backend r26.07's Dockerfile). `python3 -m venv --system-site-packages` would see the
# first and miss the second (a venv made from a venv's python is made from the base interpreter), so
# builders/trtllm/tool_venv.sh finds the interpreter that can read tensorrt_llm's metadata, makes /opt/venv from
# it and appends exactly that interpreter's site directories to /opt/venv's path (a .pth file). /opt/venv's own
# packages stay first, so the pinned model-config protobuf never replaces what TensorRT-LLM uses; the script fails
# the build when /opt/venv cannot read the version. tests/test_trtllm_docker.py runs it in both layouts.
# The venv's packages come from requirements-gpu.lock (`make lock`): pip, tritonclient[grpc], protobuf, pydantic,
# pyyaml and their dependencies at requirements.lock's versions, resolved for the image's Python 3.12, every file
# sha256-checked, nothing resolved. What no lock can pin here: the image's own packages (TensorRT-LLM, its torch,
# TensorRT, tritonserver), which the image tag pins.
# The Triton Python stubs embed the image's own python3 (first on PATH), which ignores PYTHONPATH (isolated
# configuration, serving/stub_python.py): a .pth file in its site-packages puts the project on its sys.path.
# sshd and ssh for multi-node groups (gpu.multiGpuMode leader on a LeaderWorkerSet): the leader's mpirun starts the
# workers' ranks over ssh (builders/trtllm/multinode.py), so no pod needs Kubernetes API access. Ubuntu's packages at
# the versions of the base image's release; the image tag pins them.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client openssh-server \
    && rm -rf /var/lib/apt/lists/*

COPY requirements-gpu.lock /tmp/requirements-gpu.lock
COPY builders/trtllm/tool_venv.sh /tmp/tool_venv.sh
RUN bash /tmp/tool_venv.sh /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps --only-binary :all: \
       -r /tmp/requirements-gpu.lock \
    && /opt/venv/bin/python -c "import tritonclient.grpc, google.protobuf, pydantic, yaml" \
    && /opt/venv/bin/python -c "import fastapi, uvicorn, prometheus_client" \
    && /opt/venv/bin/python -c "import importlib.metadata as m; print('tensorrt_llm', m.version('tensorrt_llm'))" \
    && python3 -c "import site; open(site.getsitepackages()[0] + '/triton_llm_stack.pth', 'w').write('/opt/triton-llm-stack\\n')"

# TensorRT-LLM's example scripts (convert_checkpoint.py, quantize.py): the builder uses the ones the image ships
# for its own wheel (release/1.2.1 `examples/` under /app or /app/tensorrt_llm; builders/trtllm/build.py
# find_trtllm_src). TRTLLM_EXAMPLES=image (default) fails this build when the image ships none;
# TRTLLM_EXAMPLES=download fetches the two scripts from the fork commit tensorrtllm_backend r26.07 pins as its
# tensorrt_llm submodule into /opt/tensorrtllm_backend/tensorrt_llm instead (main-branch scripts: they may need
# newer tensorrt_llm modules than the wheel has); TRTLLM_EXAMPLES=none gives a serving-only image.
ARG TRTLLM_EXAMPLES=image
ARG TRTLLM_RAW=https://raw.githubusercontent.com/triton-inference-server/TensorRT-LLM
ARG TRTLLM_COMMIT=ca88df0a400515b8206a19eb30cd047eb7661035
ARG BAKE_ENGINE=builders/trtllm/engine_placeholder

ENV PROJECT_ROOT=/opt/triton-llm-stack \
    PYTHONPATH=/opt/triton-llm-stack \
    HF_HUB_OFFLINE=1 \
    HF_DATASETS_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    HF_HOME=/tmp/hf \
    HTTP_PORT=8000 \
    GRPC_PORT=8001 \
    METRICS_PORT=8002 \
    OPENAI_PORT=9000

RUN if [ "${TRTLLM_EXAMPLES}" = "download" ]; then \
      src=/opt/tensorrtllm_backend/tensorrt_llm; \
      for f in examples/models/core/llama/convert_checkpoint.py examples/quantization/quantize.py; do \
        mkdir -p "${src}/$(dirname "${f}")" \
        && python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' \
             "${TRTLLM_RAW}/${TRTLLM_COMMIT}/${f}" "${src}/${f}" || exit 1; \
      done; \
    elif [ "${TRTLLM_EXAMPLES}" != "none" ]; then \
      for root in /app /app/tensorrt_llm; do \
        [ -f "${root}/examples/models/core/llama/convert_checkpoint.py" ] \
          && [ -f "${root}/examples/quantization/quantize.py" ] && echo "example scripts: ${root}/examples" && exit 0; \
      done; \
      echo "this image ships no TensorRT-LLM example scripts under /app or /app/tensorrt_llm:" \
           "build with --build-arg TRTLLM_EXAMPLES=download (or =none for a serving-only image)" >&2; \
      exit 1; \
    fi

WORKDIR /opt/triton-llm-stack
COPY builders/ builders/
COPY serving/ serving/
COPY client/ client/
COPY model_repository/ model_repository/
COPY pyproject.toml README.md ./
COPY --chown=1000:1000 ${BAKE_ENGINE} /engines/llama/

# uid 1000 is the image's triton-server user.
USER 1000

EXPOSE 8000 8001 8002 8003 9000
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=15s --timeout=10s --start-period=600s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/generate' % os.environ.get('HEALTH_PORT', '8003'), timeout=9)"]

# The image's entrypoint execs its arguments; `builders.trtllm serve` checks every engine's manifest against
# this runtime, then runs tritonserver as the child of the CPU launcher's supervisor (serving/launcher.py), which
# serves the liveness check that generates on HEALTH_PORT (GET /health/generate, the HEALTHCHECK above) and, by
# default, the OpenAI-compatible front door (`python -m serving openai` from /opt/venv, port OPENAI_PORT). SIGTERM
# stops the front door first (new requests get 503, open streams finish), then the launcher drains Triton (new
# requests UNAVAILABLE, accepted ones finish, up to EXIT_TIMEOUT_SECS, default 30: give `docker stop` twice that plus
# a margin), then tritonserver gets SIGTERM; either process dying stops the other, exit non-zero. `--no-openai` (the
# Helm chart's Triton container; the front door is a container of its own there) leaves the front door out.
ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "/opt/venv/bin/python", "-m", "builders.trtllm", "serve"]
CMD ["--model-repository", "/engines/llama/model_repository"]
