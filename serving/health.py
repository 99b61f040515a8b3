"""Liveness that proves the model works: one token generated through the served path, within a deadline.

Triton's ``/v2/health/live`` and ``/v2/health/ready`` stay 200 while a Python-backend stub is stopped or wedged
(ENVIRONMENT.md; docs/reliability.md, "Liveness"), so a probe of them never restarts a pod whose every request hangs.
This check sends what a client sends — a streamed request to the ``ensemble`` (preprocessing, then ``llm``, then the
engine) — asking for one token, and passes only when the final response arrives within the deadline, like
``trtllm-serve``'s ``/health_generate``.

A probe must not be starved by the load it guards, so it skips the queues we own. Its request id starts with
``PROBE_ID_PREFIX``: the ``llm`` model then takes it outside its bounded admission and its drain, caps it at one
token, and hands it to the engine as a probe — the CPU engine runs it in a KV row of its own
(cpu_engine/kv_cache.py), TensorRT-LLM's executor at the highest request priority. Before the ``llm`` it waits its
turn in Triton's first-come queues (gRPC, preprocessing's): Triton 2.51's request priorities cost its dynamic batcher
the prefetching that keeps its queues moving (docs/reliability.md, section 8, has the measurement). Those queues
stay short under an overload because preprocessing refuses, without tokenising, what the llm's full queue would
(serving/queue_full.py). So on a busy server a probe waits for the requests ahead of it to be tokenised or refused,
the engine's current step and its own, and on a stuck one it always fails.

Served by the launcher on ``--health-port`` (``GET /health/generate``: 200 or 503 with a JSON body), and as
``python -m serving health`` (exit code 0 or 1) for exec probes and the image's HEALTHCHECK.
"""

from __future__ import annotations

import argparse
import json
import queue
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROBE_ID_PREFIX = "liveness-probe-"
PROBE_PROMPT = "ok"
DEFAULT_DEADLINE_S = 5.0
HEALTH_PATH = "/health/generate"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    seconds: float
    detail: str  # the token's text, or why the probe failed


def is_probe(request_id: str) -> bool:
    return request_id.startswith(PROBE_ID_PREFIX)


def probe(grpc_url: str, deadline_s: float = DEFAULT_DEADLINE_S, model: str = "ensemble") -> ProbeResult:
    """Generate one token through ``model`` at ``grpc_url``; ok only when the request ends within ``deadline_s``.
    A probe that runs out of time is cancelled (its gRPC stream closed with cancellation)."""
    import tritonclient.grpc as grpcclient

    from client.core import SamplingParams, build_inputs, is_final

    started = time.monotonic()
    responses: queue.SimpleQueue = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(grpc_url)
    finished = False
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, build_inputs(PROBE_PROMPT, SamplingParams(max_tokens=1), stream=True),
                                  request_id=f"{PROBE_ID_PREFIX}{uuid.uuid4().hex}", enable_empty_final_response=True)
        text = b""
        while not finished:
            left = deadline_s - (time.monotonic() - started)
            try:
                result, error = responses.get(timeout=max(left, 0.0))
            except queue.Empty:
                return ProbeResult(False, time.monotonic() - started,
                                   f"no answer within {deadline_s:g} s (the model or its engine is stuck)")
            if error is not None:
                finished = True
                return ProbeResult(False, time.monotonic() - started, f"the request failed: {error}")
            out = result.as_numpy("text_output")
            if out is not None and out.size:
                text += out.reshape(-1)[0]
            finished = is_final(result)
        return ProbeResult(True, time.monotonic() - started, text.decode("utf-8", "replace"))
    except Exception as exc:  # noqa: BLE001 - anything short of the token is a failed probe, with its reason
        return ProbeResult(False, time.monotonic() - started, f"{type(exc).__name__}: {exc}")
    finally:
        client.stop_stream(cancel_requests=not finished)
        client.close()


class HealthServer:
    """``GET /health/generate`` on ``port``: one probe at a time (concurrent callers share the running probe's
    result), 200 when it passed, 503 when it failed, with the result as JSON."""

    def __init__(self, grpc_url: str, port: int, deadline_s: float = DEFAULT_DEADLINE_S, host: str = ""):
        self.grpc_url, self.deadline_s = grpc_url, deadline_s
        self._lock = threading.Lock()
        self._running: threading.Event | None = None
        self._last: ProbeResult | None = None
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != HEALTH_PATH:
                    self.send_error(404, f"only {HEALTH_PATH} is served here")
                    return
                result = health.check()
                body = json.dumps(asdict(result)).encode()
                self.send_response(200 if result.ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # a probe every few seconds must not flood the server's log
                pass

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="health", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def check(self) -> ProbeResult:
        with self._lock:
            running = self._running
            if running is None:
                running = self._running = threading.Event()
                mine = True
            else:
                mine = False
        if mine:
            try:
                self._last = probe(self.grpc_url, self.deadline_s)
            finally:
                with self._lock:
                    self._running = None
                running.set()
        else:
            running.wait()
        assert self._last is not None
        return self._last

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving health",
                                 description="Exit 0 when the server generates one token within the deadline.")
    ap.add_argument("--url", default="localhost:8001", help="Triton's gRPC address")
    ap.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S, help="seconds")
    args = ap.parse_args(argv)
    result = probe(args.url, args.deadline)
    print(f"{'ok' if result.ok else 'FAILED'} in {result.seconds:.2f} s: {result.detail}")
    return 0 if result.ok else 1
