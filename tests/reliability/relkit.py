"""Shared tools of the reliability suite and its scripts: stacks, servers, RSS, gauges, load, percentiles.

Everything here talks to a real tritonserver on loopback. Nothing is imported from tests/conftest.py, so the
scripts under tests/reliability/scripts/ run without pytest.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import requests

PROJECT_ROOT = Path(__file__).resolve().parents[2]
if str(PROJECT_ROOT) not in sys.path:  # scripts run as files
    sys.path.insert(0, str(PROJECT_ROOT))

from serving.parent_death import stop_with_parent  # noqa: E402
from serving.prometheus import fetch, total  # noqa: E402
from tests.stack import PROMPTS, TEST_LIMITS, stack_profile  # noqa: E402, F401 (PROMPTS: relkit.PROMPTS)
from tests.triton_helpers import wait_for  # noqa: E402 (the reliability tests call relkit.wait_for too)


# ------------------------------------------------------------------------------------------- stacks


def build_engine(checkpoint: Path, out: Path, **limits) -> Path:
    """``checkpoint``'s CPU engine with the suite's limits (TEST_LIMITS), ``limits`` replacing some of them."""
    from builders.cpu_build import BuildLimits, build_cpu_engine

    return build_cpu_engine(checkpoint, out, limits=BuildLimits(**dict(TEST_LIMITS, **limits)))


def build_tiny_stack(workdir: Path, limits: dict | None = None, seed: int = 0) -> tuple[Path, Path]:
    """(checkpoint, engine) of the tiny random Llama the test suite uses; cached in ``workdir``."""
    from builders.tiny_model import build_random_model

    workdir = Path(workdir)
    checkpoint = workdir / "tiny"
    if not (checkpoint / "model.safetensors").exists():
        build_random_model(checkpoint, seed=seed)
    limits = dict(TEST_LIMITS, **(limits or {}))
    tag = "-".join(f"{k}{v}" for k, v in sorted(limits.items()))
    engine = workdir / f"engine-{tag}"
    if not (engine / "config.json").exists():
        build_engine(checkpoint, engine, **limits)
    return checkpoint, engine


def render(out: Path, engine: Path, tokenizer: Path, **knobs):
    """A repository like tests/conftest.py's session server's; ``knobs``: see ``stack_profile``."""
    from builders.repository import render_repository

    return render_repository(stack_profile(engine, tokenizer, **knobs), out)


def start_server(repo: Path, log_dir: Path, exit_timeout_secs: int = 10, name: str = "tritonserver"):
    from serving.launcher import ServerConfig, TritonServer

    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0,
                          exit_timeout_secs=exit_timeout_secs, log_file=Path(log_dir) / f"{name}.log")
    server = TritonServer(config, ready_timeout=240)
    server.start()
    server.wait_ready()
    return server


# ------------------------------------------------------------------------------------------- processes


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants (tritonserver + one Python stub per model instance)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def robust_slope(values: list[float]) -> float:
    """Theil-Sen slope per step: the median of the slopes between every pair of points. A one-off step (a
    first-use allocation) moves few pairs; growth in every step moves them all."""
    pairs = [(values[j] - values[i]) / (j - i) for i in range(len(values)) for j in range(i + 1, len(values))]
    return float(np.median(pairs))


def rss_tree_mib(pid: int) -> float:
    """Resident memory of the server's whole process tree; 0 for a process that has gone."""
    rss = 0
    try:
        for proc in process_tree(pid):
            try:
                rss += proc.memory_info().rss
            except psutil.Error:  # a stub that exited meanwhile
                pass
    except psutil.NoSuchProcess:
        pass
    return rss / 2**20


# ------------------------------------------------------------------------------------------- metrics


@dataclass
class Snapshot:
    active: float
    queued: float
    kv: float
    finished: dict[str, float]
    ensemble_success: float
    ensemble_failure: float
    never_reached_engine: float = 0.0  # llm/preprocessing requests Triton dropped as cancelled before execute

    @property
    def ensemble_done(self) -> float:
        return self.ensemble_success + self.ensemble_failure


