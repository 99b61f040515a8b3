"""llama.cpp's own ``llama-server`` as a peer of the engine benchmark: continuous batching over ``--parallel``
slots, the aggregate-throughput server a CPU user would pick (built by ``bench/llama_cpp_setup.sh --server``).

One server per GGUF, ``--parallel`` = the most streams measured, each slot ``ctx_per_slot`` tokens. Every stream
level: N client threads started together, each sending its requests in turn as streaming ``/completion`` calls with
the prompt as token ids (every peer sees the same ids), greedy, ``ignore_eos`` (end-of-sequence masked, so exactly
``n_predict`` tokens: the ``min_tokens`` semantics the other peers use) and ``cache_prompt`` off (no request reuses
another's KV). TTFT = first streamed token − request sent; aggregate = all output tokens / wall time. Peak RSS is
the server's VmHWM (the GGUF is mmapped: the pages it read count).

    python -m bench.llama_server_peer GGUF [--streams 1,16] [--new-tokens 32]   # smoke run, default model's prompts
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from serving.launcher import free_port, stop_process

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LLAMA_SERVER = PROJECT_ROOT / "build" / "tools" / "llama-server" / "bin" / "llama-server"
BUILD_HINT = "run bench/llama_cpp_setup.sh --server (builds llama-server from the locked sdist, ~5 min)"


@dataclass
class Server:
    url: str
    pid: int
    load_s: float


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MB."""
    with open(f"/proc/{pid}/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return round(kb / 1024, 1)


@contextmanager
def llama_server(binary: Path, gguf: Path, parallel: int, ctx_per_slot: int, threads: int, log: Path,
                 ready_timeout: float = 120.0) -> Iterator[Server]:
    """A running llama-server on a free 127.0.0.1 port, ready (``/health`` 200); stopped on exit, whatever happens."""
    port = free_port()
    cmd = [str(binary), "-m", str(gguf), "--parallel", str(parallel), "-c", str(parallel * ctx_per_slot),
           "--threads", str(threads), "--threads-batch", str(threads), "--host", "127.0.0.1", "--port", str(port),
           "--no-webui",
           # Nothing kept between requests: no host-memory prompt cache (on by default in this version).
           "--cache-ram", "0"]
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "wb") as out:
        # OMP_NUM_THREADS as for the llama.cpp peer: GGML_OPENMP builds size their pool from it too.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready: {_tail(log)}")
            if time.perf_counter() - start > ready_timeout:
                raise RuntimeError(f"llama-server not ready after {ready_timeout:.0f} s: {_tail(log)}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):  # not listening yet, or 503 loading
                pass
            time.sleep(0.1)
        yield Server(url, proc.pid, time.perf_counter() - start)
    finally:
        stop_process(proc, timeout=15)


def _tail(log: Path, chars: int = 1500) -> str:
    return log.read_text(errors="replace")[-chars:].strip()


def _complete(url: str, ids: list[int], new_tokens: int) -> dict:
    """One streaming /completion: the generated token ids and the time to the first of them."""
    body = json.dumps({"prompt": ids, "n_predict": new_tokens, "ignore_eos": True, "temperature": 0,
                       "cache_prompt": False, "stream": True, "return_tokens": True})
    host = url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=1800)
    try:
        sent = time.perf_counter()
        conn.request("POST", "/completion", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"llama-server /completion: HTTP {resp.status}: {resp.read()[:500]!r}")
        tokens, times, predicted = [], [], None
        for line in resp:  # server-sent events: "data: {...}" lines
            if not line.startswith(b"data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("tokens"):
                tokens += chunk["tokens"]
                times.append(time.perf_counter())
            if chunk.get("stop"):
                predicted = chunk.get("tokens_predicted")
                break
    finally:
        conn.close()
    if predicted != new_tokens or len(tokens) != new_tokens:
        raise RuntimeError(f"llama-server returned {len(tokens)} tokens ({predicted} predicted), not {new_tokens}")
    return {"tokens": tokens, "ttft_s": times[0] - sent}


def measure(url: str, prompts: list[list[int]], streams: int, new_tokens: int, requests_per_stream: int = 1) -> dict:
    """``streams`` client threads started together, each sending ``requests_per_stream`` requests in turn (stream s,
    request r: prompt ``s * requests_per_stream + r``, as the Triton peer picks them)."""
    results: list[list[dict]] = [[] for _ in range(streams)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(streams + 1)

    def client(s: int) -> None:
        barrier.wait()
        try:
            for r in range(requests_per_stream):
                results[s].append(_complete(url, prompts[(s * requests_per_stream + r) % len(prompts)], new_tokens))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(s,), daemon=True) for s in range(streams)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    reqs = [r for per in results for r in per]
    tokens = sum(len(r["tokens"]) for r in reqs)
    return {"streams": streams, "wall_s": wall, "tokens": tokens, "agg_tok_s": tokens / wall,
            "ttft_s": [r["ttft_s"] for r in reqs], "outputs": [r["tokens"] for r in reqs]}


def run(binary: Path, gguf: Path, prompts: list[list[int]], streams: Sequence[int], new_tokens: int, threads: int,
        requests_per_stream: int = 1, log: Path | None = None, monitor=None,
        say: Callable[[str], None] = print) -> dict:
    """Every level of ``streams`` on one server with ``--parallel max(streams)``: per level the TTFT of each request,
    the tokens generated (``outputs``, in prompt order) and the aggregate rate. ``monitor`` (engine_bench's
    CpuMonitor: ``start()`` / ``stop(mark)``) adds each level's CPU-noise reading as ``noise``."""
    if not Path(binary).is_file():
        raise FileNotFoundError(f"{binary} is missing: {BUILD_HINT}")
    # Each slot holds its prompt and every new token; 512 (llama.cpp's -c 8192 for 16 slots) unless more is needed.
    longest = max(len(p) for p in prompts) + new_tokens
    ctx_per_slot = max(512, -(-longest // 256) * 256)
    log = log or Path(tempfile.gettempdir()) / f"llama-server-{os.getpid()}.log"
    about = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    version = (about.stderr or about.stdout).strip().splitlines()[0]  # "version: 0.5.0-dev (build 1, commit …)"
    with llama_server(Path(binary), Path(gguf), max(streams), ctx_per_slot, threads, log) as server:
        say(f"llama-server {Path(gguf).name}: ready in {server.load_s:.1f} s (--parallel {max(streams)}, "
            f"{ctx_per_slot} tokens per slot, {threads} threads)")
        # Warm-up, as for the other peers: one whole request, then every batch size once.
        measure(server.url, prompts[-1:], 1, new_tokens)
        for c in sorted(set(streams) | {1}):
            measure(server.url, prompts, c, 4)
        levels = []
        for c in streams:
            mark = monitor.start() if monitor else None
            level = measure(server.url, prompts, c, new_tokens, requests_per_stream)
            if monitor:
                level["noise"] = monitor.stop(mark)
            say(f"llama-server {Path(gguf).name}: {c} streams: {level['agg_tok_s']:.1f} tok/s")
            levels.append(level)
        rss = peak_rss_mb(server.pid)
    return {"load_s": server.load_s, "rss_mb": rss, "version": version, "parallel": max(streams),
            "ctx_per_slot": ctx_per_slot, "levels": levels}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.llama_server_peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("gguf", type=Path)
    p.add_argument("--binary", type=Path, default=LLAMA_SERVER)
    p.add_argument("--streams", default="1,16", help="concurrency levels (the server gets --parallel max)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    from bench.workload import make_prompts, pct

    _, prompts = make_prompts(PROJECT_ROOT / "build" / "models" / "smollm2", a.prompt_tokens, count=16)
    res = run(a.binary, a.gguf, prompts, [int(s) for s in a.streams.split(",")], a.new_tokens, a.threads)
    print(f"llama-server {res['version']}; peak RSS {res['rss_mb']:.0f} MB")
    for level in res["levels"]:
        print(f"{level['streams']:>3} streams × {a.new_tokens} tokens: {level['agg_tok_s']:.1f} tok/s aggregate, "
              f"TTFT p50 {1e3 * pct(level['ttft_s'], 0.5):.0f} ms, wall {level['wall_s']:.2f} s")


if __name__ == "__main__":
    main()
