"""``python -m loadtest report-serving``: measure the default model and rewrite ``docs/benchmarks/serving.md``.

One re-runnable command: renders a model repository from the serving profile (``builders/profiles/cpu.yaml``)
into the results folder, starts tritonserver on free ports (with a trace file, tracing off), runs the
``concurrency`` profile (1/4/8/16 streams), a traced diagnosis at 8 streams, a short locust run and optionally
genai-perf, then writes ``loadtest/results/serving-report/`` (replaced each time) and the markdown document.
With ``--url`` it measures an already running server instead (no trace unless that server has a trace file).

The OpenAI front door (issue 14): on its own server, the report also starts ``python -m serving openai`` on a
free port in front of it and measures it against direct gRPC streaming side by side (``loadtest.openai_bench``:
TTFT P50 overhead at 1 stream, throughput ratio at 16 streams), runs the locust HTTP/SSE user against it and,
with ``--genai-perf``, genai-perf's ``--endpoint-type chat`` at 16 streams. ``--no-openai`` leaves it out.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from serving.machine import cpu_model

from .results import LevelResult
from .spec import PROJECT_ROOT, level_str, load_profile
from .sweep import RESULTS_DIR, git_describe, loadavg

REPORT_DIR = RESULTS_DIR / "serving-report"
OVERHEAD_TARGET_MS = 1.0


@dataclass
class ServingReportOptions:
    url: str | None = None
    metrics_url: str | None = None
    http_url: str | None = None
    tokenizer: Path | None = None
    repository: Path = PROJECT_ROOT / "build" / "model_repository"  # only used with --url (for config info)
    doc: Path = PROJECT_ROOT / "docs" / "benchmarks" / "serving.md"
    levels: list[float] | None = None
    quick: bool = False
    with_genai_perf: bool = False
    with_locust: bool = True
    with_openai: bool = True
    profile_front_door: bool = True  # cProfile pass when a goal is missed
    front_url: str | None = None  # with --url: a running front door to compare (else one is started)
    serving_profile: Path = PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml"
    out_dir: Path = REPORT_DIR
    command: str = ""


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(Path(path).resolve(), Path(start).resolve().parent)


def _f(v: float | None, d: int = 1) -> str:
    return "–" if v is None else f"{v:.{d}f}"


def overhead(r: LevelResult) -> dict:
    """Triton's own time per request (ms) from perf_analyzer's server breakdown at one level: the ensemble's
    queue + compute input + compute output (summed over its composing invocations), and per invocation."""
    s = r.server
    per_request = sum((s.get(k) or 0.0) for k in ("queue_us", "compute_input_us", "compute_output_us")) / 1000
    base = s.get("inferences_per_s") or 0.0
    models = {}
    for name, c in r.composing.items():
        calls = (c.get("inferences_per_s") or 0.0) / base if base else None
        models[name] = {"calls_per_request": calls,
                        "queue_ms": (c.get("queue_us") or 0) / 1000,
                        "input_output_ms": ((c.get("compute_input_us") or 0) + (c.get("compute_output_us") or 0)) / 1000,
                        "infer_ms": (c.get("compute_infer_us") or 0) / 1000}
    return {"per_request_ms": per_request, "models": models}


def run_serving_report(opts: ServingReportOptions) -> int:
    from builders.profile import ServingProfile
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    from .diagnose import DiagnoseOptions, read_repository, run_diagnose
    from .locust_run import LocustOptions, run_locust
    from .slo import EXIT_ERROR
    from .sweep import run_sweep

    profile = load_profile("concurrency")
    if opts.levels:
        profile = profile.with_overrides(levels=opts.levels)
    if opts.quick:  # the report machinery itself, in seconds (tests): fixed request counts, few prompts
        profile = profile.with_overrides(request_count=8, num_prompts=8)
        profile = profile.model_copy(update={"measurement": profile.measurement.model_copy(
            update={"requests_per_stream": 2, "warmup_requests": 1})})
    out = Path(opts.out_dir)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    started = datetime.now().isoformat(timespec="seconds")
    t0 = time.monotonic()
    load_before = loadavg()
    server = None
    repo = opts.repository
    serving_profile = None
    if opts.url is None:
        serving_profile = ServingProfile.from_yaml(opts.serving_profile)
        repo = render_repository(serving_profile, out / "model_repository")
        trace_file = out / "diagnose-trace" / "trace.json"
        trace_file.parent.mkdir()
        cfg = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                           log_file=out / "tritonserver.log",
                           extra_args=["--trace-config", "mode=triton", "--trace-config", f"triton,file={trace_file}",
                                       "--trace-config", "level=OFF", "--trace-config", "rate=1"])
        server = TritonServer(cfg, ready_timeout=600)
        print("report-serving: starting tritonserver ...", file=sys.stderr, flush=True)
        server.start()
        server.wait_ready()
        grpc, metrics_url, http = server.urls.grpc, server.urls.metrics, server.urls.http
    else:
        from .commands import Endpoints

        ep = Endpoints.from_grpc(opts.url)
        grpc, metrics_url, http = opts.url, opts.metrics_url or ep.metrics, opts.http_url or ep.http
    config = read_repository(repo)
    tokenizer = opts.tokenizer or next((Path(m["parameters"]["tokenizer_dir"]) for m in config.values()
                                        if m.get("parameters", {}).get("tokenizer_dir")), None)
    engine_dir = next((Path(m["parameters"]["engine_dir"]) for m in config.values()
                       if m.get("parameters", {}).get("engine_dir")), None)
    engine_cfg = json.loads((engine_dir / "config.json").read_text()) if engine_dir and (
        engine_dir / "config.json").exists() else {}
    diag = loc = genai = None
    oa: dict | None = None
    try:
        sweep = run_sweep(profile, url=grpc, metrics_url=metrics_url, tokenizer=tokenizer, out_dir=out / "sweep")
        diag_conc = 8 if 8 in profile.load.levels else int(max(profile.load.levels))
        try:
            diag = run_diagnose(DiagnoseOptions(url=grpc, metrics_url=metrics_url, http_url=http,
                                                concurrency=diag_conc, requests=8 if opts.quick else 32,
                                                max_tokens=64, prompt_tokens=128, tokenizer=tokenizer,
                                                out_dir=out / "diagnose"))
        except Exception as exc:  # noqa: BLE001 - the benchmark stands without the diagnosis
            print(f"report-serving: diagnose failed: {exc}", file=sys.stderr)
        if opts.with_locust:
            loc = run_locust(LocustOptions(url=grpc, users=4, spawn_rate=4, run_time_s=5 if opts.quick else 20,
                                           max_requests=10 if opts.quick else 200, prompt_tokens=128, max_tokens=64,
                                           tokenizer=tokenizer, out_dir=out / "locust"))
        if opts.with_genai_perf:
            from .tools import genai_perf_binary

            if genai_perf_binary() is None:
                print("report-serving: genai-perf not installed (python -m loadtest setup --genai-perf); skipped",
                      file=sys.stderr)
            else:
                gp = profile.with_overrides(levels=[float(diag_conc)])
                genai = run_sweep(gp, url=grpc, metrics_url=metrics_url, tokenizer=tokenizer, tool="genai-perf",
                                  out_dir=out / "genai-perf", progress=False)
        if opts.with_openai:
            try:
                oa = run_openai_section(opts, grpc, metrics_url, tokenizer, out)
            except Exception as exc:  # noqa: BLE001 - the Triton benchmark stands without the front door's
                print(f"report-serving: OpenAI front door benchmark failed: {exc}", file=sys.stderr)
                oa = {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        if server is not None:
            print("report-serving: stopping tritonserver ...", file=sys.stderr, flush=True)
            server.stop()
    meta = {"started": started, "wall_s": time.monotonic() - t0, "loadavg_before": load_before,
            "loadavg_after": loadavg(), "git": git_describe(), "cpus": os.cpu_count(),
            "cpu_model": cpu_model(), "python": platform.python_version(), "url": opts.url or "own server",
            "command": opts.command}
    doc = document(opts, profile, sweep, diag, loc, genai, meta, config, engine_cfg, serving_profile, oa)
    opts.doc.parent.mkdir(parents=True, exist_ok=True)
    opts.doc.write_text(doc)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"report-serving: wrote {opts.doc} and {out}")
    return EXIT_ERROR if all(not r.ok for r in sweep.results) else 0


def run_openai_section(opts: ServingReportOptions, grpc: str, metrics_url: str | None, tokenizer: Path | None,
                       out: Path) -> dict:
    """Front door vs direct gRPC (side by side), locust's HTTP/SSE user, genai-perf chat (optional)."""
    from .locust_run import LocustOptions, run_locust
    from .openai_bench import FrontDoor, OpenAIBenchOptions, profile_front_door, run_openai_bench
    from .spec import DEFAULT_TOKENIZER

    tok = Path(tokenizer or DEFAULT_TOKENIZER)
    oa_dir = out / "openai"
    oa_dir.mkdir(parents=True, exist_ok=True)
    front = None
    front_url = opts.front_url
    if front_url is None:
        print("report-serving: starting the OpenAI front door ...", file=sys.stderr, flush=True)
        front = FrontDoor(grpc, log_file=oa_dir / "front-door.log")
        front_url = front.url
    result: dict = {"front_url": front_url}
    try:
        bench = OpenAIBenchOptions(grpc_url=grpc, front_url=front_url, tokenizer=tok, out_dir=oa_dir)
        if opts.quick:
            bench.ttft_pairs, bench.rounds, bench.warmup_s, bench.window_s = 4, 2, 1.0, 2.0
            bench.streams, bench.max_tokens, bench.prompt_tokens = min(bench.streams, 4), 8, 16
        result["bench"] = run_openai_bench(bench)
        result["streams"] = bench.streams
        result["locust"] = run_locust(LocustOptions(
            url=front_url, openai="chat", users=4, spawn_rate=4, run_time_s=5 if opts.quick else 20,
            max_requests=8 if opts.quick else 200, prompt_tokens=16 if opts.quick else 128,
            max_tokens=8 if opts.quick else 64, tokenizer=tok, out_dir=oa_dir / "locust"))
        if opts.with_genai_perf:
            from .tools import genai_perf_binary
            from .sweep import run_sweep

            if genai_perf_binary() is not None:
                gp = load_profile("openai-chat").with_overrides(levels=[16.0] if not opts.quick else [2.0],
                                                                model=result["bench"]["result"]["model"])
                if opts.quick:
                    gp = gp.with_overrides(request_count=4, num_prompts=4)
                result["genai"] = run_sweep(gp, url=front_url, metrics_url=None, tokenizer=tok,
                                            out_dir=oa_dir / "genai-perf-chat", progress=False)
    finally:
        if front is not None:
            result["front_exit"] = front.stop()
    summary = result["bench"]["summary"]
    missed = not all(t["met"] for t in summary["ttft"].values()) or not (summary.get("throughput") or {}).get("met")
    if missed and opts.profile_front_door and not opts.quick:
        try:
            result["profile"] = profile_front_door(grpc, oa_dir, tok)
        except Exception as exc:  # noqa: BLE001
            result["profile"] = [f"profiling failed: {exc}"]
    return result


