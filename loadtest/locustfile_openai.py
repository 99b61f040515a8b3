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
stream without ``[DONE]`` is a failure. Exact percentiles go to ``--timings-out`` (JSON); options, bound and shape: loadtest/locust_common.py.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import time

from locust import User, constant, events, task  # noqa: I001 - locust first (gevent patching)

import requests  # noqa: E402

from loadtest.locust_common import STATE, BoundedShape, bounded, record  # noqa: E402, F401 - locust finds the shape


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("openai")
    g.add_argument("--route", choices=["chat", "completions"], default="chat")
    g.add_argument("--openai-model", default="", help="the served model id (default: the first of GET /v1/models)")
    g.add_argument("--api-key", default=os.environ.get("LLM_API_KEY", "").split(",")[0])


@events.init.add_listener
def _prepare(environment, **_kw) -> None:
    from loadtest.inputs import PromptTokenizer, prompt_with_tokens

    opts = environment.parsed_options
    if opts is None:
        return
    tok = PromptTokenizer(opts.tokenizer)
    rng = random.Random(0)
    STATE["prompts"] = [prompt_with_tokens(tok, opts.prompt_tokens, rng) for _ in range(16)]


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
        if STATE["model"] is None:
            model = opts.openai_model
            if not model:
                r = self.session.get(f"{self.base}/v1/models", timeout=30)
                r.raise_for_status()
                model = r.json()["data"][0]["id"]
            STATE["model"] = model

    def on_stop(self) -> None:
        self.session.close()

    def _request(self, route: str, prompt: str, max_tokens: int, stream: bool) -> tuple[float | None, float | None,
                                                                                          int]:
        """Send one request; return (first content time, last content time, completion tokens)."""
        opts = self.environment.parsed_options
        path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
        payload = body(route, STATE["model"], prompt, max_tokens, stream)
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
        if bounded(self.environment) or not STATE["prompts"]:
            return
        opts = self.environment.parsed_options
        STATE["started"] += 1
        prompt = STATE["prompts"][next(self._ids) % len(STATE["prompts"])]
        name = opts.route
        start = time.perf_counter()
        error = None
        first = last = None
        tokens = 0
        try:
            first, last, tokens = self._request(opts.route, prompt, opts.max_tokens, not opts.no_stream)
        except Exception as exc:  # noqa: BLE001 - every failure is a locust failure, not a crash
            error = exc
        record(self.environment, "HTTP", name, start, time.perf_counter(), first, last, tokens, error)
