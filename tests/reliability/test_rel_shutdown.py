"""Section 4 — graceful shutdown: SIGTERM to the launcher (``python -m serving serve``) with 16 streams in flight.

All 16 must complete inside the exit timeout, new requests must be refused, the launcher must exit 0.
Finding 2 (Triton 2.51 ensemble bugs, docs/reliability.md) shows up here as an exit code 1 after the whole
exit timeout ("Exit timeout expired") and, when a composing model's queue overflows, as streams that never end.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from client import GenerationError, LLMClient, SamplingParams
from serving.drain import LLM_GRACE_S
from serving.launcher import free_ports
from tests.reliability import relkit

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

# Streams long enough that none can end before all 16 are at the engine. With 200 tokens (0.5 s in a batch of 8) a CI
# run on 2 cores saw 8 streams end first: its client threads, started one by one, reached the engine over as long.
# Now they connect first and send together (≤ 0.1 s here, ≤ 1.1 s with both cores taken by busy loops), and 800
# tokens take > 2 s even for a stream alone in the engine (tests/conftest.py's long_layout_repository: the tiny model
# with its whole context). The exit timeout leaves room for the slower stand-in (12 s to drain here).
STREAMS, MAX_TOKENS, EXIT_TIMEOUT = 16, 800, 60


def stream_one(url: str, i: int, results: dict, go: threading.Barrier) -> None:
    try:
        with LLMClient(url, timeout=EXIT_TIMEOUT + 10) as client:
            client.health()  # connected before the start signal, so the 16 requests leave together
            go.wait()
            started = time.monotonic()
            s = client.stream(relkit.PROMPTS[i % len(relkit.PROMPTS)], SamplingParams(max_tokens=MAX_TOKENS))
            text = "".join(s)
            results[i] = ("ok", s.completion.finish_reason, s.completion.num_output_tokens, len(text),
                          time.monotonic() - started)
    except (GenerationError, threading.BrokenBarrierError) as exc:
        results[i] = ("error", str(exc)[:200] or type(exc).__name__, 0, 0, 0.0)


@pytest.fixture
def launcher(long_layout_repository, tmp_path):
    ports = free_ports(4)  # with the OpenAI front door, as make serve and the image run it
    out = tmp_path / "launcher.out"
    proc = relkit.launch_cli(long_layout_repository, out, ports, exit_timeout_secs=EXIT_TIMEOUT)
    try:
        relkit.wait_cli_ready(proc, out)
        yield proc, out, ports
    finally:
        if proc.poll() is None:  # a failed test: the whole tree, or an orphaned tritonserver keeps the ports
            for p in relkit.process_tree(proc.pid):
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
            proc.wait()


def test_sigterm_with_16_streams_in_flight_drains_them_refuses_new_work_and_exits_0(launcher):
    proc, out, (http_port, grpc_port, metrics_port, _openai_port) = launcher
    grpc_url, http_url = f"localhost:{grpc_port}", f"http://localhost:{http_port}"
    metrics_url = f"http://localhost:{metrics_port}/metrics"
    before = relkit.snapshot(metrics_url)
    results: dict[int, tuple] = {}
    go = threading.Barrier(STREAMS, timeout=60)
    threads = [threading.Thread(target=stream_one, args=(grpc_url, i, results, go), daemon=True)
               for i in range(STREAMS)]
    for t in threads:
        t.start()

    def reached_engine() -> float:  # every request the llm has taken: in a slot, in its queue, or already ended
        s = relkit.snapshot(metrics_url)
        return s.active + s.queued + sum(s.finished.values()) - sum(before.finished.values())

    # SIGTERM only once the server holds all 16 (8 KV slots: 8 generating, the rest in the engine's queue), so
    # the drain is tested on accepted work, not on requests a client thread has not sent yet.
    relkit.wait_for(lambda: reached_engine() >= STREAMS, timeout=60, what="all 16 requests at the engine",
                    every=0.02)
    in_flight_at_sigterm = STREAMS - len(results)

    rc_holder: dict = {}
    killer = threading.Thread(target=lambda: rc_holder.update(zip(("rc", "exit_s"),
                                                                  relkit.terminate_and_wait(proc, 120))))
    killer.start()
    # The graces count from the drain's start, which follows the front door's stop: new work is refused after.
    relkit.wait_for(lambda: "draining:" in out.read_text("utf-8", "replace"), timeout=30,
                    what="the launcher's 'draining:' line", every=0.01)
    time.sleep(LLM_GRACE_S + 0.2)
    # urllib sends "Connection: close". requests keeps its connection open even after close(), and Triton 2.51
    # waits for every open HTTP connection before it stops, out of the same exit timeout (docs/reliability.md).
    req = urllib.request.Request(f"{http_url}/v2/models/ensemble/generate", method="POST",
                                 data=json.dumps({"text_input": "x", "max_tokens": 4}).encode())
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            http_new = f"HTTP {r.status}: {r.read()[:120]!r}"
    except urllib.error.HTTPError as exc:
        http_new = f"HTTP {exc.code}: {exc.read()[:120].decode(errors='replace')}"
    except (urllib.error.URLError, ConnectionError):
        http_new = "refused: connection refused"
    with LLMClient(grpc_url, timeout=10) as client:
        try:
            grpc_ready = client.health().ready
        except GenerationError as exc:
            grpc_ready = f"not ready: {str(exc)[:80]}"
        try:
            grpc_new = client.generate("def g():", SamplingParams(max_tokens=4)).finish_reason
        except GenerationError as exc:
            grpc_new = f"refused: {str(exc)[:120]}"

    for t in threads:
        t.join(EXIT_TIMEOUT + 30)
    killer.join(150)
    log = out.read_text("utf-8", "replace")
    summary = {"in_flight_at_sigterm": in_flight_at_sigterm,
               "streams": sorted(results.values(), key=lambda r: r[-1]), "http_new": http_new,
               "grpc_ready": grpc_ready, "grpc_new": grpc_new, **rc_holder,
               "in_flight_at_exit": relkit.in_flight_at_exit(log),
               "exit_timeout_expired": "Exit timeout expired" in log}
    print("\nshutdown:", summary)

    assert len(results) == STREAMS and all(r[0] == "ok" and r[1] == "length" and r[2] == MAX_TOKENS
                                           for r in results.values()), summary  # all 16 complete
    # New requests are refused: while the launcher drains, the models answer UNAVAILABLE "the server is shutting
    # down"; once tritonserver itself has SIGTERM, HTTP is closed and gRPC answers "Server exiting".
    for new in (http_new, grpc_new):
        assert new.startswith("refused") or "shutting down" in new, summary
    assert rc_holder["rc"] == 0 and rc_holder["exit_s"] < EXIT_TIMEOUT, summary  # drained, exit 0
    assert "successfully unloaded 'llm'" in log
    # Every slot generating and at least one stream waiting for a slot when SIGTERM came (MAX_TOKENS' doing).
    assert in_flight_at_sigterm > relkit.TEST_LIMITS["max_batch_size"], summary
