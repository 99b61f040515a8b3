"""Run a profile against a running server: one perf_analyzer (or genai-perf) run per load level.

Writes ``<results>/<timestamp>-<profile>/``: ``profile.yaml``, ``inputs.json``, ``raw/`` (perf_analyzer CSVs,
gzipped profile exports, logs, metrics), ``summary.json``, ``summary.csv``, ``report.md`` and the PNG plots.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from . import commands, inputs, metrics, report, slo
from .results import LevelResult, compress, parse_genai_perf_summary, parse_level, read_export
from .spec import DEFAULT_TOKENIZER, PACKAGE_DIR, PROJECT_ROOT, LoadProfile, level_str
from .tools import ToolError, genai_perf_binary, genai_perf_env, setup_perf_analyzer

RESULTS_DIR = PACKAGE_DIR / "results"


@dataclass
class SweepOutcome:
    out_dir: Path
    results: list[LevelResult]
    checks: list[slo.Check]
    missing: list[float]
    exit_code: int
    meta: dict = field(default_factory=dict)


def new_run_dir(profile_name: str, root: Path = RESULTS_DIR) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = root / f"{stamp}-{profile_name}"
    n = 1
    while out.exists():
        n += 1
        out = root / f"{stamp}-{profile_name}-{n}"
    out.mkdir(parents=True)
    return out


def git_describe() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return f"{sha}{' + local changes' if dirty else ''}" if sha else "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def wait_for_server(url: str, timeout_s: float = 10.0) -> None:
    """Raise ToolError unless the gRPC endpoint says the server is ready."""
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            client = grpcclient.InferenceServerClient(url)
            try:
                if client.is_server_ready(client_timeout=3):
                    return
                last = "not ready"
            finally:
                client.close()
        except Exception as exc:  # noqa: BLE001 - any transport error means "not reachable"
            last = str(exc).splitlines()[0][:200]
        if time.monotonic() > deadline:
            raise ToolError(f"no ready Triton server at gRPC {url} ({last}); start one with `make serve`")
        time.sleep(0.5)


def wait_for_front_door(url: str, timeout_s: float = 10.0) -> None:
    """Raise ToolError unless the OpenAI front door at host:port answers GET /health with 200 (Triton ready)."""
    import urllib.error
    import urllib.request

    base = url if url.startswith("http") else f"http://{url}"
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=3) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            last = str(exc)[:200]
        if time.monotonic() > deadline:
            raise ToolError(f"no ready OpenAI front door at {base} ({last}); start one with `make serve` "
                            "(port 9000) or `python -m serving openai --triton HOST:GRPC`")
        time.sleep(0.5)


class Progress:
    """tqdm over the load levels (stderr); quiet when ``enabled`` is false."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.bar = None
        self.plain = enabled and not sys.stderr.isatty()  # logs and CI: one line per level, no redraws
        if enabled and not self.plain:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="level", file=sys.stderr, dynamic_ncols=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt} levels |{bar}| {elapsed} {postfix}")

    def running(self, label: str) -> None:
        if self.plain:
            print(f"  measuring {label} ...", file=sys.stderr, flush=True)
        if self.bar:
            self.bar.set_postfix_str(f"measuring {label} ...")

    def done(self, label: str, r: LevelResult) -> None:
        if r.ok:
            text = (f"{label}: {r.throughput_rps or 0:.2f} req/s, P99 {r.latency.p99 or 0:.0f} ms, "
                    f"TTFT P99 {r.ttft.p99 or 0:.0f} ms, TPOT P99 {r.tpot.p99 or 0:.1f} ms")
        else:
            text = f"{label}: FAILED ({(r.error or '')[:160]})"
        if self.plain:
            print(f"  {text}", file=sys.stderr, flush=True)
        if self.bar:
            self.bar.set_postfix_str(text[:60])
            self.bar.update(1)
            self.bar.write(f"  {text}", file=sys.stderr)

    def close(self) -> None:
        if self.bar:
            self.bar.close()


