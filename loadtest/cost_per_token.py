"""The serving path's CPU cost per streamed token, both layouts, with the ``null`` token source (no model compute).

    .venv/bin/python -m loadtest.cost_per_token [--streams 1 16 64 256] [--tokens 256] [--requests-per-stream 4]
        [--stream-interval-ms 0 50]

For each layout (the CPU llm, and the GPU layout with the stand-in executor: builders/trtllm/standin.py) it
renders the repository with ``null`` tokens, starts a real tritonserver, and at each concurrency runs perf_analyzer
(gRPC streaming against the ensemble) for a fixed number of requests of exactly ``--tokens`` tokens, once per
``--stream-interval-ms`` (the ``llm``'s hold between a stream's responses: builders/profile.py). CPU time is
user + system of tritonserver and every Python stub (the process tree), read before and after each run, so it
includes everything the server spends on those tokens and nothing of perf_analyzer; the GPU layout's stand-in
executor makes its tokens on a thread of the ``llm`` stub, whose CPU (a GPU's work on a GPU) is reported apart. Prints a table, writes JSON
and a PNG (default ``docs/benchmarks/cost_per_token.{json,png}``).

The engine directory is the default model's (its config and tokenizer; build/engines/smollm2-int4_awq) with
``max_batch_size`` raised to the largest concurrency, so every stream runs at once: the null source never queues.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from builders.profile import PROJECT_ROOT, LLMStage

DEFAULT_ENGINE = PROJECT_ROOT / "build/engines/smollm2-int4_awq"  # `make repository`'s; only its tokenizer is used
DEFAULT_TOKENIZER = PROJECT_ROOT / "build/models/smollm2"
DEFAULT_OUT = PROJECT_ROOT / "docs/benchmarks/cost_per_token"
GOAL_US = 100.0  # issue 27: ≤ 100 µs of CPU per streamed token at 64 streams, the stand-in's tokens apart
GOAL_STREAMS = 64
STANDIN = "stand-in tokens"  # the GPU's share on a GPU: not the serving path's
PROMPT = "The three primary colours are red, yellow and blue; mixing them gives every other colour."


@dataclass
class Row:
    layout: str
    stream_interval_ms: float
    streams: int
    requests: int
    tokens: int
    wall_s: float
    cpu_s: float
    cpu_by_process: dict[str, float]

    @property
    def us_per_token(self) -> float:
        return 1e6 * self.cpu_s / self.tokens

    @property
    def tokens_per_core_s(self) -> float:
        return self.tokens / self.cpu_s


def null_engine_dir(engine: Path, max_batch_size: int, out: Path) -> Path:
    """``engine`` with room for ``max_batch_size`` streams at once (config.json rewritten, weights linked)."""
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((engine / "config.json").read_text())
    config["build_config"]["max_batch_size"] = max_batch_size
    (out / "config.json").write_text(json.dumps(config, indent=1))
    for weights in engine.glob("*.safetensors"):
        link = out / weights.name
        if not link.exists():
            link.symlink_to(weights.resolve())
    return out


def render_null_repository(layout: str, engine: Path, tokenizer: Path, streams: int, step_ms: float,
                           interval_ms: float, out: Path) -> Path:
    from builders.profile import LLMStage, ServingProfile, Stage
    from builders.repository import model_configs, render_repository
    from builders.trtllm.standin import standin_configs

    queue = 4 * streams  # never the limit: every request is accepted
    profile = ServingProfile(name="cost-per-token", engine_dir=engine, tokenizer_dir=tokenizer,
                             max_batch_size=streams,
                             preprocessing=Stage(instances=2, batcher=None),  # as builders/profiles/cpu.yaml
                             llm=LLMStage(max_queue_size=queue, cpu_threads=1, stream_interval_ms=interval_ms))
    if layout != "cpu":
        return render_repository(profile, out, standin_configs(profile, "null", null_step_ms=step_ms))
    configs = model_configs(profile.resolved())
    for name, _, cfg in configs:
        if name == profile.llm_model_name:  # model_repository/llm/1/model.py: NullSource instead of the engine
            cfg.parameters["token_source"].string_value = "null"
            cfg.parameters["null_step_ms"].string_value = str(step_ms)
    return render_repository(profile, out, configs)


def _label(proc: psutil.Process) -> str:
    """tritonserver, or the model a Python stub serves (its first argument is the model's model.py)."""
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return "gone"
    for arg in cmd[1:2]:
        if arg.endswith("model.py"):
            return Path(arg).parents[1].name
    return Path(cmd[0]).name if cmd else proc.name()


def _standin_seconds(proc: psutil.Process) -> float:
    """CPU of the stand-in executor's token thread in ``proc`` (cpu_engine/trtllm_executor.py names it): on a GPU
    that work is the GPU's, so it is reported apart from the serving path."""
    from cpu_engine.trtllm_executor import TOKEN_THREAD_NAME

    total = 0.0
    for thread in proc.threads():
        try:
            if Path(f"/proc/{proc.pid}/task/{thread.id}/comm").read_text().strip() == TOKEN_THREAD_NAME:
                total += thread.user_time + thread.system_time
        except OSError:
            continue
    return total


def tree_cpu(pid: int) -> dict[str, float]:
    """user + system seconds of ``pid`` and its descendants, by label (the stand-in's token thread apart)."""
    root = psutil.Process(pid)
    seconds: dict[str, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            standin = _standin_seconds(proc)
        except psutil.Error:
            continue
        label = _label(proc)
        seconds[label] = seconds.get(label, 0.0) + t.user + t.system - standin
        if standin:
            seconds[STANDIN] = seconds.get(STANDIN, 0.0) + standin
    return seconds


def perf_analyzer_run(pa, grpc_url: str, data: Path, streams: int, requests: int) -> None:
    argv = [str(pa.binary), "-m", "ensemble", "-i", "grpc", "-u", grpc_url, "--streaming", "--input-data",
            str(data), "--concurrency-range", str(streams), "--request-count", str(requests)]
    proc = subprocess.run(argv, env=pa.env(), capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def measure_layout(layout: str, interval_ms: float, streams_levels: list[int], tokens: int, per_stream: int,
                   step_ms: float, engine: Path, tokenizer: Path, workdir: Path) -> list[Row]:
    from loadtest.tools import perf_analyzer
    from serving.launcher import ServerConfig, TritonServer

    pa = perf_analyzer()
    data = workdir / "input.json"
    data.write_text(json.dumps({"data": [{"text_input": [PROMPT], "max_tokens": [tokens], "stream": [True]}]}))
    top = max(streams_levels)
    bench_engine = null_engine_dir(engine, top, workdir / "engine")
    name = f"{layout}-{interval_ms:g}ms"
    repo = render_null_repository(layout, bench_engine, tokenizer, top, step_ms, interval_ms, workdir / f"repo-{name}")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=workdir / f"tritonserver-{name}.log")
    rows = []
    with TritonServer(config, ready_timeout=300) as server:
        perf_analyzer_run(pa, server.urls.grpc, data, 1, 2)  # warm-up: first requests load lazy code paths
        for streams in streams_levels:
            requests = streams * per_stream
            before, start = tree_cpu(server.process.pid), time.monotonic()
            perf_analyzer_run(pa, server.urls.grpc, data, streams, requests)
            wall, after = time.monotonic() - start, tree_cpu(server.process.pid)
            by = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in after}
            serving = sum(v for k, v in by.items() if k != STANDIN)
            row = Row(layout, interval_ms, streams, requests, requests * tokens, round(wall, 2), round(serving, 3), by)
            print(f"{layout:15} {interval_ms:4g} ms {streams:4} streams: {row.us_per_token:7.1f} µs CPU/token, "
                  f"{row.tokens_per_core_s:8.0f} tokens/s per core ({by})", flush=True)
            rows.append(row)
    return rows


def table(rows: list[Row]) -> str:
    lines = ["| layout | stream interval | streams | tokens | wall s | CPU s | µs CPU / token | tokens/s per core | "
             "where the CPU went | "
             "stand-in tokens, µs / token (apart) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        where = ", ".join(f"{k} {v / r.cpu_s:.0%}" for k, v in sorted(r.cpu_by_process.items(), key=lambda kv: -kv[1])
                          if k != STANDIN and v / r.cpu_s >= 0.01)
        standin = r.cpu_by_process.get(STANDIN)
        lines.append(f"| {r.layout} | {r.stream_interval_ms:g} ms | {r.streams} | {r.tokens} | {r.wall_s:.1f} | "
                     f"{r.cpu_s:.2f} | "
                     f"{r.us_per_token:.1f} | {r.tokens_per_core_s:,.0f} | {where} | "
                     f"{'' if standin is None else f'{1e6 * standin / r.tokens:.1f}'} |")
    return "\n".join(lines)


def plot(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for layout, interval in dict.fromkeys((r.layout, r.stream_interval_ms) for r in rows):
        mine = [r for r in rows if (r.layout, r.stream_interval_ms) == (layout, interval)]
        ax.plot([r.streams for r in mine], [r.us_per_token for r in mine], marker="o",
                label=f"{layout}, stream interval {interval:g} ms")
    ax.axhline(GOAL_US, color="grey", linestyle="--", label=f"goal: {GOAL_US:g} µs at {GOAL_STREAMS} streams")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("CPU µs per streamed token (server tree)")
    ax.set_title("Serving path cost per token, null token source")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.cost_per_token", description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", nargs="+", default=["cpu", "trtllm-standin"])
    p.add_argument("--streams", nargs="+", type=int, default=[1, 16, 64, 256])
    p.add_argument("--tokens", type=int, default=256, help="tokens per request (max_tokens)")
    p.add_argument("--requests-per-stream", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=5.0,
                   help="the null source's decode iteration (a fast GPU: 200 tokens/s per stream); 0: no pause")
    p.add_argument("--stream-interval-ms", nargs="+", type=float,
                   default=[LLMStage.model_fields["stream_interval_ms"].default],
                   help="the llm's hold between a stream's responses, one pass each (default: the profile's)")
    p.add_argument("--engine", type=Path, default=DEFAULT_ENGINE)
    p.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="writes OUT.json and OUT.png")
    a = p.parse_args(argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="cost-per-token-") as tmp:
        for layout in a.layouts:
            for interval in a.stream_interval_ms:
                rows += measure_layout(layout, interval, a.streams, a.tokens, a.requests_per_stream, a.step_ms,
                                       a.engine, a.tokenizer, Path(tmp))
    print(table(rows))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    conditions = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": psutil.cpu_count(),
                  "cpu": platform.processor() or platform.machine(), "load_average_1m": psutil.getloadavg()[0],
                  "tokens_per_request": a.tokens, "requests_per_stream": a.requests_per_stream, "null_step_ms": a.step_ms}
    Path(f"{a.out}.json").write_text(json.dumps(
        {"conditions": conditions, "goal_us_per_token_at_64": GOAL_US,
         "rows": [dict(asdict(r), us_per_token=r.us_per_token, tokens_per_core_s=r.tokens_per_core_s)
                  for r in rows]}, indent=1) + "\n")
    plot(rows, Path(f"{a.out}.png"))
    print(f"wrote {a.out}.json and {a.out}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
