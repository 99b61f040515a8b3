"""Peer: llama.cpp's own ``llama-server``, continuous batching over ``--parallel`` slots (bench/llama_server_peer.py
runs it), every stream level on one server."""

from __future__ import annotations

from pathlib import Path

from bench.engine_bench.models import BenchModel, say
from bench.engine_bench.noise import MONITOR
from bench.engine_bench.options import PROJECT_ROOT, Options
from bench.engine_bench.records import streams_record
from bench.llama_server_peer import BUILD_HINT as LLAMA_SERVER_HINT
from bench.llama_server_peer import LLAMA_SERVER
from bench.llama_server_peer import run as run_llama_server


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
