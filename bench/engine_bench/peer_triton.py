"""Peer: the same engine behind a real tritonserver (ensemble: tokenizer → llm → detokenizer), concurrent gRPC
streams from ``client.AsyncLLMClient``; also the CPU by process and the llm stub's RSS."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from bench.engine_bench.models import BenchModel
from bench.engine_bench.noise import MONITOR, noise_fields
from bench.engine_bench.options import PROJECT_ROOT, Options
from bench.engine_bench.records import streams_record


def bench_triton(model: BenchModel, variant: str, engine_dir: Path, opts: Options) -> list[dict]:
    from builders.profile import LLMStage, ServingProfile
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    profile = ServingProfile.from_yaml(PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml",
                                       engine_dir=str(engine_dir), tokenizer_dir=str(model.checkpoint))
    llm = {**profile.llm.model_dump(), "cpu_threads": opts.threads}
    if opts.stream_interval_ms is not None:
        llm["stream_interval_ms"] = opts.stream_interval_ms
    profile = profile.model_copy(update={"llm": LLMStage(**llm)})
    repo = render_repository(profile, opts.work_dir / "repos" / f"{model.name}-{variant}")
    log = opts.work_dir / "logs" / f"triton-{model.name}-{variant}.log"
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=log)
    t0 = time.perf_counter()
    with TritonServer(config, ready_timeout=300) as server:
        ready_s = time.perf_counter() - t0
        url = server.urls.grpc
        n, prompts = opts.new_tokens, model.prompts
        base = {"model": model.name, "peer": "triton", "variant": variant, "server_ready_s": ready_s,
                "stream_interval_ms": profile.llm.stream_interval_ms}
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
