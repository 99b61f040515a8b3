"""Streamed text keeps its order by design: the llm model makes the text of each response on the one thread
that answers its request, and is the ensemble's last step, so no instance after it can finish a later chunk
first (with postprocessing instances it could, on the first request after start: tensorrtllm_backend#614).

Checked where it used to break: the first requests after a fresh start, with every model given several
instances (cold ones are the slow ones), 16 streams at once, streamed == non-streamed for each.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from builders.profile import LLMStage, Stage
from client.core import SamplingParams
from client.sync import LLMClient
from tests.stack import stack_profile

PROMPTS = ["def fibonacci(n):", "import os\n", "class Node:", "日本語のテキスト", "emoji 🎉 ok", "for i in range(10):",
           "x = [", "# TODO"] * 2


@pytest.fixture(scope="module")
def cold_server(engine_dir, tiny_checkpoint, tmp_path_factory):
    """A server no request has warmed: 4 preprocessing instances and 2 llm instances (two engines)."""
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    base = stack_profile(engine_dir, tiny_checkpoint)
    profile = base.model_copy(update={"preprocessing": Stage(instances=4, batcher=base.preprocessing.batcher),
                                      "llm": LLMStage(instances=2, max_queue_size=32, cpu_threads=1)})
    work = tmp_path_factory.mktemp("order")
    repo = render_repository(profile, work / "model_repository")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=work / "tritonserver.log")
    with TritonServer(config, ready_timeout=240) as server:
        yield server


def _streamed_then_whole(url: str, prompt: str) -> tuple[str, str]:
    params = SamplingParams(max_tokens=40, temperature=0.8, top_k=50, seed=11)  # sampled: many distinct chunks
    with LLMClient(url, timeout=120) as client:
        return "".join(client.stream(prompt, params)), client.generate(prompt, params).text


def test_the_first_16_concurrent_streams_after_start_equal_their_non_streamed_twins(cold_server):
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda p: _streamed_then_whole(cold_server.urls.grpc, p), PROMPTS))
    for prompt, (streamed, whole) in zip(PROMPTS, results):
        assert whole and streamed == whole, (prompt, streamed, whole)
