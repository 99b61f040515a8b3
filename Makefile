# Two commands a newcomer needs: `make serve` and `make test`. Everything else is what they are made of.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
export HTTP_PORT GRPC_PORT METRICS_PORT
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

MODEL_DIR := build/models/default
ENGINE_DIR := build/engines/default-fp32
REPOSITORY := build/model_repository
PROFILE := builders/profiles/cpu.yaml

.PHONY: help venv lock model engine repository serve test helm-check clean loadtest-tools benchmark bench-engine llama-cpp

help:
	@echo "make serve   build (cached) and run tritonserver: HTTP $(HTTP_PORT), gRPC $(GRPC_PORT), metrics $(METRICS_PORT)"
	@echo "make test    the whole test suite (starts its own tritonserver on free ports)"
	@echo "make helm-check  the Helm chart, offline: lint, render, schemas, policies, goldens"
	@echo "make lock   regenerate the hash-pinned locks (requirements*.lock) from pyproject.toml and requirements-server.txt"

# ---- The environment is exactly the hash-pinned locks (README: "Dependencies and the lock") ----
# requirements.lock         every package the environment installs, transitive ones included: pyproject.toml's
#                           dependencies + dev extra, build-system.requires (setuptools) and pip, resolved together
# requirements-server.lock  nvidia-pytriton (requirements-server.txt), locked and installed WITHOUT its dependencies:
#                           its tritonclient[http] requirement pins geventhttpclient<=2.0.2, which conflicts with locust
# requirements-gpu.lock     the GPU image's tool venv (Dockerfile): GPU_LOCK_PACKAGES at requirements.lock's versions,
#                           resolved for the image's CPython 3.12
# `make lock` regenerates all three with uv. It keeps the existing pins that still fit (editing one pin in
# pyproject.toml moves only what that needs); UPGRADE=1 re-resolves everything, UPGRADE_PACKAGES="pip ..." only those.
LOCKS := requirements.lock requirements-server.lock requirements-gpu.lock
LOCK_TOOLS := pip
GPU_LOCK_PACKAGES := pip tritonclient[grpc] protobuf pydantic pyyaml
UV_VERSION := 0.13.9
UV_VENV := build/tools/uv-$(UV_VERSION)
UV := $(UV_VENV)/bin/uv
# The CPU build of torch: from a folder holding its wheel (our machines: /opt/wheels, pip's find-links), else from
# PyTorch's CPU index (uv --torch-backend cpu). PyPI's torch for Linux is the CUDA build: it must never be locked.
TORCH_WHEELS ?= /opt/wheels
LOCK_TORCH = $(if $(wildcard $(TORCH_WHEELS)/torch-*+cpu-*.whl),--find-links $(TORCH_WHEELS),--torch-backend cpu)
UV_COMPILE = $(abspath $(UV)) pip compile --quiet --generate-hashes --only-binary :all: --no-header --native-tls \
  $(if $(UPGRADE),--upgrade) $(foreach p,$(UPGRADE_PACKAGES),--upgrade-package $(p))
CPU_TARGET := --python-version 3.11 --python-platform x86_64-manylinux_2_36
GPU_TARGET := --python-version 3.12 --python-platform x86_64-manylinux_2_39
# How every lock is installed: each file's sha256 checked, nothing resolved, no source builds.
PIP_LOCKED := --require-hashes --no-deps --only-binary :all:
LOCK_INPUTS = $(foreach p,main: $(LOCK_TOOLS) gpu: $(GPU_LOCK_PACKAGES),'$(p)')

# A digest of what the locks are made from, recorded in each lock's header, so that an install can tell a lock made
# from other inputs (file times cannot: a git checkout gives every file the time of the checkout).
define LOCK_DIGEST_PY
import hashlib, json, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
server = [line.split("#")[0].strip() for line in open("requirements-server.txt")]
inputs = {"requires-python": project["project"]["requires-python"],
          "dependencies": sorted(project["project"]["dependencies"]),
          "dev": sorted(project["project"]["optional-dependencies"]["dev"]),
          "build-system": sorted(project["build-system"]["requires"]),
          "server": sorted(filter(None, server)), "lock": sys.argv[1:]}
print(hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest())
endef

# After installing: uninstall what the locks do not list (left over from an older lock), so the venv is the lock.
define LOCK_SYNC_PY
import importlib.metadata as md, re, subprocess, sys
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
locked = {norm(n) for f in sys.argv[1:] for n in re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==", open(f).read())}
names = {norm(d.metadata["Name"]) for d in md.distributions() if d.metadata["Name"]}
extra = sorted(names - locked - {"triton-llm-stack"})
if extra:
    print("uninstalling what the lock does not list:", *extra)
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *extra], check=True)
endef

