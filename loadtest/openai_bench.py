"""``python -m loadtest openai-bench``: the OpenAI front door against direct gRPC streaming, side by side in one run.

Issue 14's measurement: against direct gRPC streaming to the ensemble (the project's asyncio client,
``client.AsyncLLMClient`` — the same client the front door itself uses), the front door's

* TTFT P50 overhead at 1 stream (goal ≤ 1 ms), for ``/v1/completions`` (prompt -> ``text_input``, compared with
  ``client.stream``) and ``/v1/chat/completions`` (messages -> ``messages``, compared with ``client.stream_chat``);
* throughput at 16 streams (goal ≥ 0.95× of direct gRPC), output tokens/s on the chat route.

Both paths run against the same Triton server in the same process, alternating so that drift (other jobs on the
machine, a warming cache) hits both: at 1 stream request by request (each pair in alternating order, same
prompt, same parameters), at 16 streams in rounds of one phase per path (ABBA order). TTFT is measured the same
way on both paths: from just before the request is written to the first piece of text (gRPC: the first
non-empty text delta; HTTP: the first SSE chunk whose content is not empty). The HTTP client is a minimal
asyncio HTTP/1.1 client (one keep-alive connection per stream, chunked transfer decoding, SSE framing), so the
client's own cost is close to the gRPC client's. Throughput counts the output tokens of every request in a
fixed window, spreading each request's tokens evenly between its first and last token (closed loop, 16
requests always in flight, a warm-up before the window).

The breakdown of the 1-stream overhead comes from the front door's own ``openai_time_to_first_token_seconds``
histogram (request received -> first body byte, inside the process): client TTFT over HTTP minus that is the
HTTP/ASGI edge (connection, parsing, writing); that minus the direct gRPC TTFT is the front door's handler
(validation, the extra gRPC hop, task hand-offs). ``--profile-front-door`` then restarts the front door under
cProfile for a separate, unmeasured pass and keeps its hottest functions.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .spec import DEFAULT_TOKENIZER, PROJECT_ROOT
from .sweep import RESULTS_DIR, git_describe, loadavg

OUT_DIR = RESULTS_DIR / "openai-bench"
TTFT_OVERHEAD_GOAL_MS = 1.0
THROUGHPUT_RATIO_GOAL = 0.95


@dataclass
class OpenAIBenchOptions:
    grpc_url: str  # Triton gRPC host:port
    front_url: str  # the front door, http://host:port
    tokenizer: Path = DEFAULT_TOKENIZER
    model_id: str | None = None  # served id (default: GET /v1/models)
    ttft_pairs: int = 80  # per route, 1 stream
    ttft_prompt_tokens: int = 16
    ttft_max_tokens: int = 2
    streams: int = 16
    rounds: int = 4  # each round: one phase per path (ABBA over rounds); 2 could not settle 5% on 2 busy cores
    warmup_s: float = 6.0
    window_s: float = 15.0
    prompt_tokens: int = 64
    max_tokens: int = 32
    out_dir: Path = OUT_DIR
    front_metrics: bool = True


# ---------------------------------------------------------------------------------------------- HTTP client


class HTTPStream:
    """A minimal asyncio HTTP/1.1 client for one keep-alive connection: POST a JSON body, read SSE events as the
    chunks arrive. No library in between, so its cost is comparable to the gRPC client's."""

    def __init__(self, url: str, api_key: str = ""):
        rest = url.removeprefix("http://").rstrip("/")
        host, _, port = rest.partition(":")
        self.host, self.port = host, int(port or 80)
        self.api_key = api_key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = None

    async def post_sse(self, path: str, body: dict):
        """Yield (perf_counter time, parsed JSON event) for each ``data:`` event until ``[DONE]``."""
        if self.writer is None or self.writer.is_closing():
            await self._connect()
        payload = json.dumps(body).encode()
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Accept: text/event-stream\r\n{auth}Content-Length: {len(payload)}\r\n\r\n").encode()
        self.writer.write(head + payload)
        reader = self.reader
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if status != 200:
            n = int(headers.get("content-length", 0))
            text = await reader.readexactly(n) if n else b""
            raise RuntimeError(f"HTTP {status}: {text[:300]!r}")
        if headers.get("transfer-encoding") != "chunked":
            raise RuntimeError(f"expected a chunked SSE response, got headers {headers}")
        buf = b""
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()  # the empty trailer line
                if headers.get("connection") == "close":
                    await self.close()
                return
            data = await reader.readexactly(size + 2)
            now = time.perf_counter()
            buf += data[:-2]
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if event.startswith(b"data: "):
                    raw = event[6:]
                    if raw == b"[DONE]":
                        continue
                    yield now, json.loads(raw)


