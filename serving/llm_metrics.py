"""The LLM model's Prometheus metrics (Triton's custom-metrics API), fed from the response thread.

Each update is a message to the Triton process, so per-request values are recorded once a request ends
(TPOT as the request's mean) and gauges at most every ``GAUGE_PERIOD_S``; the engine loop never waits on them.
"""

from __future__ import annotations

import time

import triton_python_backend_utils as pb_utils

LATENCY_BUCKETS = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0]
TPOT_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
GAUGE_PERIOD_S = 0.1


class LLMMetrics:
    def __init__(self, model_name: str, model_version: str):
        # A MetricFamily must outlive its metrics, so every family stays referenced here.
        self._families: dict[str, object] = {}

        def _family(name: str, description: str, kind):
            if name not in self._families:
                self._families[name] = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            return self._families[name]

        labels = {"model": model_name, "version": model_version}
        counter, gauge, histogram = (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                                     pb_utils.MetricFamily.HISTOGRAM)
        self.ttft = _family("llm_time_to_first_token_seconds", "Time from arrival to the first output token",
                            histogram).Metric(labels=labels, buckets=LATENCY_BUCKETS)
        self.tpot = _family("llm_time_per_output_token_seconds", "Mean time per output token after the first",
                            histogram).Metric(labels=labels, buckets=TPOT_BUCKETS)
        self.e2e = _family("llm_e2e_request_latency_seconds", "Time from arrival to the last output token",
                           histogram).Metric(labels=labels, buckets=LATENCY_BUCKETS)
        self.prompt_tokens = _family("llm_prompt_tokens_total", "Prompt tokens processed",
                                     counter).Metric(labels=labels)
        self.generation_tokens = _family("llm_generation_tokens_total", "Output tokens generated",
                                         counter).Metric(labels=labels)
        self.finished = {reason: _family("llm_requests_finished_total", "Requests finished, by reason",
                                         counter).Metric(labels={**labels, "reason": reason})
                         for reason in ("length", "stop", "cancelled", "error")}
        self.queued = _family("llm_engine_queued_requests", "Requests accepted and not yet generating (waiting for a "
                              "slot; GPU layout: in the executor's queue or context phase)", gauge).Metric(labels=labels)
        self.active = _family("llm_engine_active_slots", "KV-cache slots holding a request", gauge).Metric(labels=labels)
        self.kv_occupancy = _family("llm_engine_kv_cache_occupancy", "Fraction of the KV cache's blocks held by "
                                    "running requests", gauge).Metric(labels=labels)
        self.cache_hits = _family("llm_prefix_cache_hit_tokens_total", "Prompt tokens whose KV came from the prefix "
                                  "cache", counter).Metric(labels=labels)
        self.cache_misses = _family("llm_prefix_cache_missed_tokens_total", "Prompt tokens computed (not found in "
                                    "the prefix cache)", counter).Metric(labels=labels)
        self.kv_capacity = _family("llm_engine_kv_cache_capacity_tokens", "Token positions the paged KV cache holds "
                                   "(CPU engine)", gauge).Metric(labels=labels)
        self.kv_cached = _family("llm_engine_kv_cache_cached_tokens", "Token positions of cached prefixes no "
                                 "running request holds: reused by a matching prompt, evicted least recently used "
                                 "first (CPU engine)", gauge).Metric(labels=labels)
        self._next_gauge_update = 0.0

    def request_finished(self, reason: str, arrival: float, first_token: float | None, end: float,
                         prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.prompt_tokens.increment(prompt_tokens)
        if first_token is not None:  # a request that never ran was never looked up
            self.cache_hits.increment(cached_tokens)
            self.cache_misses.increment(prompt_tokens - cached_tokens)
        self.generation_tokens.increment(output_tokens)
        self.finished[reason].increment(1)
        if first_token is not None:
            self.ttft.observe(first_token - arrival)
            self.e2e.observe(end - arrival)
            if output_tokens > 1:
                self.tpot.observe((end - first_token) / (output_tokens - 1))

    def update_gauges(self, queued: int, active: int, kv_occupancy: float, force: bool = False,
                      kv_size: tuple[int, int] | None = None) -> None:
        """``kv_size``: (capacity, cached) token positions, from an engine with a paged cache of its own."""
        now = time.monotonic()
        if not force and now < self._next_gauge_update:
            return
        self._next_gauge_update = now + GAUGE_PERIOD_S
        if kv_size is not None:
            self.kv_capacity.set(kv_size[0])
            self.kv_cached.set(kv_size[1])
        # The cache before the counts: a scrape that sees no slot held and nothing queued sees the cache free too.
        self.kv_occupancy.set(kv_occupancy)
        self.queued.set(queued)
        self.active.set(active)

    def close(self) -> None:
        """Free the metrics while the stub can still tell Triton (call from ``finalize``)."""
        free_metrics(self)


def free_metrics(owner) -> None:
    """Free every metric ``owner`` holds, then the families it keeps in ``_families``. Left to interpreter exit
    they go in any order, after the stub's shared memory: Triton 2.51's stub then aborts in
    ``MetricFamily::~MetricFamily`` (seen in a core dump of the stand-in's stub)."""
    families = owner._families
    vars(owner).clear()  # the metrics (and the owner's other state) first
    families.clear()
