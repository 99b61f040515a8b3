"""The LLM model under Triton: cancellation, the bounded queue, metrics, the client SDK and CLI, variants."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from builders.cpu_build import BuildLimits, build_cpu_engine
from builders.profile import LLMStage, ServingProfile
from builders.repository import render_repository
from client import AsyncLLMClient, GenerationError, LLMClient, SamplingParams
from serving.launcher import ServerConfig, TritonServer
from serving.prometheus import fetch, total
from tests.triton_helpers import stream_request, text_inputs, texts, wait_for


def start_server(repo, tmp_path):
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=tmp_path / "tritonserver.log")
    server = TritonServer(config, ready_timeout=240)
    server.start()
    server.wait_ready()
    return server


def test_client_sdk_streams_what_generate_returns(triton):
    params = SamplingParams(max_tokens=40, temperature=0.7, seed=9)
    with LLMClient(triton.urls.grpc) as client:
        whole = client.generate("def fibonacci(n):", params)
        stream = client.stream("def fibonacci(n):", params)
        deltas = list(stream)
    assert "".join(deltas) == whole.text and len(deltas) > 1
    assert stream.completion.num_output_tokens == whole.num_output_tokens == 40
    assert stream.completion.finish_reason == "length"
    assert stream.completion.timings.ttft_s <= stream.completion.timings.total_s


def test_async_client_runs_requests_concurrently(triton):
    async def run():
        async with AsyncLLMClient(triton.urls.grpc) as client:
            return await asyncio.gather(*(client.generate(f"x = {i}", SamplingParams(max_tokens=16))
                                          for i in range(6)))

    completions = asyncio.run(run())
    assert all(c.num_output_tokens == 16 for c in completions)


def test_client_reports_server_errors(triton):
    with LLMClient(triton.urls.grpc) as client, pytest.raises(GenerationError, match="top_p must be in"):
        client.generate("def f():", SamplingParams(max_tokens=4, top_p=2.0))


def test_cli_streams_text_and_reports_ttft(triton):
    run = subprocess.run([sys.executable, "-m", "client", "generate", "def fibonacci(n):", "--max-tokens", "24",
                          "--stream", "--url", triton.urls.grpc], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with LLMClient(triton.urls.grpc) as client:
        assert run.stdout.rstrip("\n") == client.generate("def fibonacci(n):",
                                                          SamplingParams(max_tokens=24)).text.rstrip("\n")
    assert "TTFT" in run.stderr
    as_json = subprocess.run([sys.executable, "-m", "client", "generate", "x = 1", "--max-tokens", "8", "--json",
                              "--url", triton.urls.grpc], capture_output=True, text=True, timeout=120)
    assert json.loads(as_json.stdout)["num_output_tokens"] == 8
    bad = subprocess.run([sys.executable, "-m", "client", "generate", "", "--url", triton.urls.grpc],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "text_input is empty" in bad.stderr and "Traceback" not in bad.stderr


def test_cli_exits_quietly_when_its_reader_leaves(triton):
    """``python -m client generate … | head -c 10``: the reader is gone before the first token is written (closed
    here at once), so the CLI's first write fails; it ends the request and exits 141 like ``cat``, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "client", "generate", "def f(x):", "--max-tokens", "200",
                             "--stream", "--url", triton.urls.grpc], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141 and b"Traceback" not in stderr and b"Exception" not in stderr, stderr.decode()
    wait_for(lambda: total(fetch(triton.urls.metrics), "llm_engine_active_slots") == 0, what="slots freed")


