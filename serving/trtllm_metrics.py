"""The metric families TensorRT-LLM's C++ Triton backend registers, exported by the ``tensorrt_llm`` stand-in
(model_repository/trtllm/tensorrt_llm_standin) through Triton's custom-metrics API, so the chart's GPU queries
(helm/triton-llm, ``target: gpu``) run against live series on CPU (tests/test_prometheus.py).

Names, label keys and label values are those of NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`` (two stored versions
of the 1.x line read, identical here; the exact release/1.2.1 file the r26.07 image builds could not be read):
every series carries ``model`` and ``version``, plus one category label per family. What the values mean comes from
``model_instance_state.cc`` ``WaitForStats`` (the executor's iteration stats) and ``WaitForResponse`` /
``reportCustomMetrics`` (token lengths per finished request), and the executor
(``cpp/tensorrt_llm/executor/executorImpl.cpp``: ``getCurrentIterationStats``, ``fetchNewRequests``):

- ``active`` = requests the executor has taken into its batch, at most ``max`` = ``maxNumActiveRequests`` (the
  model's max_batch_size without pipeline parallelism); the backlog beyond it is the executor's
  ``numQueuedRequests``, **which the backend does not export**;
- ``scheduled`` = requests in this iteration's batch; ``waiting`` = active - scheduled: requests in a slot that the
  capacity scheduler held back (KV blocks short, token budget spent), never the backlog beyond the slots.

Not reproduced (nothing on CPU to report, and no chart query reads them): ``nv_trt_llm_runtime_memory_metrics``
(the runtime's own GPU/pinned allocations), ``nv_trt_llm_disaggregated_serving_metrics``,
``nv_trt_llm_general_metrics`` (the executor's iteration counter and timestamp), and the
``total_context_tokens`` label of ``nv_trt_llm_inflight_batcher_metrics`` (prompt tokens in this iteration: the
token source does not say which prompt chunk each step ran).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import triton_python_backend_utils as pb_utils

from serving.llm_metrics import free_metrics

#: custom_metrics_reporter.cc: the buckets of both token-length histograms.
TOKEN_LEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
#: model_instance_state.cc: the stats thread's period when the model sets no ``stats_check_period_ms``.
STATS_CHECK_PERIOD_S = 0.1


class TrtLlmMetrics:
    """Like the backend's ``WaitForStats`` thread, a thread of its own reads ``snapshot()`` — (requests holding a
    batch slot, those of them with no token yet, KV occupancy 0..1) — every ``period_s`` and sets the gauges; each
    changed value is one message to the Triton process, unchanged ones are skipped."""

    def __init__(self, model_name: str, model_version: str, max_batch_size: int, max_seq_len: int,
                 snapshot: Callable[[], tuple[int, int, float]], period_s: float = STATS_CHECK_PERIOD_S):
        labels = {"model": model_name, "version": model_version}
        gauge, histogram = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.HISTOGRAM
        # A MetricFamily must outlive its metrics: every family stays referenced here until close().
        families = {"request": ("nv_trt_llm_request_metrics", "TRT LLM request metrics", gauge),
                    "kv": ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", gauge),
                    "ifb": ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight_batcher-specific metrics", gauge),
                    "output": ("nv_llm_output_token_len", "TRT LLM response metrics", histogram),
                    "input": ("nv_llm_input_token_len", "TRT LLM response metrics", histogram)}
        self._families = {key: pb_utils.MetricFamily(name=name, description=description, kind=kind)
                          for key, (name, description, kind) in families.items()}

        def group(family: str, category: str, values: tuple[str, ...]) -> dict:
            return {(family, v): self._families[family].Metric(labels={**labels, category: v}) for v in values}

        self._gauges = {**group("request", "request_type", ("active", "max", "scheduled", "context", "waiting")),
                        **group("kv", "kv_cache_block_type",
                                ("max", "free", "used", "tokens_per", "reused", "fraction")),
                        **group("ifb", "inflight_batcher_specific_metric",
                                ("generation_requests", "micro_batch_id", "paused_requests"))}
        self._output_len = self._families["output"].Metric(
            labels={**labels, "response_metric_type": "total_output_tokens"}, buckets=TOKEN_LEN_BUCKETS)
        self._input_len = self._families["input"].Metric(
            labels={**labels, "response_metric_type": "total_input_tokens"}, buckets=TOKEN_LEN_BUCKETS)
        self._max_batch_size = max_batch_size
        # The CPU engine's cache is one contiguous max_seq_len row per slot, not paged: each token position counts
        # as a block of one token, so used / max is exactly its occupancy.
        self._kv_blocks = max_batch_size * max_seq_len
        self._last: dict[tuple[str, str], float] = {}
        self._snapshot, self._period_s = snapshot, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="trtllm-stats", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self._period_s):
            self._update(*self._snapshot())

    def _update(self, active: int, prefilling: int, kv_occupancy: float) -> None:
        """``active``: requests holding a batch slot; ``prefilling``: those of them that have no token yet."""
        used = round(kv_occupancy * self._kv_blocks)
        # Every slot steps in every iteration of the CPU engine and its cache holds max_seq_len for each slot, so
        # nothing in a slot is ever held back: scheduled = active, waiting = 0, none paused — as on a GPU whose
        # KV cache is not the limit.
        self._set({("request", "active"): active, ("request", "max"): self._max_batch_size,
                   ("request", "scheduled"): active, ("request", "context"): prefilling, ("request", "waiting"): 0,
                   ("kv", "max"): self._kv_blocks, ("kv", "free"): self._kv_blocks - used, ("kv", "used"): used,
                   ("kv", "tokens_per"): 1, ("kv", "reused"): 0, ("kv", "fraction"): used / self._kv_blocks,
                   ("ifb", "generation_requests"): active - prefilling, ("ifb", "micro_batch_id"): 0,
                   ("ifb", "paused_requests"): 0})

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
