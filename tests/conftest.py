"""Session fixtures: a tiny random Llama, its CPU engine, the rendered repository and a real tritonserver.

``triton`` and ``layout_repository`` follow ``layout``, one of the two layouts (tests/stack.py LAYOUTS): the CPU
one, and the GPU one with the ``tensorrt_llm`` stand-in over the same CPU engine. A module marked ``both_layouts``
runs its tests against each (one session server per layout); every other test gets the CPU layout only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests.stack import LAYOUTS, TEST_LIMITS, render_layout, stack_profile


def pytest_configure(config):
    config.addinivalue_line("markers", "both_layouts: run the module's `triton` tests against every layout "
                                       "(tests/stack.py LAYOUTS), not only the CPU one")


def pytest_generate_tests(metafunc):
    """Which layouts a test runs against (``triton``, ``layout_repository``): every one in a module marked
    ``both_layouts``, the CPU one elsewhere."""
    if "layout" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_layouts") is not None
        metafunc.parametrize("layout", LAYOUTS if both else ("cpu",), indirect=True, scope="session")


@pytest.fixture(scope="session")
def layout(request) -> str:
    """One of tests/stack.py LAYOUTS (parametrised by pytest_generate_tests above)."""
    return request.param


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
def int4_engine(tiny_checkpoint, tmp_path_factory) -> Path:
    """The default variant's kind of engine (int4 weights, bf16 compute, int8 head), compiled step included."""
    from builders.cpu_build import BuildLimits, build_cpu_engine

    return build_cpu_engine(tiny_checkpoint, tmp_path_factory.mktemp("compiled") / "int4_awq", variant="int4_awq",
                            limits=BuildLimits(max_batch_size=4, max_input_len=192, max_seq_len=256, max_num_tokens=64),
                            calib_samples=4, compile_step=True)


@pytest.fixture(scope="session")
def test_profile(engine_dir, tiny_checkpoint):
    return stack_profile(engine_dir, tiny_checkpoint)


@pytest.fixture(scope="session")
def model_repository(test_profile, tmp_path_factory) -> Path:
    from builders.repository import render_repository

    return render_repository(test_profile, tmp_path_factory.mktemp("repo") / "model_repository")


@pytest.fixture(scope="session")
def layout_repository(layout, test_profile, model_repository, tmp_path_factory) -> Path:
    """The session repository in ``layout``: the CPU one is ``model_repository``."""
    if layout == "cpu":
        return model_repository
    return render_layout(layout, test_profile, tmp_path_factory.mktemp(f"repo-{layout}") / "model_repository")


@pytest.fixture(scope="session")
def triton(layout, layout_repository, tmp_path_factory):
    """A real tritonserver on free ports, one per layout, shared by the whole session; ``.layout`` says which."""
    yield from _serve(layout, layout_repository, tmp_path_factory.mktemp(f"triton-{layout}"))


# The tiny model's whole context (the suite's engines have 256 positions, where 240 tokens take ~0.1 s): streams of
# 800 tokens last seconds, far longer than a hang-up, a stop or a signal takes to reach the engine on any machine.
# The tests of cancellation and drain run on it, so that no stream can end on its own before what they test arrives.
LONG_SEQ_LEN = 1024


@pytest.fixture(scope="session")
def long_engine_dir(tiny_checkpoint, tmp_path_factory) -> Path:
    from tests.reliability.relkit import build_engine

    return build_engine(tiny_checkpoint, tmp_path_factory.mktemp("engines") / "tiny-fp32-long",
                        max_seq_len=LONG_SEQ_LEN, max_input_len=LONG_SEQ_LEN - 256)


@pytest.fixture(scope="session")
def long_layout_repository(layout, long_engine_dir, tiny_checkpoint, tmp_path_factory) -> Path:
    """``layout_repository`` over ``long_engine_dir``."""
    return render_layout(layout, stack_profile(long_engine_dir, tiny_checkpoint),
                         tmp_path_factory.mktemp(f"long-repo-{layout}") / "model_repository")


@pytest.fixture(scope="session")
def long_triton(layout, long_layout_repository, tmp_path_factory):
    """``triton`` over ``long_layout_repository``."""
    yield from _serve(layout, long_layout_repository, tmp_path_factory.mktemp(f"long-triton-{layout}"))


def _serve(layout: str, repository: Path, log_dir: Path):
    from serving.launcher import ServerConfig, TritonServer

    config = ServerConfig(model_repository=repository, http_port=0, grpc_port=0, metrics_port=0,
                          exit_timeout_secs=10, log_file=log_dir / "tritonserver.log")
    with TritonServer(config, ready_timeout=240) as server:
        server.layout = layout
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

    # With its compiled decode step, as `make serve` builds it: the real-model tests run what production runs.
    return build_cpu_engine(real_checkpoint, tmp_path_factory.mktemp("engines") / "smollm2-fp32",
                            limits=BuildLimits(**TEST_LIMITS), compile_step=True)


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


@pytest.fixture(scope="module")
def front(triton):
    """The OpenAI front door over the module's server (tests/openai_front.py), stopped cleanly at the end."""
    from tests.openai_front import FrontDoorProcess

    door = FrontDoorProcess(triton.urls.grpc)
    yield door
    assert door.stop() == 0, "".join(door.output)


@pytest.fixture(scope="module")
def sdk(front):
    """The official openai SDK pointed at ``front``."""
    import openai

    with openai.OpenAI(base_url=front.v1, api_key="unused", max_retries=0) as client:
        yield client
