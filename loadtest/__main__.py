"""``python -m loadtest``: measure the served model (perf_analyzer, genai-perf, locust), find its bottleneck,
tune its batching.

Exit codes: 0 = done and every SLO met; 1 = an SLO was missed; 2 = the measurement could not be made
(tool missing, server unreachable, bad profile or arguments).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .slo import EXIT_ERROR
from .spec import PROJECT_ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _levels(text: str | None) -> list[float] | None:
    if not text:
        return None
    return [float(v) for v in text.replace(" ", "").split(",") if v]


def _endpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("LOADTEST_URL", "localhost:8001"),
                   help="Triton gRPC host:port (default localhost:8001, or $LOADTEST_URL); for OpenAI profiles "
                        "(openai-chat, openai-completions) and locust --openai: the front door's host:port "
                        "(default localhost:9000)")
    p.add_argument("--metrics-url", default=None,
                   help="Prometheus URL (default: http://<host>:<gRPC port + 1>/metrics); 'none' to skip")


def _metrics_url(args) -> str | None:
    from .commands import Endpoints

    if args.metrics_url and args.metrics_url.lower() == "none":
        return None
    return args.metrics_url or Endpoints.from_grpc(args.url).metrics


def _url(args, profile) -> str:
    """--url; for an OpenAI profile without --url, the front door's default port (9000) instead of gRPC 8001."""
    if profile.openai and not args.url_given:
        return "localhost:9000"
    return args.url


def _profile(args):
    from .spec import load_profile

    profile = load_profile(args.profile)
    profile = profile.with_overrides(levels=_levels(getattr(args, "levels", None)),
                                     request_count=getattr(args, "request_count", None),
                                     num_prompts=getattr(args, "num_prompts", None),
                                     model=getattr(args, "model", None))
    if getattr(args, "no_stream", False):
        profile = profile.model_copy(update={"streaming": False})
    return profile


def cmd_setup(args) -> int:
    from .tools import GENAI_PERF_VENV, setup_genai_perf, setup_perf_analyzer

    pa = setup_perf_analyzer()
    print(f"perf_analyzer: {pa.binary} ({pa.version()}), libraries in {pa.lib_dir}")
    if args.genai_perf:
        print(f"genai-perf: installing into {GENAI_PERF_VENV} (once; about 1 GB) ...", flush=True)
        binary = setup_genai_perf()
        print(f"genai-perf: {binary}")
    return 0


def cmd_profiles(args) -> int:
    from .spec import available_profiles, load_profile

    for name in available_profiles():
        p = load_profile(name)
        levels = ", ".join(f"{v:g}" for v in p.load.levels)
        print(f"{name:12s} {p.load.mode} [{levels}]  {' '.join(p.description.split())[:90]}")
    return 0


def cmd_commands(args) -> int:
    from . import commands
    from .spec import DEFAULT_TOKENIZER
    from .tools import GENAI_PERF_VENV

    profile = _profile(args)
    metrics_url = _metrics_url(args)
    url = _url(args, profile)
    out = Path(args.out)
    for level in profile.load.levels:
        name = commands.level_dir_name(profile, level)
        if args.tool == "genai-perf" or profile.openai:
            argv = [str(GENAI_PERF_VENV / "bin" / "genai-perf")] + commands.genai_perf_args(
                profile, level, url=url, tokenizer=Path(args.tokenizer or DEFAULT_TOKENIZER),
                artifact_dir=out / f"{name}-genai-perf", metrics_url=metrics_url)
        else:
            argv = ["perf_analyzer"] + commands.perf_analyzer_args(
                profile, level, url=args.url, input_data=out / "inputs.json", csv=out / f"{name}.csv",
                export=out / f"{name}.profile_export.json", metrics_url=metrics_url)
        print(commands.render(argv))
    return 0


def cmd_inputs(args) -> int:
    from .inputs import describe, write_input_data
    from .spec import DEFAULT_TOKENIZER

    profile = _profile(args)
    requests = write_input_data(profile.inputs, Path(args.tokenizer or DEFAULT_TOKENIZER), Path(args.out),
                                streaming=profile.streaming)
    print(f"{args.out}: {describe(requests)}")
    return 0


