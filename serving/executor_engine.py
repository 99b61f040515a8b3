"""TensorRT-LLM's executor in the ``llm`` model's own process, behind the CPU engine's surface: the GPU layout.

The ``llm`` model (model_repository/llm/1/model.py) runs the same code on both layouts; only its engine differs: the
CPU engine, or this — ``start``, ``submit(GenerationRequest)``, ``queued``, ``active``, ``kv_occupancy``,
``shutdown``, and cpu_engine ``TokenEvent``s through ``on_event`` — over ``Executor`` from ``bindings``:
``tensorrt_llm.bindings.executor`` on a GPU, or cpu_engine/trtllm_executor.py (the same API over the CPU engine) on
CPU.

Why in-process (docs/gpu.md, "Why the llm owns the executor"): the former GPU layout streamed each request through a
``tensorrt_llm`` model with a decoupled BLS call, and python_backend's own lock order (GIL → response-iterator map →
an iterator's mutex → GIL) could deadlock that stub under concurrent streams, with Triton's health still green. No BLS
runs here, so that cycle cannot form; each token crosses one process boundary (this stub → Triton) instead of two; and
finish reasons come from the executor itself. It is what NVIDIA's Python ``tensorrt_llm`` model does (TensorRT-LLM
``triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/1/model.py``).

Threads: the caller's ``submit`` enqueues; one thread waits on ``await_responses`` (it releases the GIL) and turns
each response into events; one polls cancellation every ``CANCEL_POLL_S`` (as the C++ backend's ``WaitForCancel``).
Requests always stream from the executor; the ``llm`` holds a non-streamed answer back itself. Stop strings are
matched on text here (TensorRT-LLM matches token ids only): a sequence ends at the token that completes one, and a
request whose sequences all ended so gets ``cancel_request`` to free its slot at once.

API facts (names, keyword-only arguments, nanobind refusing ``None``, the GIL released in ``await_responses``,
priority honoured by the scheduler) were read from TensorRT-LLM's 1.x bindings (``cpp/tensorrt_llm/nanobind/
executor/``) and docs/gpu.md lists them; only a GPU run (builders/gpu_smoke.sh) confirms them against 1.2.1.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cpu_engine import EngineLimits, FinishReason, GenerationRequest, QueueFullError, TokenEvent
from cpu_engine.admission import Admission
from cpu_engine.stop_strings import StopStrings

CANCEL_POLL_S = 0.02  # as the CPU engine: how stale a client's cancellation may be
AWAIT_S = 0.1  # await_responses' timeout: how soon the response thread notices a shutdown
PROBE_PRIORITY = 1.0  # the executor's highest; a liveness probe is scheduled before any waiting request
_GUIDE_TYPES = {"json": "JSON", "json_schema": "JSON_SCHEMA", "regex": "REGEX", "ebnf_grammar": "EBNF_GRAMMAR"}


def _flag(params: dict[str, str], key: str) -> bool | None:
    value = params.get(key, "")
    return None if value == "" else value.lower() in ("1", "true")


def executor_config(trtllm, params: dict[str, str], limits: EngineLimits):
    """The ``ExecutorConfig`` the ``llm`` model's parameters describe (builders/trtllm/layout.py renders them). Only
    values that are set are passed: nanobind refuses ``None`` for arguments that are not optional."""
    kv = {"enable_block_reuse": _flag(params, "enable_kv_cache_reuse"),
          "free_gpu_memory_fraction": float(params["kv_cache_free_gpu_mem_fraction"])
          if params.get("kv_cache_free_gpu_mem_fraction") else None,
          "max_tokens": int(params["max_tokens_in_paged_kv_cache"]) if params.get("max_tokens_in_paged_kv_cache")
          else None}
    policy = {"guaranteed_no_evict": trtllm.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
              "max_utilization": trtllm.CapacitySchedulerPolicy.MAX_UTILIZATION}[
        params.get("batch_scheduler_policy") or "guaranteed_no_evict"]
    config = {"max_beam_width": 1, "scheduler_config": trtllm.SchedulerConfig(policy),
              "kv_cache_config": trtllm.KvCacheConfig(**{k: v for k, v in kv.items() if v is not None}),
              "enable_chunked_context": _flag(params, "enable_chunked_context"),
              "batching_type": trtllm.BatchingType.INFLIGHT, "max_batch_size": limits.max_batch_size,
              "max_num_tokens": limits.max_num_tokens}
    if info := params.get("xgrammar_tokenizer_info_path"):  # builders/trtllm/guided.py wrote it beside the engine
        tokenizer = json.loads(Path(info).read_text(encoding="utf-8"))
        config["guided_decoding_config"] = trtllm.GuidedDecodingConfig(
            trtllm.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR, encoded_vocab=tokenizer["encoded_vocab"],
            tokenizer_str=tokenizer["tokenizer_str"], stop_token_ids=tokenizer["stop_token_ids"])
    parallel = {}
    if ids := params.get("gpu_device_ids"):
        parallel["device_ids"] = [int(i) for i in ids.split(",")]
    if os.environ.get("TRTLLM_ORCHESTRATOR") == "1":  # one process spawns a worker per rank (builders/trtllm/serve.py)
        parallel["communication_mode"] = trtllm.CommunicationMode.ORCHESTRATOR
        parallel["orchestrator_config"] = trtllm.OrchestratorConfig(True, params["executor_worker_path"])
    if parallel:
        config["parallel_config"] = trtllm.ParallelConfig(trtllm.CommunicationType.MPI, **parallel)
    return trtllm.ExecutorConfig(**{k: v for k, v in config.items() if v is not None})


@dataclass
class _Sequence:
    stops: StopStrings | None
    generated: int = 0
    ended: bool = False  # its last event went out (the executor may still be finishing it)


@dataclass
class _Live:
    request: GenerationRequest
    sequences: list[_Sequence]
    waiting: bool = True  # counted in the admission queue until its first response
    cancel_sent: bool = False
    # Its last event is out, so the llm may have sent its final response: is_cancelled() must not be called again
    # (after the final response it crashed tritonserver 2.51 in TRITONBACKEND_ResponseFactoryIsCancelled). Set and
    # read under ``guard``, which the cancellation watch holds while it calls is_cancelled() (one request's lock: the
    # watch's IPC round trips never hold up the other requests' responses).
    answered: bool = False
    guard: threading.Lock = field(default_factory=threading.Lock)
    cached_tokens: int = 0  # the executor's reused prompt blocks × tokens_per_block (its perf metrics)


class ExecutorEngine:
    """The CPU engine's surface over ``bindings.Executor`` (module docstring)."""

    supports_top_logprobs = False  # the executor returns the chosen tokens' log-probs only

    def __init__(self, bindings, engine_dir: str, params: dict[str, str], limits: EngineLimits,
                 on_event: Callable[[TokenEvent], None], token_bytes: list[bytes],
                 on_queue_full: Callable[[bool], None] | None = None):
        self.trtllm = bindings
        self.limits = limits
        self.on_event = on_event
        self.token_bytes = token_bytes
        self.executor = bindings.Executor(engine_dir, bindings.ModelType.DECODER_ONLY,
                                          executor_config(bindings, params, limits))
        self._admission = Admission(limits.max_queue_size, on_queue_full)
        # Banned in JSON-guided requests (bad words of one token each), as the CPU engine masks them (cpu_engine/
        # grammar.py, Grammars): xgrammar lets raw control characters into JSON strings, which strict parsers refuse.
        self._control_tokens = [[token] for token, text in enumerate(token_bytes) if any(b < 0x20 for b in text)]
        self._live: dict[int, _Live] = {}  # executor request id → its state; submit adds, the response thread removes
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closing = threading.Event()
        self._stats = None  # the newest IterationStats (KV use for kv_occupancy and the nv_trt_llm gauges)
        self._threads = [threading.Thread(target=self._respond, name="executor-responses", daemon=True),
                         threading.Thread(target=self._watch, name="executor-cancel", daemon=True)]

    # ---- the engine surface (any thread) -------------------------------------------------------------
    def start(self) -> ExecutorEngine:
        if not self.executor.can_enqueue_requests():
            # A worker rank of a multi-node group (leader mode): its executor follows the leader's until shutdown.
            threading.Thread(target=self.executor.shutdown, name="executor-worker", daemon=True).start()
            return self
        for thread in self._threads:
            thread.start()
        return self

    def submit(self, request: GenerationRequest) -> None:
        if request.num_return_sequences > self.limits.max_batch_size:
            raise ValueError(f"num_return_sequences {request.num_return_sequences} exceeds the engine's "
                             f"max_batch_size {self.limits.max_batch_size}")
        if request.probe:  # outside the bounded queue (serving/health.py)
            self._admission.admit_probe()
        else:
            self._admission.admit()
        stops = StopStrings.of(self.token_bytes, request.stop_words) if request.stop_words else None
        live = _Live(request, [_Sequence(stops and stops.fresh()) for _ in range(request.num_return_sequences)])
        try:
            with self._lock:
                self._live[self.executor.enqueue_request(self._request(request))] = live
        except Exception as exc:
            self._left_queue(live)
            if "queue size" in str(exc):  # "Maximum queue size of N has been reached, please try again later"
                raise QueueFullError(str(exc)) from None
            raise ValueError(f"TensorRT-LLM refused the request: {exc}") from None

    @property
    def queued(self) -> int:
        return self._admission.waiting

    @property
    def active(self) -> int:
        """Requests past the queue whose last event has not gone out: the llm reads it with a request's final
        response, so a finished request never counts here (the launcher's drain waits for 0)."""
        return sum(not live.waiting and not live.answered for live in list(self._live.values()))

    @property
    def kv_occupancy(self) -> float:
        """The newest iteration stats' used / max KV blocks (≤ 100 ms old); 0 once every request's last event is out,
        so the gauge the llm sets with the last final response is not that stale snapshot."""
        kv = getattr(self._stats, "kv_cache_stats", None)
        if not any(not live.answered for live in list(self._live.values())):
            return 0.0
        return kv.used_num_blocks / kv.max_num_blocks if kv is not None and kv.max_num_blocks else 0.0

    # The executor's KV blocks are reported as TensorRT-LLM's nv_trt_llm_kv_cache_block_metrics (serving/trtllm_metrics.py).
    kv_size = None

    def iteration_stats(self):
        """The executor's newest ``IterationStats`` (None before its first iteration), for the nv_trt_llm gauges."""
        return self._stats

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new work, let the running requests finish (up to ``timeout``), cancel the rest, stop."""
        self._admission.stop()
        with self._idle:
            if not self._idle.wait_for(lambda: not self._live, timeout):
                for request_id in list(self._live):
                    self.executor.cancel_request(request_id)
                self._idle.wait_for(lambda: not self._live, 10.0)
        self._closing.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        self.executor.shutdown()

    # ---- GenerationRequest → the executor's Request ------------------------------------------------------
    def _request(self, request: GenerationRequest):
        trtllm, s = self.trtllm, request.sampling
        sampling = {"top_k": s.top_k, "top_p": s.top_p, "temperature": s.temperature, "seed": s.seed,
                    "min_tokens": s.min_tokens or None, "repetition_penalty": s.repetition_penalty,
                    "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
                    "min_p": s.min_p or None,
                    "num_return_sequences": request.num_return_sequences if request.num_return_sequences > 1
                    else None}
        bad_words = list(request.bad_words)
        if request.guide is not None and request.guide.guide_type in ("json", "json_schema"):
            bad_words += self._control_tokens
        kwargs = {
            "streaming": True,  # always: the llm holds a non-streamed answer back itself
            "sampling_config": trtllm.SamplingConfig(1, **{k: v for k, v in sampling.items() if v is not None}),
            # return_perf_metrics: each result's kv_cache_metrics, whose reused blocks are the cached prompt tokens.
            "output_config": trtllm.OutputConfig(return_log_probs=request.return_log_probs,
                                                 exclude_input_from_output=True, return_perf_metrics=True),
            "end_id": request.end_id, "stop_words": request.stop_words or None,
            "bad_words": bad_words or None,
            # A float32 torch tensor [vocab_size], as tensorrtllm_backend's own Python model passes it.
            "embedding_bias": request.embedding_bias,
            "num_return_sequences": request.num_return_sequences,
            "priority": PROBE_PRIORITY if request.probe else None,
        }
        if request.guide is not None:
            kind, guide_type, guide = trtllm.GuidedDecodingParams.GuideType, request.guide.guide_type, request.guide.guide
            if guide_type == "structural_tag":
                # As the EBNF grammar xgrammar compiles the tag to: the C++ runtime's guided decoder compiles EBNF in
                # every release seen, while STRUCTURAL_TAG is missing from some and refused by the newest (docs/gpu.md).
                guide_type, guide = "ebnf_grammar", request.guide.ebnf()
            kwargs["guided_decoding_params"] = trtllm.GuidedDecodingParams(getattr(kind, _GUIDE_TYPES[guide_type]),
                                                                           guide or None)
        return trtllm.Request(list(request.prompt_ids), request.max_new_tokens,
                              **{k: v for k, v in kwargs.items() if v is not None})

    # ---- responses (one thread) -----------------------------------------------------------------------------
    def _respond(self) -> None:
        wait = datetime.timedelta(seconds=AWAIT_S)
        while not self._closing.is_set():
            for response in self.executor.await_responses(timeout=wait):
                with self._lock:
                    live = self._live.get(response.request_id)
                if live is None:
                    continue
                final = self._answer(live, response)
                if final:
                    with self._idle:
                        del self._live[response.request_id]
                        self._idle.notify_all()

    def _answer(self, live: _Live, response) -> bool:
        """One executor response → events; True when the request is over in the executor."""
        self._left_queue(live)
        request = live.request
        prompt = len(request.prompt_ids)
        if response.has_error():  # the request is over: every sequence not ended yet ends with the error
            for index, seq in enumerate(live.sequences):
                if not seq.ended:
                    self._emit(live, seq, TokenEvent(request.request_id, None, FinishReason.ERROR, prompt,
                                                     seq.generated, index, error=response.error_msg))
            return True
        result = response.result
        if result.request_perf_metrics is not None:
            reused = result.request_perf_metrics.kv_cache_metrics.num_reused_blocks
            live.cached_tokens = reused * self.limits.tokens_per_block
        index = result.sequence_index
        seq = live.sequences[index]
        if not seq.ended:
            tokens = list(result.output_token_ids[0])
            logprobs = list(result.log_probs[0])[-len(tokens):] if result.log_probs and tokens else []
            ended = result.is_sequence_final or result.is_final
            for i, token in enumerate(tokens):
                seq.generated += 1
                reason = None
                if seq.stops is not None and seq.stops.hit(self.token_bytes[token]):
                    reason = FinishReason.STOP
                elif i == len(tokens) - 1 and ended:
                    reason = self._reason(result.finish_reasons[0], seq, request)
                self._emit(live, seq, TokenEvent(request.request_id, token, reason, prompt, seq.generated, index,
                                                 logprobs[i] if logprobs else None, cached_tokens=live.cached_tokens))
                if seq.ended:
                    break
            if ended and not seq.ended:  # the end id ended it: no token comes with that
                self._emit(live, seq, TokenEvent(request.request_id, None,
                                                 self._reason(result.finish_reasons[0], seq, request),
                                                 prompt, seq.generated, index, cached_tokens=live.cached_tokens))
            if live.answered and not result.is_final and not live.cancel_sent:
                live.cancel_sent = True  # stop strings ended every sequence here: free the slot now
                self.executor.cancel_request(response.request_id)
        return bool(result.is_final)

    def _emit(self, live: _Live, seq: _Sequence, event: TokenEvent) -> None:
        if event.finish_reason is not None:
            seq.ended = True
            if all(s.ended for s in live.sequences):
                with live.guard:  # before the event: the llm may send the final response as soon as it has it
                    live.answered = True
        self.on_event(event)

    def _reason(self, reason, seq: _Sequence, request: GenerationRequest) -> FinishReason:
        names = self.trtllm.FinishReason
        if reason == names.LENGTH:
            return FinishReason.LENGTH
        if reason == names.CANCELLED or reason == names.TIMED_OUT:
            return FinishReason.CANCELLED
        if reason == names.END_ID or reason == names.STOP_WORDS:
            return FinishReason.STOP
        # NOT_FINISHED on a final result: what the count says (the executor's finish reasons need beam width 1).
        return FinishReason.LENGTH if seq.generated >= request.max_new_tokens else FinishReason.STOP

    def _left_queue(self, live: _Live) -> None:
        if live.waiting:
            live.waiting = False
            probe = int(live.request.probe)
            self._admission.left_queue(count=1 - probe, probes=probe)

    # ---- cancellation and stats (one thread) ----------------------------------------------------------------
    def _watch(self) -> None:
        next_stats = 0.0
        while not self._closing.wait(CANCEL_POLL_S):
            with self._lock:
                live = list(self._live.items())
            for request_id, state in live:
                with state.guard:  # never after its last event (_Live.answered)
                    if state.cancel_sent or state.answered:
                        continue
                    try:
                        cancelled = state.request.is_cancelled()
                    except Exception:  # noqa: BLE001 - the request's own callback failing ends it like a cancel
                        cancelled = True
                if cancelled:
                    state.cancel_sent = True
                    self.executor.cancel_request(request_id)
            if time.monotonic() >= next_stats:
                next_stats = time.monotonic() + 0.1
                stats = self.executor.get_latest_iteration_stats()
                if stats:
                    self._stats = stats[-1]
