"""The benchmark's command line: which models, variants, peers and stream levels, and the quick defaults."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from builders.cpu_build import VARIANTS as BUILD_VARIANTS

PROJECT_ROOT = Path(__file__).resolve().parents[2]
MODEL_NAMES = ("default", "llama-100m")
VARIANTS = BUILD_VARIANTS  # one list: what the builder makes is what gets benchmarked
GGUF_TYPES = ("f32", "f16", "q8_0", "q4_1")
PEERS = ("hf", "engine", "triton", "llama.cpp", "llama-server")

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
    stream_interval_ms: float | None  # the Triton llm's; None: the profile's
    work_dir: Path
    out_md: Path
    out_json: Path
    noise_threshold: float
    rerun_noisy: bool
    budget_minutes: float
    wait_quiet: float
    quick: bool
    command: str


def parse_args(argv: list[str] | None, description: str | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m bench.engine_bench", description=description,
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
    p.add_argument("--stream-interval-ms", type=float,
                   help="the Triton llm's hold between a stream's responses (default: builders/profiles/cpu.yaml's)")
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
        threads=a.threads, stream_interval_ms=a.stream_interval_ms, work_dir=a.work_dir,
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