def cmd_sweep(args) -> int:
    from .slo import EXIT_OK
    from .sweep import RESULTS_DIR, run_sweep

    profile = _profile(args)
    url = _url(args, profile)
    metrics_url = None if profile.openai and args.metrics_url is None else _metrics_url(args)
    outcome = run_sweep(profile, url=url, metrics_url=metrics_url,
                        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
                        out_dir=Path(args.out) if args.out else None,
                        results_root=Path(args.results_root) if args.results_root else RESULTS_DIR,
                        tool=args.tool, progress=not args.quiet, plots=not args.no_plots)
    for c in outcome.checks:
        print(c.line())
    for level in outcome.missing:
        print(f"SKIP: SLO level {level:g} was not measured in this run")
    verdict = {EXIT_OK: "SLO met", 1: "SLO NOT met"}.get(outcome.exit_code, "measurement failed")
    print(f"{verdict}; report: {outcome.out_dir / 'report.md'}")
    return outcome.exit_code


def cmd_locust(args) -> int:
    from .locust_run import LocustOptions, run_locust

    opts = LocustOptions(url=args.url, users=args.users, spawn_rate=args.spawn_rate, run_time_s=args.run_time,
                         max_requests=args.max_requests, shape=args.shape, step_users=args.step_users,
                         step_time_s=args.step_time, prompt_tokens=args.prompt_tokens,
                         max_tokens=args.max_tokens, mix=args.mix, no_stream=args.no_stream,
                         tokenizer=Path(args.tokenizer) if args.tokenizer else None,
                         out_dir=Path(args.out) if args.out else None, ttft_p99_ms=args.ttft_p99_ms,
                         tpot_p99_ms=args.tpot_p99_ms, openai=args.openai, model=args.model)
    if args.openai and not args.url_given:
        opts.url = "localhost:9000"
    result = run_locust(opts)
    print(result.text())
    return result.exit_code


def cmd_diagnose(args) -> int:
    from .diagnose import DiagnoseOptions, run_diagnose

    opts = DiagnoseOptions(url=args.url if args.url_given else None, metrics_url=args.metrics_url,
                           http_url=args.http_url, repository=Path(args.repository) if args.repository else None,
                           profile=args.profile, concurrency=args.concurrency, requests=args.requests,
                           max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens,
                           tokenizer=Path(args.tokenizer) if args.tokenizer else None,
                           out_dir=Path(args.out) if args.out else None)
    report = run_diagnose(opts)
    print(report.text())
    return 0


def cmd_tune(args) -> int:
    from .tune import TuneOptions, run_tune

    opts = TuneOptions(profile=args.profile, space=Path(args.space) if args.space else None,
                       base_profile=Path(args.base), checkpoint=Path(args.checkpoint) if args.checkpoint else None,
                       budget_s=args.budget, max_candidates=args.max_candidates, levels=_levels(args.levels),
                       out_dir=Path(args.out) if args.out else None, progress=not args.quiet)
    outcome = run_tune(opts)
    print(outcome.text())
    return outcome.exit_code


def cmd_report_serving(args) -> int:
    from .serving_report import ServingReportOptions, run_serving_report

    from .serving_report import REPORT_DIR

    import shlex

    command = "python -m loadtest " + shlex.join(args.raw_argv)
    metrics_url = None if args.metrics_url is None else _metrics_url(args)
    opts = ServingReportOptions(url=args.url if args.url_given else None, repository=Path(args.repository),
                                metrics_url=metrics_url, http_url=args.http_url,
                                tokenizer=Path(args.tokenizer) if args.tokenizer else None,
                                doc=Path(args.doc), levels=_levels(args.levels), quick=args.quick,
                                with_genai_perf=args.genai_perf, with_locust=not args.no_locust,
                                with_openai=not args.no_openai, front_url=args.front_url,
                                serving_profile=Path(args.serving_profile),
                                out_dir=Path(args.out) if args.out else REPORT_DIR, command=command)
    return run_serving_report(opts)


