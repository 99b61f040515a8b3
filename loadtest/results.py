"""Parse perf_analyzer's outputs into per-level results.

* ``-f out.csv --verbose-csv``: client throughput and latency percentiles, and the server-side breakdown of the
  ensemble; perf_analyzer writes one ``<model>_v<version>.<name>.csv`` per composing model next to it.
* ``--profile-export-file``: every request's send time and the arrival time of each of its responses, from which
  TTFT (first response) and TPOT ((last - first) / (output tokens - 1)) follow, as genai-perf computes them.

For the ensemble, perf_analyzer's server columns are *per ensemble request* sums over the composing models'
invocations (preprocessing and llm, once each per request); the composing CSVs are per invocation.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

PCTS = (50, 90, 95, 99)
SERVER_COLUMNS = {  # perf_analyzer CSV column -> our key (microseconds)
    "Client Send": "client_send_us",
    "Network+Server Send/Recv": "network_server_us",
    "Server Queue": "queue_us",
    "Server Compute Input": "compute_input_us",
    "Server Compute Infer": "compute_infer_us",
    "Server Compute Output": "compute_output_us",
    "Client Recv": "client_recv_us",
}


@dataclass
class Stats:
    """Percentiles (ms) of one per-request quantity."""

    count: int = 0
    avg: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values_ms: list[float]) -> "Stats":
        if not values_ms:
            return cls()
        a = np.asarray(values_ms, dtype=float)
        p = np.percentile(a, PCTS)
        return cls(len(a), float(a.mean()), *map(float, p), float(a.max()))


@dataclass
class LevelResult:
    level: float
    mode: str  # concurrency | request_rate
    ok: bool = True
    error: str | None = None
    requests: int = 0
    failed_requests: int = 0
    duration_s: float | None = None
    throughput_rps: float | None = None  # completed requests / measured time (from the profile export)
    pa_throughput_rps: float | None = None  # perf_analyzer's Inferences/Second (wrong in request-count mode)
    response_rps: float | None = None
    output_tokens_per_s: float | None = None
    prompt_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    latency: Stats = field(default_factory=Stats)  # ms, client side, request sent -> last response
    ttft: Stats = field(default_factory=Stats)
    tpot: Stats = field(default_factory=Stats)
    pa_latency_p99_ms: float | None = None  # perf_analyzer's own (stable windows)
    server: dict[str, float] = field(default_factory=dict)  # ensemble, per request (us)
    composing: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> per invocation (us)
    metrics: dict = field(default_factory=dict)  # Prometheus deltas over the level (loadtest.metrics)
    wall_s: float | None = None

    @property
    def error_rate(self) -> float:
        total = self.requests + self.failed_requests
        return self.failed_requests / total if total else (0.0 if self.ok else 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LevelResult":
        d = dict(d)
        for key in ("latency", "ttft", "tpot"):
            d[key] = Stats(**d.get(key, {}))
        return cls(**d)


# ---------------------------------------------------------------------------------------------- CSV


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def read_pa_csv(path: Path) -> list[dict[str, str]]:
    """perf_analyzer's CSV (header + one row per level). Later sections (if any) are ignored."""
    with open(path, newline="") as f:
        rows = []
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return []
        for row in reader:
            if not row or len(row) < 2 or not row[0].replace(".", "", 1).isdigit():
                break
            rows.append(dict(zip(header, row)))
        return rows


def composing_csvs(csv_path: Path) -> dict[str, Path]:
    """``<model>_v<version>.<csv name>`` files perf_analyzer writes beside ``csv_path`` for composing models."""
    found = {}
    for p in csv_path.parent.glob(f"*_v*.{csv_path.name}"):
        model = p.name[: -len(csv_path.name) - 1].rsplit("_v", 1)[0]
        found[model] = p
    return found


def server_breakdown(row: dict[str, str]) -> dict[str, float]:
    out = {key: v for col, key in SERVER_COLUMNS.items() if (v := _num(row.get(col))) is not None}
    if (v := _num(row.get("Inferences/Second"))) is not None:
        out["inferences_per_s"] = v
    return out


# ---------------------------------------------------------------------------------------------- export JSON


