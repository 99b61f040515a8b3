"""``python -m loadtest locust``: run ``loadtest/locustfile.py`` (Triton gRPC streaming) or, with ``--openai chat|
completions``, ``loadtest/locustfile_openai.py`` (the OpenAI front door, HTTP + SSE) headless in its own process,
bounded in time and request count, and summarise locust's CSV (plus the exact TTFT/TPOT percentiles the user
writes)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .slo import EXIT_ERROR, EXIT_OK, EXIT_SLO_FAILED
from .spec import DEFAULT_TOKENIZER, PACKAGE_DIR, PROJECT_ROOT
from .sweep import RESULTS_DIR, new_run_dir

LOCUSTFILE = PACKAGE_DIR / "locustfile.py"
LOCUSTFILE_OPENAI = PACKAGE_DIR / "locustfile_openai.py"


@dataclass
class LocustOptions:
    url: str = "localhost:8001"
    users: int = 4
    spawn_rate: float = 4.0
    run_time_s: float = 30.0
    max_requests: int = 0
    shape: str = "constant"
    step_users: int = 2
    step_time_s: float = 10.0
    prompt_tokens: int = 64
    max_tokens: int = 32
    mix: bool = False
    no_stream: bool = False
    tokenizer: Path | None = None
    out_dir: Path | None = None
    results_root: Path = RESULTS_DIR
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    extra_timeout_s: float = 60.0
    openai: str | None = None  # "chat" / "completions": the OpenAI front door at ``url`` (host:port) over HTTP
    model: str | None = None  # OpenAI: the served model id (default: asked from GET /v1/models)


@dataclass
class LocustResult:
    out_dir: Path
    returncode: int
    exit_code: int
    rows: list[dict] = field(default_factory=list)
    timings: dict = field(default_factory=dict)
    slo_failures: list[str] = field(default_factory=list)
    log_tail: str = ""

    def row(self, request_type: str, name: str = "Aggregated") -> dict | None:
        for r in self.rows:
            if r.get("Type") == request_type and (name == "*" or r.get("Name") == name):
                return r
        return None

    @property
    def requests(self) -> int:
        return int(self.timings.get("requests", 0))

    @property
    def failures(self) -> int:
        return sum(int(r.get("Failure Count") or 0) for r in self.rows if r.get("Name") != "Aggregated")

    def text(self) -> str:
        lines = [f"locust: {self.requests} requests, {self.failures} failures (locust exit {self.returncode})"]
        for key, label in (("latency_ms", "latency"), ("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            s = self.timings.get(key) or {}
            if s.get("count"):
                lines.append(f"  {label:8s} P50 {s['p50']:.1f} ms  P90 {s['p90']:.1f} ms  P99 {s['p99']:.1f} ms "
                             f"(n={s['count']})")
        rps = sum(float(r.get("Requests/s") or 0) for r in self.rows
                  if r.get("Type") in ("gRPC", "HTTP") and r.get("Name") != "Aggregated")
        if rps:
            lines.append(f"  throughput {rps:.2f} req/s")
        lines += [f"  SLO FAIL: {f}" for f in self.slo_failures]
        lines.append(f"  reports: {self.out_dir / 'locust_stats.csv'}, {self.out_dir / 'locust_report.html'}")
        if self.exit_code == EXIT_ERROR and self.log_tail:
            lines.append("  locust log tail:\n" + self.log_tail)
        return "\n".join(lines)


def locust_command(opts: LocustOptions, out: Path) -> list[str]:
    run_time = max(1, math.ceil(opts.run_time_s))
    if opts.openai:
        host = opts.url if opts.url.startswith("http") else f"http://{opts.url}"
        target = ["-f", str(LOCUSTFILE_OPENAI), "--headless", "--host", host, "--route", opts.openai]
        if opts.model:
            target += ["--openai-model", opts.model]
    else:
        target = ["-f", str(LOCUSTFILE), "--headless", "--host", f"grpc://{opts.url}"]
    argv = [sys.executable, "-m", "locust", *target,
            "-u", str(opts.users), "-r", f"{opts.spawn_rate:g}", "--run-time", f"{run_time}s",
            "--stop-timeout", "10", "--csv", str(out / "locust"), "--html", str(out / "locust_report.html"),
            "--only-summary", "--exit-code-on-error", "1",
            "--tokenizer", str(opts.tokenizer or DEFAULT_TOKENIZER), "--prompt-tokens", str(opts.prompt_tokens),
            "--max-tokens", str(opts.max_tokens), "--max-requests", str(opts.max_requests),
            "--shape", opts.shape, "--shape-users", str(opts.users), "--shape-spawn-rate", f"{opts.spawn_rate:g}",
            "--step-users", str(opts.step_users), "--step-time", f"{opts.step_time_s:g}",
            "--shape-time", f"{opts.run_time_s:g}", "--timings-out", str(out / "timings.json")]
    if opts.mix:
        argv.append("--mix")
    if opts.no_stream:
        argv.append("--no-stream")
    return argv


def read_stats(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_locust(opts: LocustOptions) -> LocustResult:
    out = Path(opts.out_dir) if opts.out_dir else new_run_dir("locust", opts.results_root)
    out.mkdir(parents=True, exist_ok=True)
    argv = locust_command(opts, out)
    (out / "command.txt").write_text(" ".join(argv) + "\n")
    env = dict(os.environ)
    paths = [str(PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("HF_HUB_OFFLINE", "1")
    try:
        proc = subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                              timeout=opts.run_time_s + opts.extra_timeout_s)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = -1
        log = ((exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")) + \
            f"\nloadtest: locust did not stop within {opts.run_time_s + opts.extra_timeout_s:g} s"
    (out / "locust.log").write_text(log)
    rows = read_stats(out / "locust_stats.csv")
    timings = json.loads((out / "timings.json").read_text()) if (out / "timings.json").exists() else {}
    tail = "\n".join(log.strip().splitlines()[-15:])
    result = LocustResult(out, rc, EXIT_OK, rows, timings, log_tail=tail)
    if not rows or not timings or rc not in (0, 1):
        result.exit_code = EXIT_ERROR
        return result
    for key, limit, label in (("ttft_ms", opts.ttft_p99_ms, "TTFT P99"), ("tpot_ms", opts.tpot_p99_ms, "TPOT P99")):
        if limit is None:
            continue
        value = (timings.get(key) or {}).get("p99")
        if value is None or value > limit:
            result.slo_failures.append(f"{label} {value if value is None else round(value, 2)} ms > {limit:g} ms")
    if rc == 1 or result.failures or result.slo_failures:
        result.exit_code = EXIT_SLO_FAILED
    (out / "summary.json").write_text(json.dumps({"returncode": rc, "exit_code": result.exit_code,
                                                  "failures": result.failures, "timings": timings,
                                                  "slo_failures": result.slo_failures,
                                                  "command": argv}, indent=1) + "\n")
    return result