def cmd_openai_bench(args) -> int:
    from .openai_bench import OUT_DIR, OpenAIBenchOptions, profile_front_door, run_openai_bench, table
    from .spec import DEFAULT_TOKENIZER

    tok = Path(args.tokenizer or DEFAULT_TOKENIZER)
    opts = OpenAIBenchOptions(grpc_url=args.url, front_url=args.front_url, tokenizer=tok, ttft_pairs=args.pairs,
                              streams=args.streams, rounds=args.rounds, window_s=args.window,
                              max_tokens=args.max_tokens, out_dir=Path(args.out) if args.out else OUT_DIR)
    data = run_openai_bench(opts)
    print("\n".join(table(data["result"], data["summary"], opts.streams)))
    if args.profile_front_door:
        print("\n".join(profile_front_door(args.url, opts.out_dir, tok)))
    s = data["summary"]
    met = all(t["met"] for t in s["ttft"].values()) and (s.get("throughput") or {}).get("met", False)
    print(f"{'goals met' if met else 'goal(s) MISSED'}; files: {opts.out_dir}")
    return 0 if met else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("setup", help="set up perf_analyzer (and optionally genai-perf in its own venv)")
    p.add_argument("--genai-perf", action="store_true", help="also install genai-perf into build/tools (~1 GB)")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("profiles", help="list the load profiles in loadtest/profiles")
    p.set_defaults(func=cmd_profiles)

    def profile_args(p, default="smoke"):
        p.add_argument("--profile", default=default, help="profile name (loadtest/profiles/NAME.yaml) or path")
        p.add_argument("--levels", help="override the load levels, e.g. 1,4,8")
        p.add_argument("--request-count", type=int, help="fixed requests per level instead of time windows")
        p.add_argument("--num-prompts", type=int, help="override the number of distinct prompts")
        p.add_argument("--no-stream", action="store_true", help="send stream=false (one response per request)")
        p.add_argument("--tokenizer", help="local tokenizer directory (default: build/models/smollm2)")
        p.add_argument("--model", help="override the profile's model (OpenAI profiles: the served model id)")

    p = sub.add_parser("commands", help="print the perf_analyzer / genai-perf command lines of a profile")
    profile_args(p)
    _endpoint_args(p)
    p.add_argument("--tool", choices=["perf_analyzer", "genai-perf"], default="perf_analyzer")
    p.add_argument("--out", default="OUT", help="where the files would go (placeholder)")
    p.set_defaults(func=cmd_commands)

    p = sub.add_parser("inputs", help="write perf_analyzer --input-data JSON for a profile")
    profile_args(p)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_inputs)

    p = sub.add_parser("sweep", help="run a profile against a running server; report, plots, SLO exit code")
    profile_args(p)
    _endpoint_args(p)
    p.add_argument("--tool", choices=["perf_analyzer", "genai-perf"], default=None, help="default: the profile's")
    p.add_argument("--out", help="results folder (default: loadtest/results/<timestamp>-<profile>)")
    p.add_argument("--results-root", help="parent of the timestamped results folder")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("genai-perf", help="sweep a profile with genai-perf (needs `setup --genai-perf`)")
    profile_args(p, default="concurrency")
    _endpoint_args(p)
    p.add_argument("--out")
    p.add_argument("--results-root")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_sweep, tool="genai-perf")

    p = sub.add_parser("locust", help="headless locust run (gRPC streaming user, or the OpenAI front door's HTTP/SSE "
                                      "user with --openai) bounded in time and requests")
    _endpoint_args(p)
    p.add_argument("--openai", choices=["chat", "completions"], default=None,
                   help="load the OpenAI front door (--url = its host:port, default localhost:9000) over HTTP + SSE "
                        "on /v1/chat/completions or /v1/completions instead of Triton's gRPC")
    p.add_argument("--model", help="--openai: the served model id (default: GET /v1/models)")
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--spawn-rate", type=float, default=4.0)
    p.add_argument("--run-time", type=float, default=30.0, help="seconds (hard bound)")
    p.add_argument("--max-requests", type=int, default=0, help="stop after this many requests (0 = no bound)")
    p.add_argument("--shape", choices=["constant", "step"], default="constant")
    p.add_argument("--step-users", type=int, default=2, help="step shape: users added per step")
    p.add_argument("--step-time", type=float, default=10.0, help="step shape: seconds per step")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--mix", action="store_true", help="mixed prompts: 3 short (32->24) for each long (256->64)")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--tokenizer", help="local tokenizer directory (default: build/models/smollm2)")
    p.add_argument("--ttft-p99-ms", type=float, help="SLO: fail (exit 1) above this P99 TTFT")
    p.add_argument("--tpot-p99-ms", type=float, help="SLO: fail (exit 1) above this P99 TPOT")
    p.add_argument("--out", help="results folder (default: loadtest/results/<timestamp>-locust)")
    p.set_defaults(func=cmd_locust)

    p = sub.add_parser("diagnose", help="where does a request's time go? per-stage breakdown and advice")
    _endpoint_args(p)
    p.add_argument("--http-url", help="HTTP URL of a running server (trace settings); default gRPC port - 1")
    p.add_argument("--repository", help="start a server on this model repository with tracing (default when "
                                        "--url is not given: build/model_repository)")
    p.add_argument("--profile", default=None, help="load profile for the request mix (default: built-in)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--tokenizer")
    p.add_argument("--out", help="results folder (default: loadtest/results/<timestamp>-diagnose)")
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("tune", help="bounded-time autotuner over batching, instances, engine slots/budget")
    p.add_argument("--profile", default="tune", help="load profile whose SLO the choice must meet")
    p.add_argument("--space", help="search space YAML (default: loadtest/profiles/tune-space.yaml)")
    p.add_argument("--base", default=str(PROJECT_ROOT / "builders/profiles/cpu.yaml"),
                   help="serving profile to start from")
    p.add_argument("--checkpoint", help="checkpoint for engine rebuilds (default: the base engine's source)")
    p.add_argument("--budget", type=float, default=900.0, help="seconds for the whole search")
    p.add_argument("--max-candidates", type=int, default=12)
    p.add_argument("--levels", help="override the load levels of the profile")
    p.add_argument("--out")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("report-serving", help="measure the default model and rewrite docs/benchmarks/serving.md")
    _endpoint_args(p)
    p.add_argument("--serving-profile", default=str(PROJECT_ROOT / "builders/profiles/cpu.yaml"),
                   help="rendered and served on free ports when --url is not given")
    p.add_argument("--repository", default=str(PROJECT_ROOT / "build/model_repository"),
                   help="with --url: the running server's repository (for the configuration summary)")
    p.add_argument("--doc", default=str(PROJECT_ROOT / "docs/benchmarks/serving.md"))
    p.add_argument("--out", help="results folder (default: loadtest/results/serving-report, replaced)")
    p.add_argument("--http-url", help="with --url: the server's HTTP URL (default: gRPC port - 1)")
    p.add_argument("--tokenizer", help="with --url: the served model's tokenizer (default: from --repository)")
    p.add_argument("--levels", help="override 1,4,8,16")
    p.add_argument("--quick", action="store_true", help="short windows (a smoke run of the report itself)")
    p.add_argument("--genai-perf", action="store_true", help="also run genai-perf at 8 streams (if installed)")
    p.add_argument("--no-locust", action="store_true")
    p.add_argument("--no-openai", action="store_true", help="leave out the OpenAI front door vs gRPC section")
    p.add_argument("--front-url", help="with --url: a running OpenAI front door (default: start one on a free port)")
    p.set_defaults(func=cmd_report_serving)

    p = sub.add_parser("openai-bench", help="the OpenAI front door vs direct gRPC streaming, side by side (TTFT "
                                            "overhead at 1 stream, throughput ratio at 16)")
    p.add_argument("--url", default=os.environ.get("LOADTEST_URL", "localhost:8001"), help="Triton gRPC host:port")
    p.add_argument("--front-url", default="http://localhost:9000", help="the running front door")
    p.add_argument("--tokenizer", help="local tokenizer directory (default: build/models/smollm2)")
    p.add_argument("--pairs", type=int, default=80, help="1-stream pairs per route")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=float, default=15.0, help="seconds measured per throughput phase")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--profile-front-door", action="store_true",
                   help="afterwards, run a second front door under cProfile and print its hottest functions")
    p.add_argument("--out", help="results folder (default: loadtest/results/openai-bench)")
    p.set_defaults(func=cmd_openai_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from .tools import ToolError

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    args.raw_argv = argv
    args.url_given = any(a == "--url" or a.startswith("--url=") for a in argv) or "LOADTEST_URL" in os.environ
    try:
        return args.func(args)
    except (ToolError, FileNotFoundError, ValueError, ValidationError) as exc:
        print(f"loadtest: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("loadtest: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