# ---------------------------------------------------------------------------------------------- one request


@dataclass
class Sample:
    path: str  # grpc | http
    route: str  # chat | completions
    start: float
    first: float | None
    end: float
    tokens: int

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first is None else (self.first - self.start) * 1000


async def grpc_request(client, route: str, prompt: str, max_tokens: int) -> Sample:
    from client.core import SamplingParams

    params = SamplingParams(max_tokens=max_tokens)
    stream = (client.stream_chat([{"role": "user", "content": prompt}], params) if route == "chat"
              else client.stream(prompt, params))
    start = time.perf_counter()
    first = None
    async for delta in stream:
        if delta and first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    c = stream.completion
    return Sample("grpc", route, start, first, end, int(c.num_output_tokens) if c else 0)


async def http_request(conn: HTTPStream, model: str, route: str, prompt: str, max_tokens: int) -> Sample:
    body: dict = {"model": model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = prompt
        path = "/v1/completions"
    start = time.perf_counter()
    first = None
    tokens = 0
    async for at, chunk in conn.post_sse(path, body):
        if "error" in chunk:
            raise RuntimeError(f"SSE error: {chunk['error']}")
        choices = chunk.get("choices") or []
        if choices and first is None:
            text = (choices[0].get("delta") or {}).get("content") if route == "chat" else choices[0].get("text")
            if text:
                first = at
        if chunk.get("usage"):
            tokens = int(chunk["usage"]["completion_tokens"])
    return Sample("http", route, start, first, time.perf_counter(), tokens)


# ---------------------------------------------------------------------------------------------- front door metrics


def _ttft_hist(url: str) -> dict[str, tuple[float, float]]:
    """route -> (sum seconds, count) of the front door's own TTFT histogram."""
    from serving.prometheus import scrape

    out: dict[str, list[float]] = {}
    for (name, labels), v in scrape(url.rstrip("/") + "/metrics").items():
        route = dict(labels).get("route", "")
        if name == "openai_time_to_first_token_seconds_sum":
            out.setdefault(route, [0.0, 0.0])[0] += v
        elif name == "openai_time_to_first_token_seconds_count":
            out.setdefault(route, [0.0, 0.0])[1] += v
    return {k: (s, c) for k, (s, c) in out.items()}


def _route_key(hist: dict, route: str) -> str | None:
    want = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    return want if want in hist else next((k for k in hist if k.endswith(want.rsplit("/", 1)[-1])), None)


# ---------------------------------------------------------------------------------------------- phases


def _stats(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"count": len(a), "mean": float(a.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


async def ttft_pairs(opts: OpenAIBenchOptions, client, conn: HTTPStream, model: str, prompts: list[str],
                     route: str) -> dict:
    """1 stream: ``ttft_pairs`` pairs (gRPC, HTTP) in alternating order, same prompt within a pair."""
    before = _ttft_hist(opts.front_url) if opts.front_metrics else {}
    samples: list[tuple[Sample, Sample]] = []
    for i in range(opts.ttft_pairs):
        prompt = prompts[i % len(prompts)]
        async def g():
            return await grpc_request(client, route, prompt, opts.ttft_max_tokens)

        async def h():
            return await http_request(conn, model, route, prompt, opts.ttft_max_tokens)

        if i % 2 == 0:
            a = await g()
            b = await h()
        else:
            b = await h()
            a = await g()
        samples.append((a, b))
    after = _ttft_hist(opts.front_url) if opts.front_metrics else {}
    grpc_ttft = [a.ttft_ms for a, _ in samples if a.ttft_ms is not None]
    http_ttft = [b.ttft_ms for _, b in samples if b.ttft_ms is not None]
    diffs = [b.ttft_ms - a.ttft_ms for a, b in samples if a.ttft_ms is not None and b.ttft_ms is not None]
    out = {"route": route, "pairs": len(samples), "grpc_ttft_ms": _stats(grpc_ttft), "http_ttft_ms": _stats(http_ttft),
           "paired_diff_ms": _stats(diffs),
           "overhead_p50_ms": (float(np.median(http_ttft)) - float(np.median(grpc_ttft))) if diffs else None,
           "grpc_latency_ms": _stats([(a.end - a.start) * 1000 for a, _ in samples]),
           "http_latency_ms": _stats([(b.end - b.start) * 1000 for _, b in samples])}
    key = _route_key(after, route)
    if key:
        s0, c0 = before.get(key, (0.0, 0.0))
        s1, c1 = after[key]
        if c1 > c0:
            out["front_door_ttft_mean_ms"] = (s1 - s0) / (c1 - c0) * 1000
    return out


def _window_share(t0: float, t1: float, w0: float, w1: float) -> float:
    if t1 <= t0:
        return 1.0 if w0 <= t1 <= w1 else 0.0
    return max(0.0, min(t1, w1) - max(t0, w0)) / (t1 - t0)


async def throughput_phase(opts: OpenAIBenchOptions, path: str, client, model: str, prompts: list[str],
                           route: str = "chat") -> dict:
    """``streams`` closed-loop workers for warm-up + window seconds; tokens and requests inside the window."""
    t0 = time.perf_counter()
    w0, w1 = t0 + opts.warmup_s, t0 + opts.warmup_s + opts.window_s
    samples: list[Sample] = []
    errors: list[str] = []

    async def worker(w: int) -> None:
        conn = HTTPStream(opts.front_url) if path == "http" else None
        i = w
        try:
            while time.perf_counter() < w1:
                prompt = prompts[i % len(prompts)]
                i += opts.streams
                try:
                    if conn is not None:
                        s = await http_request(conn, model, route, prompt, opts.max_tokens)
                    else:
                        s = await grpc_request(client, route, prompt, opts.max_tokens)
                    samples.append(s)
                except Exception as exc:  # noqa: BLE001 - counted and reported, the phase goes on
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                    if conn is not None:
                        await conn.close()
        finally:
            if conn is not None:
                await conn.close()

    await asyncio.gather(*(worker(w) for w in range(opts.streams)))
    tokens = sum(s.tokens * _window_share(s.first or s.start, s.end, w0, w1) for s in samples)
    requests = sum(_window_share(s.start, s.end, w0, w1) for s in samples)
    ttft = [s.ttft_ms for s in samples if s.ttft_ms is not None and w0 <= s.start <= w1]
    return {"path": path, "route": route, "tokens_per_s": tokens / opts.window_s,
            "requests_per_s": requests / opts.window_s, "requests": len(samples), "errors": len(errors),
            "error_examples": errors[:3], "mean_output_tokens": statistics.fmean(s.tokens for s in samples)
            if samples else 0.0, "ttft_ms": _stats(ttft), "wall_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------- the run


def _prompts(tokenizer: Path, n: int, tokens: int, seed: int) -> list[str]:
    from .inputs import PromptTokenizer, prompt_with_tokens

    tok = PromptTokenizer(tokenizer)
    rng = random.Random(seed)
    return [prompt_with_tokens(tok, tokens, rng) for _ in range(n)]


def _model_id(front_url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(front_url.rstrip("/") + "/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


async def _run(opts: OpenAIBenchOptions, log) -> dict:
    from client import AsyncLLMClient

    model = opts.model_id or _model_id(opts.front_url)
    short = _prompts(opts.tokenizer, 16, opts.ttft_prompt_tokens, 1)
    long = _prompts(opts.tokenizer, 64, opts.prompt_tokens, 2)
    client = AsyncLLMClient(opts.grpc_url)
    conn = HTTPStream(opts.front_url)
    result: dict = {"model": model, "ttft": {}, "throughput": []}
    try:
        log("openai-bench: warm-up (both paths) ...")
        for route in ("completions", "chat"):
            for p in short[:3]:
                await grpc_request(client, route, p, opts.ttft_max_tokens)
                await http_request(conn, model, route, p, opts.ttft_max_tokens)
        for route in ("completions", "chat"):
            log(f"openai-bench: 1 stream, {opts.ttft_pairs} alternating pairs on {route} ...")
            result["ttft"][route] = await ttft_pairs(opts, client, conn, model, short, route)
            r = result["ttft"][route]
            log(f"  gRPC TTFT P50 {r['grpc_ttft_ms']['p50']:.2f} ms, HTTP {r['http_ttft_ms']['p50']:.2f} ms, "
                f"overhead {r['overhead_p50_ms']:+.2f} ms (paired median {r['paired_diff_ms']['p50']:+.2f} ms)")
        for rnd in range(opts.rounds):
            order = ("grpc", "http") if rnd % 2 == 0 else ("http", "grpc")
            for path in order:
                log(f"openai-bench: round {rnd + 1}/{opts.rounds}, {opts.streams} streams over {path} "
                    f"({opts.warmup_s:g} s warm-up + {opts.window_s:g} s window) ...")
                ph = await throughput_phase(opts, path, client, model, long)
                ph["round"] = rnd + 1
                result["throughput"].append(ph)
                log(f"  {ph['tokens_per_s']:.1f} tok/s, {ph['requests_per_s']:.2f} req/s, "
                    f"{ph['mean_output_tokens']:.1f} tokens/request, {ph['errors']} errors")
    finally:
        await conn.close()
        await client.close()
    return result


def summarise(result: dict) -> dict:
    """Goals: TTFT P50 overhead per route and the 16-stream throughput ratio (sum over rounds)."""
    s: dict = {"ttft": {}, "throughput": {}}
    for route, r in result["ttft"].items():
        ov = r.get("overhead_p50_ms")
        s["ttft"][route] = {"grpc_p50_ms": r["grpc_ttft_ms"].get("p50"), "http_p50_ms": r["http_ttft_ms"].get("p50"),
                            "overhead_p50_ms": ov, "paired_median_ms": r["paired_diff_ms"].get("p50"),
                            "front_door_ttft_mean_ms": r.get("front_door_ttft_mean_ms"),
                            "met": ov is not None and ov <= TTFT_OVERHEAD_GOAL_MS}
    phases = result["throughput"]
    if phases:
        tok = {p: sum(x["tokens_per_s"] for x in phases if x["path"] == p) /
               max(1, sum(1 for x in phases if x["path"] == p)) for p in ("grpc", "http")}
        rps = {p: sum(x["requests_per_s"] for x in phases if x["path"] == p) /
               max(1, sum(1 for x in phases if x["path"] == p)) for p in ("grpc", "http")}
        ratio = tok["http"] / tok["grpc"] if tok["grpc"] else None
        s["throughput"] = {"grpc_tokens_per_s": tok["grpc"], "http_tokens_per_s": tok["http"],
                           "grpc_requests_per_s": rps["grpc"], "http_requests_per_s": rps["http"],
                           "ratio": ratio, "met": ratio is not None and ratio >= THROUGHPUT_RATIO_GOAL,
                           "errors": sum(x.get("errors", 0) for x in phases)}
    return s


def table(result: dict, summary: dict, streams: int) -> list[str]:
    def f(v, d=2):
        return "–" if v is None else f"{v:.{d}f}"

    lines = ["| measurement | direct gRPC (AsyncLLMClient) | OpenAI front door (HTTP + SSE) | front door − gRPC | "
             "goal | |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for route, t in summary["ttft"].items():
        label = "/v1/chat/completions vs stream_chat" if route == "chat" else "/v1/completions vs stream"
        lines.append(f"| TTFT P50 at 1 stream (ms), {label} | {f(t['grpc_p50_ms'])} | {f(t['http_p50_ms'])} | "
                     f"{f(t['overhead_p50_ms'], 2)} (paired median {f(t['paired_median_ms'], 2)}) | ≤ "
                     f"{TTFT_OVERHEAD_GOAL_MS:g} ms | {'met' if t['met'] else '**MISSED**'} |")
    th = summary.get("throughput") or {}
    if th:
        lines.append(f"| throughput at {streams} streams, chat (output tok/s) | {f(th['grpc_tokens_per_s'], 1)} | "
                     f"{f(th['http_tokens_per_s'], 1)} | ratio **{f(th['ratio'], 3)}×** | "
                     f"≥ {THROUGHPUT_RATIO_GOAL:g}× | {'met' if th['met'] else '**MISSED**'} |")
        rps_ratio = th["http_requests_per_s"] / th["grpc_requests_per_s"] if th["grpc_requests_per_s"] else None
        lines.append(f"| throughput at {streams} streams, chat (requests/s) | {f(th['grpc_requests_per_s'])} | "
                     f"{f(th['http_requests_per_s'])} | {f(rps_ratio, 3)}× | | |")
    return lines


def run_openai_bench(opts: OpenAIBenchOptions, log=None) -> dict:
    """Measure; write ``openai-bench.json`` and ``openai-bench.md`` into ``opts.out_dir``; return the data."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out = Path(opts.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "loadavg_before": loadavg(), "git": git_describe(),
            "cpus": os.cpu_count()}
    t0 = time.monotonic()
    result = asyncio.run(_run(opts, log))
    meta.update(wall_s=time.monotonic() - t0, loadavg_after=loadavg())
    summary = summarise(result)
    data = {"meta": meta, "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
            "summary": summary, "result": result}
    (out / "openai-bench.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / "openai-bench.md").write_text("\n".join(table(result, summary, opts.streams)) + "\n")
    return data


# ---------------------------------------------------------------------------------------------- profiling


def profile_front_door(grpc_url: str, out_dir: Path, tokenizer: Path, requests: int = 60, max_tokens: int = 2,
                       route: str = "chat", log=None) -> list[str]:
    """Run a second front door with cProfile (``loadtest.profiled_front_door``; a separate, unmeasured pass),
    profile only while ``requests`` sequential streamed requests run (SIGUSR1 .. SIGUSR2), and return its
    hottest functions, by own time and by cumulative time, leaving out the event loop's idle wait (epoll)."""
    import pstats
    import signal

    from serving.launcher import free_port, stop_process

    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof = out_dir / "front-door.cprofile"
    prof.unlink(missing_ok=True)
    port = free_port()
    env = {**os.environ, "LLM_API_KEY": ""}
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.profiled_front_door", "--cprofile-out", str(prof),
                             "--triton", grpc_url, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=PROJECT_ROOT)
    wall = 0.0
    try:
        wait_ready(proc, 120)
        url = f"http://127.0.0.1:{port}"
        model = _model_id(url)
        prompts = _prompts(tokenizer, 8, 16, 3)

        async def go() -> float:
            conn = HTTPStream(url)
            try:
                for p in prompts[:3]:  # warm: first-request imports and caches stay out of the profile
                    await http_request(conn, model, route, p, max_tokens)
                proc.send_signal(signal.SIGUSR1)
                await asyncio.sleep(0.2)
                t0 = time.perf_counter()
                for i in range(requests):
                    await http_request(conn, model, route, prompts[i % len(prompts)], max_tokens)
                t = time.perf_counter() - t0
                proc.send_signal(signal.SIGUSR2)
                await asyncio.sleep(1.0)
                return t
            finally:
                await conn.close()

        log(f"openai-bench: {requests} requests to a front door under cProfile ...")
        wall = asyncio.run(go())
    finally:
        stop_process(proc, timeout=60)
    if not prof.exists():
        return [f"cProfile wrote nothing (front door exit {proc.returncode})"]
    stats = pstats.Stats(str(prof))
    idle = ("poll", "select")
    rows = [(k, v) for k, v in stats.stats.items() if not any(k[2].endswith(f"'{w}' of 'select.epoll' objects>")
                                                             or k[2] == w for w in idle)]
    busy = sum(v[2] for _, v in rows)
    lines = [f"{requests} sequential streamed {route} requests (max_tokens {max_tokens}) in {wall * 1000:.0f} ms; "
             f"the front door's own CPU time (profiled, epoll wait excluded): {busy * 1000:.0f} ms = "
             f"{busy * 1000 / requests:.2f} ms per request (cProfile inflates it)"]
    for key, label in ((2, "own time"), (3, "cumulative time")):
        lines.append(f"Top 12 by {label}:")
        for (file, line, fn), (cc, nc, tt, ct, _callers) in sorted(rows, key=lambda kv: kv[1][key], reverse=True)[:12]:
            where = file.replace(str(PROJECT_ROOT) + "/", "").split("site-packages/")[-1].split("lib/python3.11/")[-1]
            lines.append(f"  {tt * 1000 / requests:7.3f} ms own {ct * 1000 / requests:7.3f} ms cum per request "
                         f"{nc / requests:6.1f} calls  {where}:{line} {fn}")
    (out_dir / "front-door-profile.txt").write_text("\n".join(lines) + "\n")
    return lines


def wait_ready(proc: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        if line.startswith("openai front door ready on "):
            return line.strip()
    raise RuntimeError("the front door did not announce readiness:\n" + "".join(seen[-20:]))


class FrontDoor:
    """``python -m serving openai`` as a subprocess on a free port (the benchmark's own)."""

    def __init__(self, grpc_url: str, log_file: Path | None = None):
        from serving.launcher import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "serving", "openai", "--triton", grpc_url, "--host",
                                      "127.0.0.1", "--port", str(self.port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env={**os.environ, "LLM_API_KEY": ""},
                                     cwd=PROJECT_ROOT)
        self.ready_line = wait_ready(self.proc, 180)
        self._log = open(log_file, "w") if log_file else None  # noqa: SIM115 - closed in stop()
        import threading

        threading.Thread(target=self._drain_output, daemon=True).start()

    def _drain_output(self) -> None:
        for line in self.proc.stdout:
            if self._log:
                self._log.write(line)

    def stop(self) -> int | None:
        from serving.launcher import stop_process

        code = stop_process(self.proc, timeout=60)
        if self._log:
            self._log.close()
        return code


@dataclass
class StandaloneResult:
    data: dict
    profile: list[str] = field(default_factory=list)
