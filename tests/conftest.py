"""Session fixtures: a tiny random Llama, its CPU engine, the rendered repository and a real tritonserver."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.stack import TEST_LIMITS, stack_profile


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from builders.tiny_model import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def engine_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    from builders.cpu_build import BuildLimits, build_cpu_engine

    return build_cpu_engine(tiny_checkpoint, tmp_path_factory.mktemp("engines") / "tiny-fp32",
                            limits=BuildLimits(**TEST_LIMITS))


@pytest.fixture(scope="session")
def test_profile(engine_dir, tiny_checkpoint):
    return stack_profile(engine_dir, tiny_checkpoint)


@pytest.fixture(scope="session")
def model_repository(test_profile, tmp_path_factory) -> Path:
    from builders.repository import render_repository

    return render_repository(test_profile, tmp_path_factory.mktemp("repo") / "model_repository")


@pytest.fixture(scope="session")
def triton(model_repository, tmp_path_factory):
    """A real tritonserver on free ports, shared by the whole session."""
    from serving.launcher import ServerConfig, TritonServer

    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    config = ServerConfig(model_repository=model_repository, http_port=0, grpc_port=0, metrics_port=0,
                          exit_timeout_secs=10, log_file=log)
    with TritonServer(config, ready_timeout=240) as server:
        yield server


# ---- The real default model (SmolLM2-135M-Instruct) for the few end-to-end tests that need real answers ----
# The checkpoint is the one `make serve` uses (build/models/smollm2, converted once and cached); its fp32 engine and
# server are the session's own, with the suite's small limits.
@pytest.fixture(scope="session")
def real_checkpoint() -> Path:
    from builders.model_source import convert_source
    from builders.profile import PROJECT_ROOT

    return convert_source("smollm2", PROJECT_ROOT / "build/models/smollm2")


@pytest.fixture(scope="session")
def real_engine_dir(real_checkpoint, tmp_path_factory) -> Path:
    from builders.cpu_build import BuildLimits, build_cpu_engine

    return build_cpu_engine(real_checkpoint, tmp_path_factory.mktemp("engines") / "smollm2-fp32",
                            limits=BuildLimits(**TEST_LIMITS))


@pytest.fixture(scope="session")
def real_triton(real_engine_dir, real_checkpoint, tmp_path_factory):
    """A tritonserver serving the real model; started only when a test asks for it."""
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    repo = render_repository(stack_profile(real_engine_dir, real_checkpoint),
                             tmp_path_factory.mktemp("real-repo") / "model_repository")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=tmp_path_factory.mktemp("real-triton") / "tritonserver.log")
    with TritonServer(config, ready_timeout=300) as server:
        yield server
