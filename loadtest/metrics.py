"""Triton's Prometheus metrics: scrape, diff over a measurement, sample gauges while load runs.

Uses what exists: Triton's own ``nv_inference_*`` counters per model and ``nv_cpu_utilization`` are always
there; the CPU engine's custom series (``llm_time_to_first_token_seconds`` and
``llm_time_per_output_token_seconds`` histograms, ``llm_engine_queued_requests`` and ``llm_engine_active_slots``
gauges) are used when the server exports them and simply absent from the result otherwise.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict

from serving.prometheus import Samples, scrape

NV_COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
               "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
               "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
               "nv_inference_compute_output_duration_us")
ENGINE_HISTOGRAMS = ("llm_time_to_first_token_seconds", "llm_time_per_output_token_seconds",
                     "llm_e2e_request_latency_seconds")
SAMPLED_GAUGES = ("nv_cpu_utilization", "llm_engine_queued_requests", "llm_engine_active_slots",
                  "llm_engine_kv_cache_occupancy", "nv_inference_pending_request_count")


def _by_model(samples: Samples, name: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (n, labels), v in samples.items():
        if n == name:
            out[dict(labels).get("model", "")] += v
    return dict(out)


def model_deltas(before: Samples, after: Samples) -> dict[str, dict[str, float]]:
    """Per model: counter deltas and per-request averages (us) over the interval."""
    result: dict[str, dict[str, float]] = {}
    for name in NV_COUNTERS:
        a, b = _by_model(after, name), _by_model(before, name)
        for model, value in a.items():
            result.setdefault(model, {})[name.removeprefix("nv_inference_")] = value - b.get(model, 0.0)
    for model, d in result.items():
        n = d.get("request_success", 0.0) + d.get("request_failure", 0.0)
        if n > 0:
            for key in ("request_duration_us", "queue_duration_us", "compute_input_duration_us",
                        "compute_infer_duration_us", "compute_output_duration_us"):
                if key in d:
                    d["avg_" + key] = d[key] / n
        if d.get("exec_count"):
            d["avg_batch_size"] = d.get("count", 0.0) / d["exec_count"]
    return result


def histogram_delta(before: Samples, after: Samples, name: str) -> dict | None:
    """Count, mean and bucket-interpolated P50/P90/P99 (ms) of a Prometheus histogram over the interval."""
    buckets: dict[float, float] = defaultdict(float)
    for (n, labels), v in after.items():
        if n == f"{name}_bucket":
            le = dict(labels).get("le", "+Inf")
            edge = math.inf if le in ("+Inf", "Inf") else float(le)
            buckets[edge] += v - before.get((n, labels), 0.0)
    if not buckets:
        return None
    count = sum(v - before.get(key, 0.0) for key, v in after.items() if key[0] == f"{name}_count")
    total = sum(v - before.get(key, 0.0) for key, v in after.items() if key[0] == f"{name}_sum")
    if count <= 0:
        return {"count": 0}
    edges = sorted(buckets)

    def quantile(q: float) -> float | None:
        target = q * count
        prev_edge, prev_count = 0.0, 0.0
        for edge in edges:
            c = buckets[edge]
            if c >= target:
                if math.isinf(edge):
                    return prev_edge * 1000
                frac = (target - prev_count) / (c - prev_count) if c > prev_count else 1.0
                return (prev_edge + frac * (edge - prev_edge)) * 1000
            prev_edge, prev_count = edge, c
        return None

    return {"count": count, "avg_ms": total / count * 1000, "p50_ms": quantile(0.5), "p90_ms": quantile(0.9),
            "p99_ms": quantile(0.99)}


def gauge(samples: Samples, name: str) -> float | None:
    values = [v for (n, _), v in samples.items() if n == name]
    return sum(values) if values else None


class GaugeSampler:
    """Polls the metrics endpoint in a thread while load runs; keeps mean/max of the interesting gauges."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url, self.interval_s = url, interval_s
        self.values: dict[str, list[float]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GaugeSampler":
        if self.url:
            self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            samples = scrape(self.url, timeout=2.0)
            for name in SAMPLED_GAUGES:
                if (v := gauge(samples, name)) is not None:
                    self.values[name].append(v)
            self._stop.wait(self.interval_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict[str, dict[str, float]]:
        return {k: {"mean": sum(v) / len(v), "max": max(v), "samples": len(v)} for k, v in self.values.items() if v}


def interval_summary(before: Samples, after: Samples, sampler: GaugeSampler | None = None) -> dict:
    out: dict = {"models": model_deltas(before, after)}
    engine = {name: h for name in ENGINE_HISTOGRAMS if (h := histogram_delta(before, after, name)) is not None}
    if engine:
        out["engine_histograms"] = engine
    if sampler is not None:
        out["gauges"] = sampler.summary()
    return out


class Window:
    """``with Window(url) as w: ...`` then ``w.summary``: Prometheus deltas and gauge samples over the block."""

    def __init__(self, url: str | None, interval_s: float = 0.5):
        self.url = url
        self.sampler = GaugeSampler(url, interval_s)
        self.summary: dict = {}
        self._before: Samples = {}
        self._t0 = 0.0

    def __enter__(self) -> "Window":
        self._before = scrape(self.url)
        self._t0 = time.monotonic()
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)
        after = scrape(self.url)
        self.summary = interval_summary(self._before, after, self.sampler) if after else {}
        if self.summary:
            self.summary["seconds"] = time.monotonic() - self._t0