def openai_lines(oa: dict, doc: Path) -> list[str]:
    from .openai_bench import table

    lines = ["", "## OpenAI front door vs direct gRPC (issue 14; side by side in this run)", ""]
    if "error" in oa and "bench" not in oa:
        return lines + [f"Not measured: {oa['error']}"]
    bench = oa["bench"]
    o = bench["options"]
    m = bench["meta"]
    lines += [f"The same Triton server, both paths alternating in one process (`loadtest/openai_bench.py`): "
              f"`python -m serving openai` on a free port vs the project's asyncio gRPC client "
              f"(`client.AsyncLLMClient`, the client the front door itself uses). 1 stream: {o['ttft_pairs']} "
              f"pairs per route, each pair the same {o['ttft_prompt_tokens']}-token prompt, max_tokens "
              f"{o['ttft_max_tokens']}, alternating which path goes first; TTFT = request written → first non-empty "
              f"text (gRPC delta / SSE content chunk). {oa['streams']} streams: {o['rounds']} rounds of one phase per "
              f"path (ABBA), {o['warmup_s']:g} s warm-up then a {o['window_s']:g} s window, "
              f"{o['prompt_tokens']}-token user messages, max_tokens {o['max_tokens']} (greedy; OpenAI has no "
              f"min_tokens, so both paths generate what the model says, up to that). "
              f"{m['wall_s']:.0f} s; load average {m['loadavg_before']} before, {m['loadavg_after']} after.", ""]
    lines += table(bench["result"], bench["summary"], oa["streams"])
    lines += [""]
    for route, r in bench["result"]["ttft"].items():
        fd = r.get("front_door_ttft_mean_ms")
        g, h = r["grpc_ttft_ms"].get("mean"), r["http_ttft_ms"].get("mean")
        if fd is not None and g is not None and h is not None:
            lines.append(f"- {route}, where the mean TTFT difference goes ({h - g:+.2f} ms): the HTTP/ASGI edge "
                         f"(client TTFT {h:.2f} ms − the front door's own `openai_time_to_first_token_seconds` "
                         f"{fd:.2f} ms) = {h - fd:+.2f} ms; inside the front door (its TTFT − direct gRPC TTFT "
                         f"{g:.2f} ms: validation, its own gRPC call, task hand-offs) = {fd - g:+.2f} ms.")
    for ph in bench["result"]["throughput"]:
        lines.append(f"- round {ph['round']}, {ph['path']}: {ph['tokens_per_s']:.1f} tok/s, "
                     f"{ph['requests_per_s']:.2f} req/s, {ph['mean_output_tokens']:.1f} tokens/request, "
                     f"TTFT P50 {ph['ttft_ms'].get('p50', 0) or 0:.0f} ms, {ph['errors']} errors")
    if oa.get("profile"):
        lines += ["", "A goal was missed, so the report profiled the front door: cProfile in a second front door "
                  "process (a separate, unmeasured pass, switched on only while its requests ran; "
                  f"`{_rel(Path(o['out_dir']) / 'front-door-profile.txt', doc)}`):", "", "```"]
        lines += oa["profile"] + ["```"]
    loc = oa.get("locust")
    if loc is not None:
        t = loc.timings or {}
        lines += ["", f"locust, OpenAI HTTP/SSE user (`loadtest/locustfile_openai.py`, /v1/chat/completions, 4 users): "
                  f"{loc.requests} requests, **{loc.failures} failures**; TTFT P50/P99 "
                  f"{_f((t.get('ttft_ms') or {}).get('p50'))} / {_f((t.get('ttft_ms') or {}).get('p99'))} ms, "
                  f"TPOT P50/P99 {_f((t.get('tpot_ms') or {}).get('p50'), 2)} / "
                  f"{_f((t.get('tpot_ms') or {}).get('p99'), 2)} ms. CSV: `{_rel(loc.out_dir / 'locust_stats.csv', doc)}`."]
    genai = oa.get("genai")
    if genai is not None and genai.results:
        g = genai.results[0]
        lines += ["", f"genai-perf 0.0.16, `--endpoint-type chat --streaming` at {level_str(g.level)} streams "
                  f"(profile `loadtest/profiles/openai-chat.yaml`): "
                  + (f"{_f(g.throughput_rps, 2)} req/s, {_f(g.output_tokens_per_s, 1)} output tok/s, TTFT P50/P99 "
                     f"{_f(g.ttft.p50)} / {_f(g.ttft.p99)} ms, inter-token P50 {_f(g.tpot.p50, 2)} ms "
                     f"({g.requests} requests)." if g.ok else f"failed: {g.error}")]
        if genai.meta.get("commands"):
            lines += ["", "```", genai.meta["commands"][0].replace(str(PROJECT_ROOT) + "/", ""), "```"]
    return lines