define LOCK_HEADER_MAIN
# requirements.lock: every package the project's environment installs, transitive ones included, pinned with sha256
# hashes. Made by `make lock` (uv $(UV_VERSION) pip compile) from pyproject.toml: its dependencies, the dev extra and
# build-system.requires (setuptools builds the editable install, without build isolation), plus pip itself.
# Do not edit: change a pin in pyproject.toml, run `make lock`, commit both (README: "Dependencies and the lock").
#
# Installed only hash-checked, resolving nothing (Makefile, Dockerfile.cpu):
#   pip install $(PIP_LOCKED) -r requirements.lock -r requirements-server.lock
#   pip install --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
#
# torch is PyTorch's CPU build (version +cpu). PyPI's torch for Linux is the multi-GB CUDA build with nvidia-*
# packages and must never enter this file (tests/test_lock.py checks). On our machines pip finds the CPU wheel in
# /opt/wheels (pip's find-links) and `make lock` recorded that file's hash. A machine without /opt/wheels gets the
# same file from PyTorch's CPU index, and the hash check proves it is the same bytes (pip refuses any other file):
#   export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu   (then the same pip install)
# Resolved for CPython 3.11 on Linux x86_64, glibc 2.36 (Debian 12: our machines and the CPU image); each pin lists
# the hashes of all its published files, and pip installs only one whose hash is listed.
endef

define LOCK_HEADER_SERVER
# requirements-server.lock: nvidia-pytriton (requirements-server.txt: the tritonserver 2.51 binary, its Python
# backend and stubs), pinned with sha256 hashes and WITHOUT its dependencies. It is installed with --no-deps like
# every lock: we run only its binaries, and its own requirement tritonclient[http] pins geventhttpclient<=2.0.2,
# which conflicts with locust 2.47 (load tests). So `pip check` reports nvidia-pytriton's uninstalled requirements
# (importlib-metadata, sh, typing-inspect, wrapt: its Python API, which we do not use), and nothing else.
# Made by `make lock` (uv $(UV_VERSION) pip compile --no-deps); do not edit.
#   pip install $(PIP_LOCKED) -r requirements.lock -r requirements-server.lock
endef

define LOCK_HEADER_GPU
# requirements-gpu.lock: the project tools' venv in the GPU image (Dockerfile: python3 -m venv --system-site-packages
# on the TensorRT-LLM Triton image): $(GPU_LOCK_PACKAGES) and their dependencies, at
# requirements.lock's versions, resolved for the image's CPython 3.12 (Linux x86_64, glibc 2.39), sha256-pinned.
# The image's own packages (TensorRT-LLM, its torch) come with the image and are not in any lock.
# Made by `make lock` (uv $(UV_VERSION) pip compile); do not edit.
#   pip install $(PIP_LOCKED) -r requirements-gpu.lock
endef

# Only the recipes that use them see these scripts and headers in their environment.
lock: export LOCK_DIGEST_PY := $(LOCK_DIGEST_PY)
lock: export LOCK_HEADER_MAIN := $(LOCK_HEADER_MAIN)
lock: export LOCK_HEADER_SERVER := $(LOCK_HEADER_SERVER)
lock: export LOCK_HEADER_GPU := $(LOCK_HEADER_GPU)
$(VENV)/.installed: export LOCK_DIGEST_PY := $(LOCK_DIGEST_PY)
$(VENV)/.installed: export LOCK_SYNC_PY := $(LOCK_SYNC_PY)

