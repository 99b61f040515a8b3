"""The one TensorRT-LLM release this project builds and serves with, and where each fact comes from.

Engines only run on the TensorRT-LLM + TensorRT versions (and GPU architecture) that built them, so the
builder and the server use the same container image. Sources (checked 2026-12-02, see docs/gpu.md):

- Triton's compatibility matrix (triton-inference-server/server ``docs/introduction/compatibility.md``,
  branches r26.07 and r26.08): 26.07-trtllm-python-py3 = TensorRT-LLM 1.2.1, TensorRT 10.14.1.48,
  CUDA 13.1.0.036, Python 3.12.3; it is the newest trtllm-python-py3 row (26.08 lists none newer).
- TensorRT-LLM removed the TensorRT-engine flow (``trtllm-build``, per-model ``convert_checkpoint.py``, the
  C++ ``tensorrtllm`` Triton backend) on its main branch in June/July 2026 (NVIDIA/TensorRT-LLM PRs #15763,
  #15907, #15918), after the 1.2 line; 1.2.x still ships it (``convert_checkpoint.py`` there already calls
  ``emit_engine_arch_deprecation``).
- tensorrtllm_backend branch r26.07 pins its ``tensorrt_llm`` submodule (the TensorRT-LLM source with the
  example scripts) to triton-inference-server/TensorRT-LLM commit ``ca88df0a``.
"""

from __future__ import annotations

TRITON_RELEASE = "26.07"
TRITON_IMAGE = f"nvcr.io/nvidia/tritonserver:{TRITON_RELEASE}-trtllm-python-py3"
TRTLLM_VERSION = "1.2.1"
TENSORRT_VERSION = "10.14.1.48"
CUDA_VERSION = "13.1.0.036"

#: The tensorrtllm_backend branch of this release and its ``tensorrt_llm`` submodule commit (a fork of
#: TensorRT-LLM's main branch, 2026-06: not the wheel's own source).
TRTLLM_BACKEND_BRANCH = "r26.07"
TRTLLM_SOURCE_COMMIT = "ca88df0a400515b8206a19eb30cd047eb7661035"
#: Paths inside a TensorRT-LLM source tree (tensorrtllm_backend r26.07 docs/llama.md uses the first one).
CONVERT_SCRIPT = "examples/models/core/llama/convert_checkpoint.py"
QUANTIZE_SCRIPT = "examples/quantization/quantize.py"
#: Where the image ships the example scripts of its own wheel (``<root>/examples``), tried in this order:
#: ``/app`` — tensorrtllm_backend r26.07 ``dockerfile/Dockerfile.triton.trt_llm_backend`` clones NVIDIA/TensorRT-LLM
#: ``release/1.2.1`` (TENSORRTLLM_REPO_TAG, the tag of the wheel it installs, TENSORRTLLM_VER=1.2.1) and copies its
#: ``examples`` to ``/app/examples``; ``/app/tensorrt_llm`` — TensorRT-LLM's own ``docker/Dockerfile.multi``
#: (``release`` / ``tritonrelease`` stages) copies ``examples`` to ``/app/tensorrt_llm/examples``. The Dockerfile's
#: TRTLLM_EXAMPLES=image check tries the same list.
IMAGE_TRTLLM_SRC_ROOTS = ("/app", "/app/tensorrt_llm")
#: Where ``docker build --build-arg TRTLLM_EXAMPLES=download`` puts the two scripts of TRTLLM_SOURCE_COMMIT instead
#: (for an image that ships none); tried after IMAGE_TRTLLM_SRC_ROOTS.
DEFAULT_TRTLLM_SRC = "/opt/tensorrtllm_backend/tensorrt_llm"

#: The executor's worker for orchestrator mode inside the image (``OrchestratorConfig.worker_executable_path``; the
#: C++ backend's template names the same file as its ``executor_worker_path`` parameter).
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
