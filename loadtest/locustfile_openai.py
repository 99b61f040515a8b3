"""locust user for the OpenAI front door: HTTP + Server-Sent Events against /v1/chat/completions (or
/v1/completions), TTFT from the first SSE chunk that carries content, TPOT from the usage chunk's token count.

Run it through ``python -m loadtest locust --openai chat --url localhost:9000`` (headless, bounded in time and
request count, CSV + HTML), or by hand::

    python -m locust -f loadtest/locustfile_openai.py --headless -u 4 -r 4 -t 30s --host http://localhost:9000

Each user keeps one HTTP/1.1 keep-alive connection (``requests.Session``, made cooperative by locust's gevent
patching) and has one request in flight (closed loop, no think time). Requests are streamed
(``stream: true`` with ``stream_options.include_usage``); ``--no-stream`` sends ``stream: false``.

Statistics (locust's CSV/HTML): request type ``HTTP`` = the whole request (sent -> ``data: [DONE]``); type
``TTFT`` = sent -> the first chunk whose ``delta.content`` (chat) or ``text`` (completions) is not empty; type
``TPOT`` = (last content chunk - first) / (completion tokens - 1). A non-2xx status, an SSE ``error`` event or a
stream without ``[DONE]`` is a failure. Exact percentiles go to ``--timings-out`` (JSON), as in locustfile.py.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time
from pathlib import Path

from locust import LoadTestShape, User, constant, events, task  # noqa: I001 - locust first (gevent patching)

import gevent  # noqa: E402
import locust.stats  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402

locust.stats.CSV_STATS_INTERVAL_SEC = 0.2  # see locustfile.py: the CSV must hold every request at exit

_state: dict = {"prompts": [], "started": 0, "completed": 0, "ttft": [], "tpot": [], "latency": [],
                "failures": 0, "quitting": False, "model": None}


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("openai")
    g.add_argument("--route", choices=["chat", "completions"], default="chat")
    g.add_argument("--openai-model", default="", help="the served model id (default: the first of GET /v1/models)")
    g.add_argument("--api-key", default=os.environ.get("LLM_API_KEY", "").split(",")[0])
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--no-stream", action="store_true")
    g.add_argument("--tokenizer", default=os.environ.get("LOADTEST_TOKENIZER", "build/models/smollm2"))
    g.add_argument("--max-requests", type=int, default=0, help="stop the run after this many requests")
    g.add_argument("--shape", choices=["constant", "step"], default="constant")
    g.add_argument("--shape-users", type=int, default=4, help="users (constant) / ceiling (step)")
    g.add_argument("--shape-spawn-rate", type=float, default=4.0)
    g.add_argument("--step-users", type=int, default=2)
    g.add_argument("--step-time", type=float, default=10.0)
    g.add_argument("--shape-time", type=float, default=30.0, help="seconds the shape runs")
    g.add_argument("--timings-out", default="", help="write exact TTFT/TPOT/latency percentiles here (JSON)")
    g.add_argument("--request-timeout", type=float, default=120.0)


@events.init.add_listener
def _prepare(environment, **_kw) -> None:
    from loadtest.inputs import PromptTokenizer, prompt_with_tokens

    opts = environment.parsed_options
    if opts is None:
        return
    tok = PromptTokenizer(opts.tokenizer)
    rng = random.Random(0)
    _state["prompts"] = [prompt_with_tokens(tok, opts.prompt_tokens, rng) for _ in range(16)]


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    a = np.asarray(values)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {"count": len(a), "avg": float(a.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95),
            "p99": float(p99), "max": float(a.max())}


@events.test_stop.add_listener
def _let_csv_catch_up(environment, **_kw) -> None:
    gevent.sleep(0.5)


@events.quitting.add_listener
def _write_timings(environment, **_kw) -> None:
    opts = environment.parsed_options
    if not opts or not opts.timings_out:
        return
    out = {"requests": _state["completed"], "failures": _state["failures"], "model": _state["model"],
           "ttft_ms": _percentiles(_state["ttft"]), "tpot_ms": _percentiles(_state["tpot"]),
           "latency_ms": _percentiles(_state["latency"])}
    Path(opts.timings_out).write_text(json.dumps(out, indent=1) + "\n")


class StreamError(RuntimeError):
    pass


def body(route: str, model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """The request body (what an OpenAI SDK sends; nothing the front door would refuse)."""
    b: dict = {"model": model, "max_tokens": max_tokens, "stream": stream}
    if route == "chat":
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    if stream:
        b["stream_options"] = {"include_usage": True}
    return b


def chunk_text(route: str, chunk: dict) -> str:
    """The content of one SSE chunk ("" for the role chunk, the finish chunk and the usage chunk)."""
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if route == "chat":
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


class OpenAIStreamingUser(User):
    """One keep-alive HTTP connection per user; one streamed request in flight per user."""

    wait_time = constant(0)
    _ids = itertools.count()

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.base = (self.host or "http://localhost:9000").rstrip("/")
        self.session = requests.Session()
        if opts.api_key:
            self.session.headers["Authorization"] = f"Bearer {opts.api_key}"
        if _state["model"] is None:
            model = opts.openai_model
            if not model:
                r = self.session.get(f"{self.base}/v1/models", timeout=30)
                r.raise_for_status()
                model = r.json()["data"][0]["id"]
            _state["model"] = model

    def on_stop(self) -> None:
        self.session.close()

    def _bounded(self) -> bool:
        limit = self.environment.parsed_options.max_requests
        if not limit:
            return False
        if _state["started"] >= limit:
            if _state["completed"] + _state["failures"] >= limit and not _state["quitting"]:
                _state["quitting"] = True
                self.environment.runner.quit()
            time.sleep(0.05)
            return True
        return False

    def _request(self, route: str, prompt: str, max_tokens: int, stream: bool) -> tuple[float | None, float | None,
                                                                                          int]:
        """Send one request; return (first content time, last content time, completion tokens)."""
        opts = self.environment.parsed_options
        path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
        payload = body(route, _state["model"], prompt, max_tokens, stream)
        with self.session.post(self.base + path, json=payload, stream=stream,
                               timeout=opts.request_timeout) as resp:
            if resp.status_code != 200:
                raise StreamError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            if not stream:
                data = resp.json()
                return None, None, int(data["usage"]["completion_tokens"])
            first = last = None
            tokens = 0
            done = False
            # chunk_size=None: each HTTP chunk as it arrives (no 512-byte buffering that would delay TTFT)
            for line in resp.iter_lines(chunk_size=None):
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise StreamError(f"SSE error event: {chunk['error'].get('message')}")
                if chunk_text(route, chunk):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
            if not done:
                raise StreamError("the stream ended without data: [DONE]")
            return first, last, tokens

    @task
    def generate(self) -> None:
        if self._bounded() or not _state["prompts"]:
            return
        opts = self.environment.parsed_options
        _state["started"] += 1
        prompt = _state["prompts"][next(self._ids) % len(_state["prompts"])]
        name = opts.route
        start = time.perf_counter()
        error = None
        first = last = None
        tokens = 0
        try:
            first, last, tokens = self._request(opts.route, prompt, opts.max_tokens, not opts.no_stream)
        except Exception as exc:  # noqa: BLE001 - every failure is a locust failure, not a crash
            error = exc
        end = time.perf_counter()
        fire = self.environment.events.request.fire
        total_ms = (end - start) * 1000
        if error is not None:
            _state["failures"] += 1
            fire(request_type="HTTP", name=name, response_time=total_ms, response_length=0, exception=error,
                 context={})
            return
        _state["completed"] += 1
        _state["latency"].append(total_ms)
        fire(request_type="HTTP", name=name, response_time=total_ms, response_length=tokens, exception=None,
             context={})
        if first is not None:
            ttft_ms = (first - start) * 1000
            _state["ttft"].append(ttft_ms)
            fire(request_type="TTFT", name=name, response_time=ttft_ms, response_length=0, exception=None,
                 context={})
            if tokens > 1 and last is not None and last > first:
                tpot_ms = (last - first) * 1000 / (tokens - 1)
                _state["tpot"].append(tpot_ms)
                fire(request_type="TPOT", name=name, response_time=tpot_ms, response_length=0, exception=None,
                     context={})


class BoundedShape(LoadTestShape):
    """As in locustfile.py: ``constant`` users for --shape-time seconds, or ``step`` load up to --shape-users."""

    def tick(self):
        opts = self.runner.environment.parsed_options
        t = self.get_run_time()
        if t >= opts.shape_time or _state["quitting"]:
            return None
        if opts.shape == "step":
            users = min(opts.shape_users, opts.step_users * (int(t // opts.step_time) + 1))
            return users, max(opts.shape_spawn_rate, float(opts.step_users))
        return opts.shape_users, opts.shape_spawn_rate