def snapshot(metrics_url: str) -> Snapshot:
    s = fetch(metrics_url)
    return Snapshot(
        active=total(s, "llm_engine_active_slots"), queued=total(s, "llm_engine_queued_requests"),
        kv=total(s, "llm_engine_kv_cache_occupancy"),
        finished={r: total(s, "llm_requests_finished_total", reason=r) for r in ("length", "stop", "cancelled")},
        ensemble_success=total(s, "nv_inference_request_success", model="ensemble"),
        ensemble_failure=total(s, "nv_inference_request_failure", model="ensemble"),
        never_reached_engine=(total(s, "nv_inference_request_failure", model="llm", reason="CANCELED")
                              + total(s, "nv_inference_request_failure", model="preprocessing", reason="CANCELED")),
    )


def idle(metrics_url: str, timeout: float = 30.0) -> Snapshot:
    """Wait until no slot is held and nothing is queued; return that snapshot."""
    return wait_for(lambda: (s := snapshot(metrics_url)).active == 0 and s.queued == 0 and s, timeout,
                    "llm_engine_active_slots == 0 and llm_engine_queued_requests == 0")


def settled(metrics_url: str, quiet_s: float = 2.0, timeout: float = 60.0) -> Snapshot:
    """Wait until no slot is held, nothing is queued and no request has finished for ``quiet_s``; return that
    snapshot. ``idle`` alone is not enough in the GPU layout: requests still on their way to tensorrt_llm (the
    wrapper's workers, Triton's queue before it) are in no engine gauge."""
    last, since = None, time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = snapshot(metrics_url)
        key = (s.finished, s.never_reached_engine, s.ensemble_success, s.ensemble_failure)
        if key != last or s.active or s.queued:
            last, since = key, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return s
        time.sleep(0.1)
    raise AssertionError(f"requests still finishing after {timeout} s (last snapshot {last})")


def live(http_url: str) -> bool:
    try:
        return requests.get(f"{http_url}/v2/health/live", timeout=5).status_code == 200
    except requests.RequestException:
        return False


# ------------------------------------------------------------------------------------------- stats


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    return float(np.percentile(values, q, method="inverted_cdf")) if len(values) else math.nan


# ------------------------------------------------------------------------------------------- load


@dataclass
class Outcome:
    kind: str  # "ok" | "rejected" | "error" | "timeout"
    start: float
    latency_s: float
    ttft_s: float | None = None
    output_tokens: int = 0
    message: str = ""


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    duration_s: float = 0.0

    def kinds(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.kind] = out.get(o.kind, 0) + 1
        return out

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]




async def one_request(client, prompt: str, max_tokens: int, stream: bool, timeout_s: float) -> Outcome:
    """One request through the client SDK, classified. UNAVAILABLE 'queue is full' counts as rejected."""
    from client import GenerationError, SamplingParams

    start = time.perf_counter()
    params = SamplingParams(max_tokens=max_tokens)
    try:
        async with asyncio.timeout(timeout_s):
            if stream:
                s = client.stream(prompt, params)
                async for _ in s:
                    pass
                done = s.completion
            else:
                done = await client.generate(prompt, params)
        return Outcome("ok", start, time.perf_counter() - start, done.timings.ttft_s, done.num_output_tokens)
    except TimeoutError:
        return Outcome("timeout", start, time.perf_counter() - start, message=f"no final response in {timeout_s} s")
    except GenerationError as exc:
        kind = "rejected" if "queue is full" in str(exc) or "Exceeds maximum queue size" in str(exc) else "error"
        return Outcome(kind, start, time.perf_counter() - start, message=str(exc)[:300])


