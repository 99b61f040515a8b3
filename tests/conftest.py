"""Session fixtures: a tiny random Llama, its CPU engine, the rendered repository and a real tritonserver."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Small limits so bad-input cases (over-long prompts, too many tokens) are cheap to provoke.
TEST_LIMITS = dict(max_batch_size=8, max_input_len=192, max_seq_len=256, max_num_tokens=64)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from builders.default_model import build_random_model

    return build_random_model(tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def engine_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    from builders.cpu_build import BuildLimits, build_cpu_engine

    return build_cpu_engine(tiny_checkpoint, tmp_path_factory.mktemp("engines") / "tiny-fp32",
                            limits=BuildLimits(**TEST_LIMITS))


@pytest.fixture(scope="session")
def test_profile(engine_dir, tiny_checkpoint):
    from builders.profile import DynamicBatcher, LLMStage, ServingProfile, Stage

    batcher = DynamicBatcher(max_queue_delay_us=0, max_queue_size=128)
    return ServingProfile(name="test", engine_dir=engine_dir, tokenizer_dir=tiny_checkpoint, max_batch_size=8,
                          preprocessing=Stage(instances=1, batcher=batcher),
                          postprocessing=Stage(instances=1, batcher=None),  # see builders/profiles/cpu.yaml
                          llm=LLMStage(max_queue_size=32, cpu_threads=1))


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