def test_cancelled_streams_free_their_slots(triton):
    metrics = triton.urls.metrics
    before = total(fetch(metrics), "llm_requests_finished_total", reason="cancelled")
    with LLMClient(triton.urls.grpc) as client:
        for _ in range(3):
            stream = client.stream("def f(x):", SamplingParams(max_tokens=200))
            next(stream)
            stream.close()  # cancels the request mid-stream
    wait_for(lambda: total(fetch(metrics), "llm_requests_finished_total", reason="cancelled") >= before + 3,
             what="three cancelled requests")
    wait_for(lambda: total(fetch(metrics), "llm_engine_active_slots") == 0, what="slots freed")
    with LLMClient(triton.urls.grpc) as client:  # later requests are unaffected
        assert client.generate("def f(x):", SamplingParams(max_tokens=8)).num_output_tokens == 8


def test_metrics_count_requests_and_tokens(triton):
    metrics = triton.urls.metrics
    before = fetch(metrics)
    expected_prompt = expected_output = 0
    with LLMClient(triton.urls.grpc) as client:
        for i in range(4):
            done = client.generate(f"print({i})", SamplingParams(max_tokens=5 + i))
            expected_prompt += done.num_input_tokens
            expected_output += done.num_output_tokens
    after = fetch(metrics)

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("llm_prompt_tokens_total") == expected_prompt
    assert delta("llm_generation_tokens_total") == expected_output == 5 + 6 + 7 + 8
    assert delta("llm_time_to_first_token_seconds_count") == 4
    assert delta("llm_e2e_request_latency_seconds_count") == 4
    assert delta("llm_time_per_output_token_seconds_count") == 4
    assert total(after, "llm_engine_queued_requests") == 0
    assert total(after, "llm_engine_kv_cache_occupancy") == 0


def test_full_queue_rejects_at_once_with_unavailable(test_profile, engine_dir, tiny_checkpoint, tmp_path):
    small = build_cpu_engine(tiny_checkpoint, tmp_path / "one-slot",
                             limits=BuildLimits(max_batch_size=1, max_input_len=64, max_seq_len=256, max_num_tokens=16))
    profile = test_profile.model_copy(update={"engine_dir": small, "llm": LLMStage(max_queue_size=1, cpu_threads=1)})
    server = start_server(render_repository(profile, tmp_path / "repo"), tmp_path)
    try:
        async def flood():
            async with AsyncLLMClient(server.urls.grpc) as client:
                async def one():
                    started = time.perf_counter()
                    try:
                        await client.generate("def f():", SamplingParams(max_tokens=200))
                        return "ok", time.perf_counter() - started
                    except GenerationError as exc:
                        return str(exc), time.perf_counter() - started
                return await asyncio.gather(*(one() for _ in range(8)))

        results = asyncio.run(flood())
        rejected = [(msg, t) for msg, t in results if "queue is full" in msg]
        assert sum(msg == "ok" for msg, _ in results) >= 2  # one in the slot, one queued
        assert len(rejected) >= 4, results
        assert all(msg == "ok" or "queue is full" in msg for msg, _ in results), results
        assert min(t for _, t in rejected) < 1.0  # rejected at once, not after waiting for a slot
    finally:
        server.stop()


@pytest.mark.parametrize("variant", ["int8_wo", "int8_sq", "fp8"])
def test_quantised_variant_serves_through_the_ensemble(variant, test_profile, tiny_checkpoint, tmp_path):
    engine = build_cpu_engine(tiny_checkpoint, tmp_path / variant, variant=variant, calib_samples=8,
                              limits=BuildLimits(max_batch_size=4, max_input_len=192, max_seq_len=256,
                                                 max_num_tokens=64))
    profile: ServingProfile = test_profile.model_copy(update={"engine_dir": engine})
    server = start_server(render_repository(profile, tmp_path / "repo"), tmp_path)
    try:
        whole, error = stream_request(server.urls.grpc, "ensemble", text_inputs("def f(x):", 16))
        assert error is None, error
        chunks, error = stream_request(server.urls.grpc, "ensemble", text_inputs("def f(x):", 16, stream=True))
        assert error is None, error
        assert b"".join(texts(chunks)) == texts(whole)[0]
        assert int(whole[0]["num_output_tokens"].reshape(-1)[0]) == 16
    finally:
        server.stop()