def document(opts, profile, sweep, diag, loc, genai, meta, config, engine_cfg, serving_profile, oa=None) -> str:
    doc = opts.doc
    out = sweep.out_dir.parent
    results = sweep.results
    by_level = {r.level: r for r in results}
    build = engine_cfg.get("build_config", {})
    pc = engine_cfg.get("pretrained_config", {})
    quant = (pc.get("quantization") or {}).get("quant_algo")
    cmd = meta["command"] or "python -m loadtest report-serving"
    lines = [
        "# Serving benchmarks (CPU engine, default model)",
        "",
        "<!-- Generated by `python -m loadtest report-serving`: edit loadtest/serving_report.py, not this file. -->",
        "",
        f"Re-run (about {max(1, round(meta['wall_s'] / 60))} minutes on 2 cores; replaces this file and `{_rel(out, doc)}/`):",
        "",
        "```bash",
        f".venv/bin/{cmd}" if cmd.startswith("python ") else cmd,
        "```",
        "",
        f"- measured: {meta['started']} ({meta['wall_s']:.0f} s), code {meta['git']}",
        f"- machine: {meta['cpus']} CPUs ({meta['cpu_model']}), Python {meta['python']}; **shared with other work**: "
        f"load average {meta['loadavg_before']} before, {meta['loadavg_after']} after (1/5/15 min). "
        "Anything else running on these 2 cores (colleagues' test suites) inflates latencies and lowers throughput; "
        "compare runs only with similar load averages.",
        f"- engine: `{Path(engine_cfg.get('source_checkpoint', '?')).name}` checkpoint, {pc.get('architecture', '?')} "
        f"{pc.get('num_hidden_layers', '?')} layers × {pc.get('hidden_size', '?')}, dtype {pc.get('dtype', '?')}"
        f"{', quantisation ' + quant if quant else ''}; {build.get('max_batch_size', '?')} slots, "
        f"max_num_tokens {build.get('max_num_tokens', '?')}, max_seq_len {build.get('max_seq_len', '?')}",
        "- serving: " + (", ".join(f"{n} × {c['instances']}" for n, c in config.items() if n != "ensemble")
                          or "?") + (f" instances (profile `{_rel(opts.serving_profile, doc)}`)" if serving_profile
                                     else f" (server at {meta['url']})"),
        f"- load: profile `loadtest/profiles/{profile.name}.yaml`: {sweep.meta['inputs'].get('prompt_tokens_mean', 0):.0f}-token "
        f"prompts, exactly {sweep.meta['inputs'].get('output_tokens_mean', 0):.0f} output tokens "
        f"(min_tokens = max_tokens), streaming over gRPC, perf_analyzer 2.51 "
        + ("(quick mode: a few requests per level, not a benchmark)" if opts.quick else
           f"({profile.measurement.max_trials} windows of {profile.measurement.interval_ms / 1000:g} s per level)"),
        "",
        "## Throughput, TTFT and TPOT by concurrent streams",
        "",
        "| streams | throughput (req/s) | output tok/s | TTFT P50 / P99 (ms) | TPOT P50 / P99 (ms) | "
        "latency P50 / P99 (ms) | requests |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if not r.ok:
            lines.append(f"| {level_str(r.level)} | failed: {r.error} | | | | | |")
            continue
        lines.append(f"| {level_str(r.level)} | {_f(r.throughput_rps, 2)} | {_f(r.output_tokens_per_s, 0)} | "
                     f"{_f(r.ttft.p50)} / {_f(r.ttft.p99)} | {_f(r.tpot.p50, 2)} / {_f(r.tpot.p99, 2)} | "
                     f"{_f(r.latency.p50, 0)} / {_f(r.latency.p99, 0)} | {r.requests} |")
    one = by_level.get(1.0) or (results[0] if results else None)
    if one is not None and one.ok and by_level.get(max(by_level)) and by_level[max(by_level)].ok:
        top = by_level[max(by_level)]
        if one.throughput_rps and top.throughput_rps:
            lines += ["", f"Scaling: {level_str(top.level)} streams give {top.throughput_rps / one.throughput_rps:.2f}× "
                      f"the throughput of {level_str(one.level)} stream(s), with {_f((top.tpot.p50 or 0) / (one.tpot.p50 or 1), 2)}× "
                      f"the TPOT P50 and {_f((top.ttft.p50 or 0) / (one.ttft.p50 or 1), 2)}× the TTFT P50."]
    # SLO at 8 streams
    lines += ["", "## SLO at 8 streams: P99 TTFT ≤ 100 ms, P99 TPOT ≤ 20 ms", ""]
    if sweep.checks:
        for c in sweep.checks:
            if c.metric in ("ttft_p99_ms", "tpot_p99_ms"):
                verdict = "met" if c.ok else (f"**missed**: {c.value:.1f} ms, {c.value / c.limit:.2f}× the limit "
                                              f"({c.value - c.limit:+.1f} ms)" if c.value is not None else "not measured")
                lines.append(f"- {c.metric.replace('_p99_ms', '').upper()} P99 at {level_str(c.level)} streams: "
                             f"{_f(c.value)} ms (limit {c.limit:g} ms): {verdict}")
    else:
        lines.append("- 8 streams were not measured in this run.")
    # Triton overhead
    lines += ["", "## Triton overhead per request at 1 stream (target ≤ 1 ms)", ""]
    if one is not None and one.ok and one.server:
        ov = overhead(one)
        per_request = ov["per_request_ms"]
        verdict = "meets the 1 ms target" if per_request <= OVERHEAD_TARGET_MS else \
            f"misses the 1 ms target: {per_request / OVERHEAD_TARGET_MS:.1f}×"
        lines += [f"Ensemble queue + compute input + compute output, per request: **{per_request:.2f} ms** "
                  f"({verdict}). perf_analyzer sums "
                  "these over the ensemble's composing invocations (preprocessing and llm, once each per request; "
                  "the llm streams every response, text included, from its own sender thread); per invocation:", "",
                  "| model | calls / request | queue (ms) | compute input + output (ms) | compute infer (ms) |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for name, m in sorted(ov["models"].items()):
            lines.append(f"| {name} | {_f(m['calls_per_request'], 1)} | {m['queue_ms']:.3f} | {m['input_output_ms']:.3f} | "
                         f"{m['infer_ms']:.3f} |")
        per_call = {n: m["queue_ms"] + m["input_output_ms"] for n, m in ov["models"].items()}
        if per_call:
            worst = max(per_call, key=per_call.get)
            lines += ["", f"Per invocation, Triton's queue + input + output time is at most {per_call[worst]:.2f} ms "
                      f"({worst}; {'within' if per_call[worst] <= OVERHEAD_TARGET_MS else 'over'} 1 ms)."]
        lines += ["", "The llm model's compute infer is only the enqueue into the CPU engine; generation time is "
                  "outside Triton's timers and appears in the client-side TTFT/TPOT above."]
    # diagnosis
    if diag is not None:
        total = sum(diag.layers.values()) or 1
        lines += ["", f"## Where the time goes at {level_str(float(diag_conc_of(diag)))} streams (`python -m loadtest diagnose`)", "",
                  f"Source: {diag.source}. Dominant layer: **{diag.dominant_layer}**.", "",
                  "| layer | ms per request | share |", "| --- | ---: | ---: |"]
        lines += [f"| {k} | {v:.2f} | {100 * v / total:.1f}% |" for k, v in diag.layers.items()]
        lines += [""] + [f"- {a}" for a in diag.advice]
    # locust
    if loc is not None:
        t = loc.timings or {}
        lines += ["", "## locust (gRPC streaming user, 4 users)", "",
                  f"{loc.requests} requests, **{loc.failures} failures**; TTFT P50/P99 "
                  f"{_f((t.get('ttft_ms') or {}).get('p50'))} / {_f((t.get('ttft_ms') or {}).get('p99'))} ms, "
                  f"TPOT P50/P99 {_f((t.get('tpot_ms') or {}).get('p50'), 2)} / {_f((t.get('tpot_ms') or {}).get('p99'), 2)} ms, "
                  f"latency P99 {_f((t.get('latency_ms') or {}).get('p99'), 0)} ms. "
                  f"CSV: `{_rel(loc.out_dir / 'locust_stats.csv', doc)}` (HTML report written next to it, not kept "
                  "in git)."]
    if genai is not None and genai.results:
        g = genai.results[0]
        lines += ["", f"## genai-perf 0.0.16 at {level_str(g.level)} streams (cross-check)", "",
                  f"{_f(g.throughput_rps, 2)} req/s, TTFT P50/P99 {_f(g.ttft.p50)} / {_f(g.ttft.p99)} ms, "
                  f"TPOT P50/P99 {_f(g.tpot.p50, 2)} / {_f(g.tpot.p99, 2)} ms (from its profile export)."]
    if oa is not None:
        lines += openai_lines(oa, doc)
    plots = sorted((out / "sweep").glob("*.png"))
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({_rel(p, doc)})" for p in plots]
    raw = str(out / "sweep" / "raw")
    lines += ["", "## Exact commands", "", "perf_analyzer, one run per level, run inside "
              f"`{_rel(out / 'sweep' / 'raw', doc)}` (it names the composing models' CSVs after `-f`):", "", "```"]
    lines += [c.replace(raw + "/", "").replace(str(out / "sweep") + "/", "../").replace(str(PROJECT_ROOT) + "/", "")
              for c in sweep.meta["commands"]]
    lines += ["```", ""]
    if loc is not None:
        cmd_file = loc.out_dir / "command.txt"
        if cmd_file.exists():
            lines += ["locust:", "", "```", cmd_file.read_text().strip().replace(str(PROJECT_ROOT) + "/", ""), "```", ""]
    lines += ["Other single commands: `python -m loadtest sweep --profile NAME --url localhost:8001` "
              "(profiles: smoke, concurrency, poisson, long-prompt, streaming), `python -m loadtest diagnose`, "
              "`python -m loadtest tune`, `python -m loadtest locust --url localhost:8001`; the OpenAI front door "
              "(`make serve`: port 9000): `python -m loadtest genai-perf --profile openai-chat --url localhost:9000` "
              "(or `openai-completions`), `python -m loadtest locust --openai chat --url localhost:9000`, "
              "`python -m loadtest openai-bench --url localhost:8001 --front-url http://localhost:9000 "
              "[--profile-front-door]`.", ""]
    # Measured by its own command and kept in its own file, so that this rewrite does not drop it.
    lines += ["## Serving path cost per token, both layouts", "",
              "CPU per streamed token of each layout with the `null` token source "
              "(`python -m loadtest.cost_per_token`): [serving-cost.md](serving-cost.md).", ""]
    return "\n".join(lines)


def diag_conc_of(diag) -> float:
    try:
        profile_yaml = (diag.out_dir / "load" / "profile.yaml").read_text()
        import yaml

        return float(yaml.safe_load(profile_yaml)["load"]["levels"][0])
    except (OSError, KeyError, ValueError, TypeError):
        return 8.0