async def open_loop(grpc_url: str, rate: float, duration_s: float, max_tokens: int, stream: bool = True,
                    timeout_s: float = 60.0, seed: int = 0, max_outstanding: int = 2000,
                    on_tick=None) -> LoadResult:
    """Poisson arrivals at ``rate`` req/s for ``duration_s``; waits for every request to end (or time out).
    ``on_tick(elapsed)`` is called about once a second (sampling RSS, gauges)."""
    from client import AsyncLLMClient

    rng = random.Random(seed)
    result = LoadResult()
    async with AsyncLLMClient(grpc_url) as client:
        tasks: list[asyncio.Task] = []
        outstanding = [0]
        begin = time.perf_counter()
        next_at, next_tick = begin, begin
        while (now := time.perf_counter()) - begin < duration_s:
            if on_tick and now >= next_tick:
                on_tick(now - begin)
                next_tick += 1.0
            if now >= next_at:
                if outstanding[0] < max_outstanding:
                    task = asyncio.create_task(one_request(client, rng.choice(PROMPTS), max_tokens, stream,
                                                           timeout_s))
                    outstanding[0] += 1
                    task.add_done_callback(lambda _: outstanding.__setitem__(0, outstanding[0] - 1))
                    tasks.append(task)
                next_at += rng.expovariate(rate)
                continue
            await asyncio.sleep(min(next_at, next_tick) - now if on_tick else next_at - now)
        pending = [t for t in tasks if not t.done()]
        while pending:
            done, pending = await asyncio.wait(pending, timeout=1.0)
            if on_tick:
                on_tick(time.perf_counter() - begin)
        result.outcomes = [t.result() for t in tasks]
        result.duration_s = time.perf_counter() - begin
    return result


async def closed_loop(grpc_url: str, concurrency: int, duration_s: float, max_tokens: int,
                      stream: bool = True, timeout_s: float = 60.0) -> LoadResult:
    """``concurrency`` workers back to back for ``duration_s`` (capacity measurement)."""
    from client import AsyncLLMClient

    result = LoadResult()
    async with AsyncLLMClient(grpc_url) as client:
        begin = time.perf_counter()

        async def worker(i: int):
            n = i
            while time.perf_counter() - begin < duration_s:
                result.outcomes.append(await one_request(client, PROMPTS[n % len(PROMPTS)], max_tokens, stream,
                                                         timeout_s))
                n += concurrency

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        result.duration_s = time.perf_counter() - begin
    return result


CAPACITY_PROBES: list[dict] = []  # what each capacity measurement saw (a hung request shows up here)


def measure_capacity(grpc_url: str, slots: int, max_tokens: int, duration_s: float = 5.0) -> float:
    """Completed requests per second the server sustains, counting only requests that ended inside the window
    (one hung request must not stretch the window): the lower of two probes.

    Closed loop (concurrency = slots) keeps every KV slot busy, but its requests start and end in lockstep, the
    engine's cheapest pattern; Poisson arrivals at twice that rate (the loads' own pattern, saturated, the excess
    rejected) interleave prefills with decoding and can sustain much less. A soak at 70% of the closed-loop figure
    alone overloaded the server in some runs (closed loop 80 req/s; 224 requests rejected at 55.6 req/s).
    """
    asyncio.run(closed_loop(grpc_url, slots, 1.0, max_tokens, timeout_s=30))  # warm-up
    closed = asyncio.run(closed_loop(grpc_url, slots, duration_s, max_tokens, timeout_s=30))
    closed_rps = _completed_in_window(closed, duration_s) / duration_s
    poisson = asyncio.run(open_loop(grpc_url, 2 * closed_rps, duration_s, max_tokens, timeout_s=30, seed=1))
    poisson_rps = _completed_in_window(poisson, duration_s) / duration_s
    CAPACITY_PROBES.append({"closed_loop": {"kinds": closed.kinds(), "rps": round(closed_rps, 1)},
                            "poisson_saturated": {"kinds": poisson.kinds(), "rps": round(poisson_rps, 1)}})
    return min(closed_rps, poisson_rps)


def _completed_in_window(run: LoadResult, duration_s: float) -> int:
    begin = min(o.start for o in run.outcomes)
    return sum(1 for o in run.of("ok") if o.start + o.latency_s <= begin + duration_s)


# ------------------------------------------------------------------------------------------- launcher CLI