def load_export(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def read_export(path: Path) -> dict | None:
    """The profile export, or None when it cannot be read: perf_analyzer occasionally leaves it empty although the
    run succeeded (seen once in CI under the full suite's load), and a JSON traceback would say nothing useful."""
    try:
        return load_export(path)
    except (OSError, EOFError, json.JSONDecodeError):
        return None


def _last_output(outputs: list[dict], key: str) -> float | None:
    for out in reversed(outputs or []):
        v = out.get(key)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is not None and v != "":
            try:
                return float(v)
            except (TypeError, ValueError):
                return None
    return None


def request_timings(experiment: dict, fixed_count: bool = False) -> dict:
    """Per-request latency, TTFT, TPOT (ms), token counts and throughput from one profile-export experiment.

    Time windows: requests sent inside perf_analyzer's measurement windows; throughput = requests completed
    inside them / their length. Fixed request count (``--request-count``): every request; throughput =
    requests / (last response - first send) (perf_analyzer's own figure assumes a 1 s window there)."""
    bounds = experiment.get("window_boundaries") or []
    windows = len(bounds) >= 2 and not fixed_count
    lo, hi = (bounds[0], bounds[-1]) if windows else (-math.inf, math.inf)
    lat, ttft, tpot, n_in, n_out = [], [], [], [], []
    failed = 0
    starts, ends = [], []
    for r in experiment.get("requests", []):
        t0 = r.get("timestamp")
        ts = r.get("response_timestamps") or []
        if t0 is None or not (lo <= t0 <= hi):
            continue
        if not ts:
            failed += 1
            continue
        outputs = r.get("response_outputs") or []
        first, last = ts[0], ts[-1]
        # An empty final response (no text) must not count as the first token.
        for t, out in zip(ts, outputs):
            if out.get("text_output") not in (None, "", []):
                first = t
                break
        lat.append((last - t0) / 1e6)
        ttft.append((first - t0) / 1e6)
        tokens = _last_output(outputs, "num_output_tokens")
        if tokens is None:
            tokens = float(len(ts))
        n_out.append(tokens)
        if (inp := _last_output(outputs, "num_input_tokens")) is not None:
            n_in.append(inp)
        if tokens > 1 and len(ts) > 1 and last > first:
            tpot.append((last - first) / 1e6 / (tokens - 1))
        starts.append(t0)
        ends.append(last)
    if windows:
        duration = (hi - lo) / 1e9
        done = sum(1 for r in experiment.get("requests", [])
                   if r.get("response_timestamps") and lo <= r["response_timestamps"][-1] <= hi)
    else:
        duration = (max(ends) - min(starts)) / 1e9 if starts else None
        done = len(lat)
    rps = done / duration if duration else None
    return {"latency": lat, "ttft": ttft, "tpot": tpot, "input_tokens": n_in, "output_tokens": n_out,
            "failed": failed, "duration_s": duration, "throughput_rps": rps}


def parse_level(level: float, mode: str, csv_path: Path, export_path: Path, fixed_count: bool = False) -> LevelResult:
    result = LevelResult(level=level, mode=mode)
    rows = read_pa_csv(csv_path) if csv_path.exists() else []
    if rows:
        row = rows[-1]
        result.pa_throughput_rps = _num(row.get("Inferences/Second"))
        result.response_rps = _num(row.get("Response Throughput"))
        p99 = _num(row.get("p99 latency"))
        result.pa_latency_p99_ms = p99 / 1000 if p99 is not None else None
        result.server = server_breakdown(row)
    for model, path in composing_csvs(csv_path).items():
        crow = read_pa_csv(path)
        if crow:
            result.composing[model] = server_breakdown(crow[-1])
    data = read_export(export_path) if export_path.exists() else {}
    if data is None:
        result.error = f"perf_analyzer's profile export {export_path.name} is empty or cut short"
    elif data:
        experiments = data.get("experiments") or []
        if experiments:
            t = request_timings(experiments[-1], fixed_count)
            result.latency, result.ttft, result.tpot = Stats.of(t["latency"]), Stats.of(t["ttft"]), Stats.of(t["tpot"])
            result.requests, result.failed_requests = len(t["latency"]), t["failed"]
            result.duration_s = t["duration_s"]
            if t["output_tokens"]:
                result.output_tokens_mean = float(np.mean(t["output_tokens"]))
            if t["input_tokens"]:
                result.prompt_tokens_mean = float(np.mean(t["input_tokens"]))
            result.throughput_rps = t["throughput_rps"]
    if result.throughput_rps is None:
        result.throughput_rps = result.pa_throughput_rps
    if result.throughput_rps is not None and result.output_tokens_mean is not None:
        result.output_tokens_per_s = result.throughput_rps * result.output_tokens_mean
    if result.error or (not rows and not result.requests):
        result.ok = False
        result.error = result.error or "perf_analyzer produced no measurement"
    return result


def compress(path: Path) -> Path:
    """Gzip a (large) profile export in place; results folders stay small enough to keep in git."""
    if not path.exists() or path.suffix == ".gz":
        return path
    out = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        dst.write(src.read())
    path.unlink()
    return out


# ---------------------------------------------------------------------------------------------- genai-perf summary


def _gp_stats(metric: dict | None) -> Stats:
    """One metric of genai-perf's ``*_genai_perf.json`` ({"unit": "ms", "avg", "p50", ...}) as Stats (ms)."""
    if not metric:
        return Stats()
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "sec": 1e3}.get(str(metric.get("unit", "ms")), 1.0)

    def v(key: str) -> float | None:
        x = metric.get(key)
        return None if x is None else float(x) * scale

    return Stats(count=0, avg=v("avg"), p50=v("p50"), p90=v("p90"), p95=v("p95"), p99=v("p99"), max=v("max"))


def parse_genai_perf_summary(level: float, mode: str, path: Path) -> LevelResult:
    """genai-perf's own statistics (``<export>_genai_perf.json``): used for the OpenAI endpoints, whose
    perf_analyzer export holds raw SSE text rather than Triton's per-response token counts. TPOT is genai-perf's
    inter-token latency ((last - first) / (output tokens - 1), tokens counted with the local tokenizer)."""
    r = LevelResult(level=level, mode=mode)
    path = Path(path)
    if not path.exists():
        r.ok, r.error = False, f"no measurement ({path.name} missing)"
        return r
    data = json.loads(path.read_text())

    def avg(key: str) -> float | None:
        m = data.get(key) or {}
        return None if m.get("avg") is None else float(m["avg"])

    r.latency = _gp_stats(data.get("request_latency"))
    r.ttft = _gp_stats(data.get("time_to_first_token"))
    r.tpot = _gp_stats(data.get("inter_token_latency"))
    r.throughput_rps = avg("request_throughput")
    r.output_tokens_per_s = avg("output_token_throughput")
    r.output_tokens_mean = avg("output_sequence_length")
    r.prompt_tokens_mean = avg("input_sequence_length")
    count = avg("request_count")
    r.requests = int(count) if count is not None else 0
    for s in (r.latency, r.ttft, r.tpot):
        s.count = r.requests
    if not r.throughput_rps:
        r.ok, r.error = False, "genai-perf measured no completed request"
    return r