$(UV):
	rm -rf $(UV_VENV) && $(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install --quiet uv==$(UV_VERSION)

# Resolve into build/lock (reading the committed locks' pins as preferences), then write the locks with their headers.
lock: $(UV)
	@set -euo pipefail; rm -rf build/lock && mkdir -p build/lock; \
	for lock in $(LOCKS); do if [ -f $$lock ]; then cp $$lock build/lock/; fi; done; \
	digest=$$($(PYTHON) -c "$$LOCK_DIGEST_PY" $(LOCK_INPUTS)); \
	echo "make lock: torch from $(LOCK_TORCH)"; \
	{ $(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"], sep="\n")'; \
	  printf '%s\n' $(LOCK_TOOLS); } \
	  | $(UV_COMPILE) $(CPU_TARGET) $(LOCK_TORCH) pyproject.toml --extra dev - -o build/lock/requirements.lock; \
	$(UV_COMPILE) $(CPU_TARGET) --no-deps requirements-server.txt -o build/lock/requirements-server.lock; \
	printf '%s\n' $(foreach p,$(GPU_LOCK_PACKAGES),'$(p)') \
	  | (cd build/lock && $(UV_COMPILE) $(GPU_TARGET) - -c requirements.lock -o requirements-gpu.lock); \
	{ printf '%s\n' "$$LOCK_HEADER_MAIN" "# inputs-sha256: $$digest"; cat build/lock/requirements.lock; } > requirements.lock; \
	{ printf '%s\n' "$$LOCK_HEADER_SERVER" "# inputs-sha256: $$digest"; cat build/lock/requirements-server.lock; } \
	  > requirements-server.lock; \
	{ printf '%s\n' "$$LOCK_HEADER_GPU" "# inputs-sha256: $$digest"; cat build/lock/requirements-gpu.lock; } \
	  > requirements-gpu.lock; \
	for lock in $(LOCKS); do echo "$$lock: $$(grep -c '^[A-Za-z0-9].*==' $$lock) pinned"; done

# The venv: the locks, hash-checked, then the project in place without dependencies or build isolation (setuptools
# comes from the lock; compat mode puts the project root on sys.path through a .pth, which the Triton Python stub
# relies on). A lock made from other pyproject.toml / requirements-server.txt pins is refused, never installed.
$(VENV)/.installed: requirements.lock requirements-server.lock pyproject.toml requirements-server.txt
	@want=$$($(PYTHON) -c "$$LOCK_DIGEST_PY" $(LOCK_INPUTS)) || exit 1; for lock in $(LOCKS); do \
	  grep -qsx "# inputs-sha256: $$want" $$lock || { echo "error: $$lock was not made from the current" \
	    "pyproject.toml / requirements-server.txt (pins, dev extra, build-system): run 'make lock'," \
	    "then commit the lock files with them. Stale pins are not installed." >&2; exit 1; }; done
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(PIP_LOCKED) -r requirements.lock -r requirements-server.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
	$(PY) -c "$$LOCK_SYNC_PY" requirements.lock requirements-server.lock
	touch $@

venv: $(VENV)/.installed

# The default model trains for a few minutes once; builders skips the work when a matching build exists.
$(MODEL_DIR)/model.safetensors: $(VENV)/.installed builders/default_model.py
	$(PY) -m builders model --out $(MODEL_DIR)

model: $(MODEL_DIR)/model.safetensors

$(ENGINE_DIR)/config.json: $(MODEL_DIR)/model.safetensors builders/cpu_build.py
	$(PY) -m builders engine --target cpu --checkpoint $(MODEL_DIR) --output $(ENGINE_DIR)

engine: $(ENGINE_DIR)/config.json

# Rendered every time (it takes well under a second) so it always matches the profile.
repository: $(ENGINE_DIR)/config.json
	$(PY) -m builders repository --profile $(PROFILE) --out $(REPOSITORY)

serve: repository
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

# llama-cpp-python 0.3.36 from its sdist (CPU, native ISA) into build/tools/llama-cpp: ~5-10 min, once.
llama-cpp:
	bench/llama_cpp_setup.sh

# CPU engine vs HF generate, Triton and llama.cpp on the same weights: rewrites docs/benchmarks/engine.md/.json/.png
# (~20-30 min on 2 cores; needs an idle machine). BENCH_ARGS=--quick: ~1.5 min, report in build/bench/report/.
bench-engine: $(VENV)/.installed $(MODEL_DIR)/model.safetensors
	-bench/llama_cpp_setup.sh >/dev/null
	$(PY) -m bench.engine_bench $(BENCH_ARGS)

# The Helm chart (also part of `make test`): tools into build/tools and the venv, then its tests.
helm-check: $(VENV)/.installed
	PYTHON=$(PY) bash scripts/helm-tools.sh
	$(PY) -m pytest tests/test_helm.py tests/test_helm_live.py

clean:
	rm -rf build

# ---- GPU path (plans run anywhere; builds need a GPU and the pinned TensorRT-LLM image) ----
.PHONY: gpu-plan lint-docker image-cpu image-gpu
gpu-plan: $(VENV)/.installed
	$(PY) -m builders engine --target trtllm --checkpoint $(MODEL_DIR) --output build/gpu/default-$(or $(VARIANT),fp16) \
	  --variant $(or $(VARIANT),fp16) --gpu $(or $(GPU),H100) --max-batch-size 16 --max-input-len 768 \
	  --max-seq-len 1024 --max-num-tokens 2048 --dry-run

lint-docker: $(VENV)/.installed
	$(VENV)/bin/hadolint --config .hadolint.yaml Dockerfile Dockerfile.cpu

image-cpu:
	docker build -f Dockerfile.cpu -t triton-llm-stack:cpu .

image-gpu:
	docker build -t triton-llm-stack:gpu .
