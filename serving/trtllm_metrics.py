"""The metric families TensorRT-LLM's C++ Triton backend registers, exported by the GPU layout's ``llm`` model from
its executor's iteration stats (serving/executor_engine.py), so the chart's GPU queries (helm/triton-llm,
``target: gpu``) and an inference gateway's endpoint picker read the names they know — on a GPU, and on CPU from the
stand-in executor (tests/test_prometheus.py).

Names, label keys and label values are those of NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``, and each value is
read from the same ``IterationStats`` field as the backend's ``WaitForStats`` reads it (``model_instance_state.cc``;
two stored versions of the 1.x line read, identical here; the exact release/1.2.1 files could not be read):

- ``nv_trt_llm_request_metrics``: ``active`` = num_active_requests (requests the executor has taken into its batch,
  at most ``max`` = max_num_active_requests), ``scheduled`` / ``context`` from the in-flight batching stats,
  ``waiting`` = active − scheduled (requests in a slot the capacity scheduler held back — never the backlog beyond the
  slots, which is num_queued_requests and which the backend does not export);
- ``nv_trt_llm_kv_cache_block_metrics``: ``max`` / ``free`` / ``used`` / ``tokens_per`` / ``reused`` blocks and
  ``fraction`` = used / max;
- ``nv_trt_llm_inflight_batcher_metrics``: ``total_context_tokens``, ``generation_requests``, ``micro_batch_id``,
  ``paused_requests``;
- ``nv_trt_llm_general_metrics``: ``iteration_counter`` and ``timestamp`` (µs since the epoch);
- ``nv_llm_input_token_len`` / ``nv_llm_output_token_len`` histograms, once per finished request.

Not exported: ``nv_trt_llm_runtime_memory_metrics`` (the runtime's GPU/pinned allocations; nothing on CPU to report)
and the disaggregated-serving counters (not used here).
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

import triton_python_backend_utils as pb_utils

from serving.llm_metrics import free_metrics

#: custom_metrics_reporter.cc: the buckets of both token-length histograms.
TOKEN_LEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
#: model_instance_state.cc: the stats thread's period when the model sets no ``stats_check_period_ms``.
STATS_CHECK_PERIOD_S = 0.1

_GAUGES = {
    "request": ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type",
                ("active", "max", "scheduled", "context", "waiting")),
    "kv": ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type",
           ("max", "free", "used", "tokens_per", "reused", "fraction")),
    "ifb": ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics",
            "inflight_batcher_specific_metric",
            ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests")),
    "general": ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type",
                ("iteration_counter", "timestamp")),
}


def stats_values(stats) -> dict[tuple[str, str], float]:
    """(family, label value) → value, from one ``IterationStats`` the way the backend's ``WaitForStats`` reads it."""
    ifb, kv = stats.inflight_batching_stats, stats.kv_cache_stats
    stamp = datetime.datetime.strptime(stats.timestamp, "%m-%d-%Y %H:%M:%S.%f")  # local time, as the backend parses it
    return {
        ("request", "active"): stats.num_active_requests, ("request", "max"): stats.max_num_active_requests,
        ("request", "scheduled"): ifb.num_scheduled_requests, ("request", "context"): ifb.num_context_requests,
        ("request", "waiting"): stats.num_active_requests - ifb.num_scheduled_requests,
        ("kv", "max"): kv.max_num_blocks, ("kv", "free"): kv.free_num_blocks, ("kv", "used"): kv.used_num_blocks,
        ("kv", "tokens_per"): kv.tokens_per_block, ("kv", "reused"): kv.reused_blocks,
        ("kv", "fraction"): kv.used_num_blocks / kv.max_num_blocks if kv.max_num_blocks else 0.0,
        ("ifb", "total_context_tokens"): ifb.num_ctx_tokens, ("ifb", "generation_requests"): ifb.num_gen_requests,
        ("ifb", "micro_batch_id"): ifb.micro_batch_id, ("ifb", "paused_requests"): ifb.num_paused_requests,
        ("general", "iteration_counter"): stats.iter, ("general", "timestamp"): stamp.timestamp() * 1e6,
    }


class TrtLlmMetrics:
    """Like the backend's ``WaitForStats`` thread, a thread of its own reads ``stats()`` (the newest
    ``IterationStats``, or None) every ``period_s`` and sets the gauges; each changed value is one message to the
    Triton process, unchanged ones are skipped."""

    def __init__(self, model_name: str, model_version: str, stats: Callable[[], object],
                 period_s: float = STATS_CHECK_PERIOD_S):
        labels = {"model": model_name, "version": model_version}
        gauge, histogram = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        # A MetricFamily must outlive its metrics: every family stays referenced here until close().
        self._families = {key: pb_utils.MetricFamily(name=name, description=description, kind=gauge)
                          for key, (name, description, _, _) in _GAUGES.items()}
        self._gauges = {(key, value): self._families[key].Metric(labels={**labels, category: value})
                        for key, (_, _, category, values) in _GAUGES.items() for value in values}
        for key, name in (("output", "nv_llm_output_token_len"), ("input", "nv_llm_input_token_len")):
            self._families[key] = pb_utils.MetricFamily(name=name, description="TRT LLM response metrics",
                                                        kind=histogram)
        self._output_len = self._families["output"].Metric(
            labels={**labels, "response_metric_type": "total_output_tokens"}, buckets=TOKEN_LEN_BUCKETS)
        self._input_len = self._families["input"].Metric(
            labels={**labels, "response_metric_type": "total_input_tokens"}, buckets=TOKEN_LEN_BUCKETS)
        self._last: dict[tuple[str, str], float] = {}
        self._stats, self._period_s = stats, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="trtllm-stats", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self._period_s):
            stats = self._stats()
            if stats is not None:
                self._set(stats_values(stats))

    def request_finished(self, input_tokens: int, output_tokens: int) -> None:
        """reportCustomMetrics: once per finished request, its prompt and output lengths."""
        self._input_len.observe(input_tokens)
        self._output_len.observe(output_tokens)

    def _set(self, values: dict[tuple[str, str], float]) -> None:
        for key, value in values.items():
            if self._last.get(key) != value:
                self._gauges[key].set(value)
                self._last[key] = value

    def close(self) -> None:
        """Stop the thread, then free the metrics while the stub can still tell Triton (call from ``finalize``)."""
        self._stop.set()
        self._thread.join()
        free_metrics(self)