def _tail(text: str, n: int = 6) -> str:
    """The lines that say what went wrong (perf_analyzer prints the server's error after its banner)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower() or "unable" in ln.lower()]
    return " | ".join(dict.fromkeys(errors[:n] or lines[-n:]))[:600]


def run_level_pa(profile: LoadProfile, level: float, *, pa, url: str, input_data: Path, raw: Path,
                 metrics_url: str | None) -> tuple[LevelResult, list[str]]:
    name = commands.level_dir_name(profile, level)
    csv_path, export = raw / f"{name}.csv", raw / f"{name}.profile_export.json"
    # Relative -f: perf_analyzer names the composing models' CSVs "<model>_v<version>.<-f value>", which only
    # works for a bare file name, so it runs inside raw/.
    argv = [str(pa.binary)] + commands.perf_analyzer_args(profile, level, url=url, input_data=input_data.resolve(),
                                                          csv=Path(csv_path.name), export=export.resolve(),
                                                          metrics_url=metrics_url)
    t0 = time.monotonic()
    for attempt in (1, 2):
        with metrics.Window(metrics_url) as window:
            try:
                proc = subprocess.run(argv, env=pa.env(), capture_output=True, text=True, cwd=raw,
                                      timeout=profile.measurement.timeout_s)
                out, rc = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as exc:
                out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                out += f"\nloadtest: perf_analyzer exceeded the level timeout of {profile.measurement.timeout_s:g} s"
                rc = -1
        out += f"\nloadtest: perf_analyzer exit code {rc}\n"
        if rc != 0 or not export.exists() or read_export(export) is not None or attempt == 2:
            break
        (raw / f"{name}.attempt1.log").write_text(
            out + f"loadtest: the profile export is empty or cut short ({export.stat().st_size} bytes, kept as "
            f"{name}.attempt1.profile_export.json); measuring again\n")
        # Moved aside, not left in place: perf_analyzer refuses an export path that already exists.
        export.rename(raw / f"{name}.attempt1.profile_export.json")
        t0 = time.monotonic()
    (raw / f"{name}.log").write_text(out)
    fixed = commands.request_count(profile, level) > 0
    result = parse_level(level, profile.load.mode, csv_path, export, fixed_count=fixed)
    result.wall_s = time.monotonic() - t0
    result.metrics = window.summary
    if rc != 0:
        result.ok = False
        result.error = f"perf_analyzer exit {rc}: {_tail(out)}"
    compress(export)
    return result, argv


def run_level_genai_perf(profile: LoadProfile, level: float, *, pa, url: str, tokenizer: Path, raw: Path,
                         metrics_url: str | None) -> tuple[LevelResult, list[str]]:
    binary = genai_perf_binary()
    if binary is None:
        raise ToolError("genai-perf is not installed: run `python -m loadtest setup --genai-perf` "
                        "(or `make loadtest-tools`); it lives in build/tools/genai-perf")
    name = commands.level_dir_name(profile, level)
    artifacts = raw / f"{name}-genai-perf"
    argv = [str(binary)] + commands.genai_perf_args(profile, level, url=url, tokenizer=tokenizer,
                                                    artifact_dir=artifacts, metrics_url=metrics_url)
    t0 = time.monotonic()
    with metrics.Window(metrics_url) as window:
        try:
            proc = subprocess.run(argv, env=genai_perf_env(pa), capture_output=True, text=True, cwd=raw,
                                  timeout=profile.measurement.timeout_s)
            out, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            out, rc = partial + f"\ngenai-perf exceeded {profile.measurement.timeout_s:g} s", -1
    (raw / f"{name}.log").write_text(out)
    exports = sorted(artifacts.rglob("profile_export.json"))
    export = exports[-1] if exports else artifacts / "profile_export.json"
    if profile.openai:  # the export holds raw SSE text: use genai-perf's own statistics
        summaries = sorted(artifacts.rglob("profile_export_genai_perf.json"))
        result = parse_genai_perf_summary(level, profile.load.mode,
                                          summaries[-1] if summaries else artifacts / "profile_export_genai_perf.json")
    else:
        result = parse_level(level, profile.load.mode, artifacts / "none.csv", export,
                             fixed_count=commands.request_count(profile, level) > 0)
    result.wall_s = time.monotonic() - t0
    result.metrics = window.summary
    if rc != 0:
        result.ok = False
        result.error = f"genai-perf exit {rc}: {_tail(out)}"
    for e in exports:
        compress(e)
    return result, argv


def warmup(profile: LoadProfile, *, pa, url: str, input_data: Path, raw: Path) -> None:
    n = profile.measurement.warmup_requests
    if not n:
        return
    argv = [str(pa.binary), "-m", profile.model, "-i", "grpc", "-u", url, "--streaming", "--input-data",
            str(input_data), "--concurrency-range", "1", "--request-count", str(n)]
    proc = subprocess.run(argv, env=pa.env(), capture_output=True, text=True, timeout=profile.measurement.timeout_s)
    (raw / "warmup.log").write_text(proc.stdout + proc.stderr)


def run_sweep(profile: LoadProfile, *, url: str, metrics_url: str | None = None, tokenizer: Path | None = None,
              out_dir: Path | None = None, results_root: Path = RESULTS_DIR, tool: str | None = None,
              progress: bool = True, plots: bool = True) -> SweepOutcome:
    tool = "genai-perf" if profile.openai else (tool or profile.tool)
    tokenizer = Path(tokenizer or DEFAULT_TOKENIZER)
    pa = setup_perf_analyzer()
    if profile.openai:
        wait_for_front_door(url)
    else:
        wait_for_server(url)
    out = Path(out_dir) if out_dir else new_run_dir(profile.name, results_root)
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "raw"
    raw.mkdir(exist_ok=True)
    (out / "profile.yaml").write_text(profile.to_yaml())
    input_data = out / "inputs.json"
    requests = inputs.write_input_data(profile.inputs, tokenizer, input_data, streaming=profile.streaming)
    meta = {"profile": profile.name, "tool": tool, "url": url, "metrics_url": metrics_url,
            "tokenizer": str(tokenizer), "started": datetime.now().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), "loadavg_before": loadavg(), "git": git_describe(),
            "perf_analyzer": pa.version(), "inputs": inputs.describe(requests), "commands": []}
    t_start = time.monotonic()
    if not profile.openai:  # genai-perf warms up itself (--warmup-request-count)
        warmup(profile, pa=pa, url=url, input_data=input_data, raw=raw)
    bar = Progress(len(profile.load.levels), f"{profile.name} ({tool})", progress)
    results: list[LevelResult] = []
    try:
        for level in profile.load.levels:
            label = f"{'c' if profile.load.mode == 'concurrency' else 'rate '}{level_str(level)}"
            bar.running(label)
            if tool == "genai-perf":
                r, argv = run_level_genai_perf(profile, level, pa=pa, url=url, tokenizer=tokenizer, raw=raw,
                                               metrics_url=metrics_url)
            else:
                r, argv = run_level_pa(profile, level, pa=pa, url=url, input_data=input_data, raw=raw,
                                       metrics_url=metrics_url)
            meta["commands"].append(commands.render(argv))
            results.append(r)
            bar.done(label, r)
    finally:
        bar.close()
    meta["wall_s"] = time.monotonic() - t_start
    meta["loadavg_after"] = loadavg()
    checks, missing = slo.check(profile.slo, results)
    code = slo.exit_code(checks, results)
    written = report.plot(profile, results, out) if plots else []
    (out / "commands.txt").write_text("\n".join(meta["commands"]) + "\n")
    summary = {"meta": meta, "results": [r.to_dict() for r in results], "slo": [c.to_dict() for c in checks],
               "slo_levels_not_measured": missing, "exit_code": code}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    report.write_csv(results, out / "summary.csv")
    (out / "report.md").write_text(report.markdown(profile, results, checks, missing, meta, written))
    return SweepOutcome(out, results, checks, missing, code, meta)


def load_outcome(run_dir: Path) -> tuple[LoadProfile, list[LevelResult], dict]:
    data = json.loads((run_dir / "summary.json").read_text())
    profile = LoadProfile.load_file(run_dir / "profile.yaml")
    return profile, [LevelResult.from_dict(d) for d in data["results"]], data["meta"]


def copy_plots(run_dir: Path, dest: Path, prefix: str = "") -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for png in sorted(run_dir.glob("*.png")):
        target = dest / f"{prefix}{png.name}"
        shutil.copy2(png, target)
        out.append(target)
    return out