def launch_cli(repo: Path, out: Path, ports: list[int], exit_timeout_secs: int = 10,
               extra: list[str] | None = None) -> subprocess.Popen:
    """``python -m serving serve`` as a subprocess (what an operator or a container runs). ``ports``: HTTP, gRPC,
    metrics and, when a fourth is given, the OpenAI front door's; without it, no front door (never the fixed 9000).
    The liveness endpoint gets a fifth port when given, else a free one (never the fixed 8003)."""
    from serving.launcher import free_ports

    health = ports[4] if len(ports) > 4 else free_ports(1, taken=ports)[0]
    env = dict(os.environ, HTTP_PORT=str(ports[0]), GRPC_PORT=str(ports[1]), METRICS_PORT=str(ports[2]),
               HEALTH_PORT=str(health))
    cmd = [sys.executable, "-m", "serving", "serve", "--model-repository", str(repo),
           "--exit-timeout-secs", str(exit_timeout_secs)]
    if len(ports) > 3:
        env["OPENAI_PORT"] = str(ports[3])
    else:
        cmd.append("--no-openai")
    if extra:
        cmd += ["--", *extra]
    return subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT,
                            preexec_fn=stop_with_parent())  # a killed run leaves no launcher (and so no server)


def wait_cli_ready(proc: subprocess.Popen, out: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while "ready:" not in out.read_text("utf-8", "replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("launcher did not become ready:\n" + out.read_text("utf-8", "replace")[-3000:])
        time.sleep(0.2)


def in_flight_at_exit(log_text: str) -> dict[str, int]:
    """What tritonserver said was still in flight while it waited to exit (last report per model)."""
    found: dict[str, int] = {}
    for m in re.finditer(r"Model '([^']+)' \(version \d+\) has (\d+) in-flight inferences", log_text):
        found[m.group(1)] = int(m.group(2))
    return found


def terminate_and_wait(proc: subprocess.Popen, timeout: float = 90.0) -> tuple[int, float]:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    return rc, time.monotonic() - started


# ------------------------------------------------------------------------------------------- cancellation


async def cancel_storm(grpc_url: str, n: int, concurrency: int, max_tokens: int, max_delay_s: float,
                       seed: int = 0) -> list[dict]:
    """``n`` SDK streams, each abandoned after a random delay in [0, max_delay_s] (before the first token,
    mid-stream, or after it ended). Abandoning runs the SDK's path: cancel the gRPC call, send ``stop``."""
    from client import AsyncLLMClient, SamplingParams

    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    records: list[dict] = []

    async with AsyncLLMClient(grpc_url) as client:
        async def one(i: int):
            async with gate:
                stream = client.stream(PROMPTS[i % len(PROMPTS)], SamplingParams(max_tokens=max_tokens))
                deltas = 0

                async def consume():
                    nonlocal deltas
                    async for _ in stream:
                        deltas += 1

                task = asyncio.create_task(consume())
                delay = rng.uniform(0, max_delay_s)
                await asyncio.sleep(delay)
                finished = task.done()
                if not finished:
                    task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                records.append({"delay_s": delay, "deltas": deltas, "completed": finished and
                                stream.completion is not None})

        await asyncio.gather(*(one(i) for i in range(n)))
    return records


def raw_cancel_once(grpc_url: str, metrics_url: str, model: str, max_tokens: int, sdk: bool = False) -> dict:
    """Start one stream, wait for its first response, abandon it; time until the slot is free.

    model "ensemble" + sdk=False: a raw client that just cancels its gRPC call (what any client does when its
    user goes away). sdk=True: the client SDK (cancel + ``stop`` to the LLM model)."""
    import queue as _queue

    import numpy as np
    import tritonclient.grpc as grpcclient

    from tests.triton_helpers import make_input, text_inputs

    before = snapshot(metrics_url)
    tokens_before = total(fetch(metrics_url), "llm_generation_tokens_total")
    if sdk:
        from client import LLMClient, SamplingParams

        with LLMClient(grpc_url) as c:
            s = c.stream("def f(x):", SamplingParams(max_tokens=max_tokens))
            next(s)
            t0 = time.perf_counter()
            s.close()
    else:
        got: _queue.Queue = _queue.Queue()
        c = grpcclient.InferenceServerClient(grpc_url)
        c.start_stream(callback=lambda result, error: got.put((result, error)))
        if model == "ensemble":
            inputs = text_inputs("def f(x):", max_tokens, stream=True)
        else:
            inputs = [make_input("input_ids", [[1, 2, 3]], np.int32), make_input("input_lengths", [[3]], np.int32),
                      make_input("request_output_len", [[max_tokens]], np.int32),
                      make_input("streaming", [[True]], bool)]
        c.async_stream_infer(model, inputs, request_id=f"raw-{time.monotonic_ns()}",
                             enable_empty_final_response=True)
        got.get(timeout=60)
        t0 = time.perf_counter()
        c.stop_stream(cancel_requests=True)
        c.close()

    def ended():
        s = snapshot(metrics_url)
        done = sum(s.finished.values()) - sum(before.finished.values())
        return s if done >= 1 and s.active == 0 else None

    after = wait_for(ended, timeout=60, what="the abandoned request to end", every=0.005)
    freed_s = time.perf_counter() - t0
    reason = max(after.finished, key=lambda r: after.finished[r] - before.finished[r])
    tokens = total(fetch(metrics_url), "llm_generation_tokens_total") - tokens_before
    return {"model": model, "sdk": sdk, "reason": reason, "freed_s": freed_s, "tokens": tokens}


# ------------------------------------------------------------------------------------------- overload / soak


def summarize(run: LoadResult) -> dict:
    ok, rejected = run.of("ok"), run.of("rejected")
    ms = lambda xs, q: round(percentile([x.latency_s for x in xs], q) * 1000, 1)  # noqa: E731
    return {
        "requests": len(run.outcomes), **{f"n_{k}": v for k, v in run.kinds().items()},
        "ok_p50_ms": ms(ok, 50), "ok_p99_ms": ms(ok, 99),
        "ttft_p99_ms": round(percentile([o.ttft_s for o in ok if o.ttft_s is not None], 99) * 1000, 1),
        "reject_p50_ms": ms(rejected, 50), "reject_p99_ms": ms(rejected, 99),
        "reject_max_ms": round(max((o.latency_s for o in rejected), default=math.nan) * 1000, 1),
        "errors": sorted({o.message for o in run.outcomes if o.kind in ("error", "timeout")})[:5],
    }


class Sampler:
    """RSS of the server tree and engine gauges, once a second (``tick`` is open_loop's ``on_tick``).
    With ``progress_s`` (the run's length) a progress bar shows them on stderr (the long scripts)."""

    def __init__(self, pid: int, metrics_url: str, progress_s: float | None = None):
        self.pid, self.metrics_url = pid, metrics_url
        self.rows: list[dict] = []
        self.bar = None
        if progress_s is not None:
            from tqdm import tqdm

            self.bar = tqdm(total=round(progress_s), desc="load", bar_format="{desc} |{bar}| {n}/{total} s")

    def tick(self, elapsed: float) -> None:
        row = {"t": round(elapsed, 1), "rss_mib": round(rss_tree_mib(self.pid), 1)}
        try:
            s = snapshot(self.metrics_url)
            row.update(active=s.active, queued=s.queued)
        except OSError:  # the metrics port did not answer this second
            row.update(active=None, queued=None)
        self.rows.append(row)
        if self.bar is not None:
            self.bar.set_description_str(f"load: RSS {row['rss_mib']} MiB, active {row['active']}, "
                                         f"queued {row['queued']}", refresh=False)
            self.bar.update(min(round(elapsed), self.bar.total) - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    @property
    def peak_rss(self) -> float:
        return max(r["rss_mib"] for r in self.rows)


def overload(server, factor: float, duration_s: float, max_tokens: int, slots: int, stream: bool = True,
             capacity: float | None = None, timeout_s: float = 60.0, progress: bool = False) -> dict:
    """Measure capacity (unless given), then offer ``factor`` x capacity for ``duration_s`` (Poisson)."""
    if capacity is None:
        capacity = measure_capacity(server.urls.grpc, slots, max_tokens)
    sampler = Sampler(server.process.pid, server.urls.metrics, duration_s if progress else None)
    sampler.tick(0.0)
    baseline = sampler.rows[0]["rss_mib"]
    run = asyncio.run(open_loop(server.urls.grpc, factor * capacity, duration_s, max_tokens, stream=stream,
                                timeout_s=timeout_s, on_tick=sampler.tick))
    sampler.close()
    report = {"capacity_rps": round(capacity, 2), "capacity_probe": CAPACITY_PROBES[-1:],
              "offered_rps": round(factor * capacity, 1),
              "duration_s": duration_s, "max_tokens": max_tokens, "stream": stream, **summarize(run),
              "completed_rps": round(len(run.of("ok")) / run.duration_s, 2),
              "rss_baseline_mib": baseline, "rss_peak_mib": sampler.peak_rss,
              "live_after": live(server.urls.http)}
    return {"report": report, "samples": sampler.rows, "outcomes": run.outcomes}


def windows(outcomes: list[Outcome], begin: float, width_s: float) -> list[dict]:
    """Latency percentiles of the requests that *ended* in each ``width_s`` window (times from ``begin``)."""
    rows: dict[int, list[Outcome]] = {}
    for o in outcomes:
        rows.setdefault(int((o.start + o.latency_s - begin) // width_s), []).append(o)
    out = []
    for w in sorted(rows):
        ok = [o for o in rows[w] if o.kind == "ok"]
        out.append({"t": (w + 1) * width_s, "n": len(rows[w]), "ok": len(ok),
                    "p50_ms": round(percentile([o.latency_s for o in ok], 50) * 1000, 1),
                    "p99_ms": round(percentile([o.latency_s for o in ok], 99) * 1000, 1),
                    "ttft_p99_ms": round(percentile([o.ttft_s for o in ok if o.ttft_s], 99) * 1000, 1)})
    return out


def soak(server, fraction: float, duration_s: float, max_tokens: int, slots: int, window_s: float = 10.0,
         capacity: float | None = None, progress: bool = False) -> dict:
    """``fraction`` x capacity (Poisson, streamed) for ``duration_s``; RSS each second, latency per window."""
    if capacity is None:
        capacity = measure_capacity(server.urls.grpc, slots, max_tokens)
    sampler = Sampler(server.process.pid, server.urls.metrics, duration_s if progress else None)
    begin = time.perf_counter()
    run = asyncio.run(open_loop(server.urls.grpc, fraction * capacity, duration_s, max_tokens, stream=True,
                                timeout_s=60, seed=1, on_tick=sampler.tick))
    sampler.close()
    rss = [r["rss_mib"] for r in sampler.rows]
    head = rss[: max(1, len(rss) // 10)]  # first 10% of the run (after warm-up: capacity was measured first)
    tail = rss[-max(1, len(rss) // 10):]
    win = windows(run.outcomes, begin, window_s)
    full = [w for w in win if w["t"] <= duration_s]  # the drain window at the end is partial
    report = {"capacity_rps": round(capacity, 2), "capacity_probe": CAPACITY_PROBES[-1:],
              "offered_rps": round(fraction * capacity, 2),
              "duration_s": duration_s, "max_tokens": max_tokens, **summarize(run),
              "rss_start_mib": round(sorted(head)[len(head) // 2], 1),
              "rss_end_mib": round(sorted(tail)[len(tail) // 2], 1), "rss_max_mib": max(rss),
              "window_p99_ms_first": full[0]["p99_ms"] if full else math.nan,
              "window_p99_ms_last": full[-1]["p99_ms"] if full else math.nan,
              "window_p99_ms_max": max((w["p99_ms"] for w in full), default=math.nan),
              "window_p99_ms_median": percentile([w["p99_ms"] for w in full], 50)}
    report["rss_growth_pct"] = round(100 * (report["rss_end_mib"] / report["rss_start_mib"] - 1), 2)
    return {"report": report, "samples": sampler.rows, "windows": win}
