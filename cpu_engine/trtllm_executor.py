"""TensorRT-LLM's executor API (``tensorrt_llm.bindings.executor``) over the CPU engine: the GPU layout on CPU.

The GPU layout's ``llm`` model drives ``tensorrt_llm.bindings.executor.Executor`` in its own process
(serving/executor_engine.py). Here the same code drives this module instead (the model's ``executor_bindings``
parameter names it), so every line of that adapter runs under a real tritonserver on CPU: ``make serve
LAYOUT=trtllm-standin`` and the end-to-end tests of both layouts. Tokens come from the CPU engine (real answers,
comparable with the CPU layout token for token) or the ``null`` source (no model compute; for measuring the serving
path: cpu_engine/token_sources.py).

Only what the adapter uses is here, with the bindings' names and calling conventions as read from TensorRT-LLM 1.x
(``cpp/tensorrt_llm/nanobind/executor/``: ``bindings.cpp``, ``request.cpp``, ``executor.cpp``,
``executorConfig.cpp``; docs/gpu.md lists each fact and its source), so a call the real module would refuse fails
here too: keyword-only arguments after ``Request``'s ``max_tokens`` and ``SamplingConfig``'s ``beam_width``, no
``None`` for an argument that is not optional (nanobind), unknown keywords refused. What it reproduces of the
executor's behaviour:

- streaming results carry the tokens new since the last response, never the prompt; a non-streaming request gets its
  whole output once; the end id ends a sequence and is not output; ``finish_reasons`` per beam (END_ID, STOP_WORDS,
  LENGTH, CANCELLED); ``sequence_index`` / ``is_sequence_final`` for ``num_return_sequences`` > 1, ``is_final`` once
  all have ended;
- stop and bad words are token-id sequences (as TensorRT-LLM matches them: the CPU engine runs without its text match);
- ``max_tokens`` is shortened to fit ``max_seq_len``; a prompt longer than the engine's ``max_input_len`` gets an
  error response ("Prompt length (N) exceeds maximum input length (M)."), a full queue an exception ("Maximum queue
  size of N has been reached, please try again later");
- ``cancel_request`` ends the request with CANCELLED (polled by the engine every 20 ms, as the executor checks at
  its next iteration); a request of higher ``priority`` than the default is scheduled before the waiting ones even
  when every slot is taken (here: the engine's probe row and KV blocks, cpu_engine/scheduler.py, kv_cache.py);
- ``get_latest_iteration_stats`` reports requests and KV blocks the way the executor's ``IterationStats`` do: the CPU
  engine's cache is paged too (``KvCacheConfig``'s ``max_tokens`` and ``enable_block_reuse`` size and switch it),
  with its reused and missed blocks since start; ``OutputConfig(return_perf_metrics=True)`` adds a result's
  ``request_perf_metrics.kv_cache_metrics`` (the blocks its prompt reused, allocated and missed).

Stand-in options (token source, its pace, threads, the tokenizer for guides) come from ``configure``, which only the
CPU layout's renderer sets (builders/trtllm/standin.py), never the adapter.
"""

from __future__ import annotations

import datetime
import enum
import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from .admission import QueueFullError
from .block_manager import prompt_blocks
from .engine import EngineLimits, LLMEngine, TokenEvent
from .engine_dir import load_engine, read_config
from .queues import take_all
from .sampling import SamplingParams
from .scheduler import FinishReason as EngineFinish
from .scheduler import GenerationRequest
from .token_sources import TOKEN_SOURCES, NullSource

_STANDIN = {"token_source": "engine", "null_step_s": 0.0, "cpu_threads": 0, "tokenizer_dir": ""}
_UNBOUNDED_QUEUE = 1 << 30
#: The OS name of the thread that makes the stand-in's tokens (what the GPU does on a GPU): loadtest/cost_per_token.py
#: reports its CPU apart from the serving path's.
TOKEN_THREAD_NAME = "standin-tokens"


def configure(token_source: str = "engine", null_step_s: float = 0.0, cpu_threads: int = 0,
              tokenizer_dir: str = "") -> None:
    """Where the next ``Executor``'s tokens come from (the stand-in's own knobs; the real module has none)."""
    if token_source not in TOKEN_SOURCES:
        raise ValueError(f"token source {token_source!r}: expected one of {', '.join(TOKEN_SOURCES)}")
    _STANDIN.update(token_source=token_source, null_step_s=null_step_s, cpu_threads=cpu_threads,
                    tokenizer_dir=tokenizer_dir)


def _kwargs(name: str, given: dict, allowed: dict, required: tuple[str, ...] = ()) -> dict:
    """The binding's argument check: unknown keywords are a TypeError, and so is None for a non-optional one."""
    unknown = set(given) - set(allowed)
    if unknown:
        raise TypeError(f"{name}(): unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    for key in required:
        if key in given and given[key] is None:
            raise TypeError(f"{name}(): incompatible function arguments: {key}=None")
    return {**allowed, **given}


class _Attrs:
    def __init__(self, values: dict):
        self.__dict__.update(values)


# ---- enums (bindings.cpp) -------------------------------------------------------------------------------
class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class BatchingType(enum.Enum):
    STATIC = 0
    INFLIGHT = 1


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


# ---- configuration (executorConfig.cpp) -----------------------------------------------------------------
class SchedulerConfig(_Attrs):
    def __init__(self, capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
                 context_chunking_policy=None, dynamic_batch_config=None):
        super().__init__(dict(capacity_scheduler_policy=capacity_scheduler_policy,
                              context_chunking_policy=context_chunking_policy,
                              dynamic_batch_config=dynamic_batch_config))


class KvCacheConfig(_Attrs):
    _ARGS = dict(enable_block_reuse=True, max_tokens=None, max_attention_window=None, sink_token_length=None,
                 free_gpu_memory_fraction=None, host_cache_size=None, onboard_blocks=True,
                 cross_kv_cache_fraction=None, secondary_offload_min_priority=None, event_buffer_max_size=0,
                 enable_partial_reuse=True, copy_on_partial_reuse=True)

    def __init__(self, **kwargs):
        super().__init__(_kwargs("KvCacheConfig", kwargs, self._ARGS,
                                 ("enable_block_reuse", "onboard_blocks", "event_buffer_max_size")))


class GuidedDecodingConfig(_Attrs):
    class GuidedDecodingBackend(enum.Enum):
        XGRAMMAR = 0
        LLGUIDANCE = 1

    def __init__(self, backend, encoded_vocab=None, tokenizer_str=None, stop_token_ids=None):
        super().__init__(dict(backend=backend, encoded_vocab=encoded_vocab, tokenizer_str=tokenizer_str,
                              stop_token_ids=stop_token_ids))


class OrchestratorConfig(_Attrs):
    def __init__(self, is_orchestrator=True, worker_executable_path="", orch_leader_comm=None, spawn_processes=True):
        if worker_executable_path is None:
            raise TypeError("OrchestratorConfig(): incompatible function arguments: worker_executable_path=None")
        super().__init__(dict(is_orchestrator=is_orchestrator, worker_executable_path=worker_executable_path,
                              orch_leader_comm=orch_leader_comm, spawn_processes=spawn_processes))


class ParallelConfig(_Attrs):
    def __init__(self, communication_type=CommunicationType.MPI, communication_mode=CommunicationMode.LEADER,
                 device_ids=None, participant_ids=None, orchestrator_config=None, num_nodes=None):
        super().__init__(dict(communication_type=communication_type, communication_mode=communication_mode,
                              device_ids=device_ids, participant_ids=participant_ids,
                              orchestrator_config=orchestrator_config, num_nodes=num_nodes))


class ExecutorConfig(_Attrs):
    _ARGS = dict(max_beam_width=1, scheduler_config=None, kv_cache_config=None, enable_chunked_context=False,
                 normalize_log_probs=True, iter_stats_max_iterations=1000, request_stats_max_iterations=0,
                 batching_type=BatchingType.INFLIGHT, max_batch_size=None, max_num_tokens=None, parallel_config=None,
                 max_queue_size=None, guided_decoding_config=None, recv_poll_period_ms=0,
                 max_seq_idle_microseconds=180000000, gather_generation_logits=False)

    def __init__(self, **kwargs):
        values = _kwargs("ExecutorConfig", kwargs, self._ARGS,
                         ("max_beam_width", "enable_chunked_context", "normalize_log_probs", "batching_type"))
        values["scheduler_config"] = values["scheduler_config"] or SchedulerConfig()
        values["kv_cache_config"] = values["kv_cache_config"] or KvCacheConfig()
        super().__init__(values)


# ---- requests and responses (request.cpp) ---------------------------------------------------------------
class SamplingConfig(_Attrs):
    _ARGS = dict(top_k=None, top_p=None, top_p_min=None, top_p_reset_ids=None, top_p_decay=None, seed=None,
                 temperature=None, min_tokens=None, beam_search_diversity_rate=None, repetition_penalty=None,
                 presence_penalty=None, frequency_penalty=None, length_penalty=None, early_stopping=None,
                 no_repeat_ngram_size=None, num_return_sequences=None, min_p=None, beam_width_array=None)

    def __init__(self, beam_width=1, **kwargs):
        super().__init__({"beam_width": beam_width, **_kwargs("SamplingConfig", kwargs, self._ARGS)})


class OutputConfig(_Attrs):
    _ARGS = dict(return_log_probs=None, return_context_logits=None, return_generation_logits=None,
                 exclude_input_from_output=None, return_encoder_output=None, return_perf_metrics=None,
                 additional_model_outputs=None)

    def __init__(self, **kwargs):
        super().__init__(_kwargs("OutputConfig", kwargs, self._ARGS))


class GuidedDecodingParams(_Attrs):
    class GuideType(enum.Enum):
        JSON = 0
        JSON_SCHEMA = 1
        REGEX = 2
        EBNF_GRAMMAR = 3
        STRUCTURAL_TAG = 4

    def __init__(self, guide_type, guide=None):
        super().__init__(dict(guide_type=guide_type, guide=guide))


class Request(_Attrs):
    _ARGS = dict(streaming=False, sampling_config=None, output_config=None, end_id=None, pad_id=None,
                 position_ids=None, bad_words=None, stop_words=None, embedding_bias=None, client_id=None,
                 return_all_generated_tokens=False, priority=0.5, num_return_sequences=1,
                 guided_decoding_params=None, allotted_time_ms=None)

    def __init__(self, input_token_ids, max_tokens, **kwargs):
        values = _kwargs("Request", kwargs, self._ARGS,
                         ("streaming", "return_all_generated_tokens", "priority", "num_return_sequences"))
        values["sampling_config"] = values["sampling_config"] or SamplingConfig()
        values["output_config"] = values["output_config"] or OutputConfig()
        super().__init__({"input_token_ids": list(input_token_ids), "max_tokens": max_tokens, **values})


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    sequence_index: int = 0
    is_sequence_final: bool = False
    log_probs: list[list[float]] | None = None
    cum_log_probs: list[float] | None = None
    decoding_iter: int = 0
    request_perf_metrics: "RequestPerfMetrics | None" = None


@dataclass
class KvCacheMetrics:
    """A request's prompt blocks (``RequestPerfMetrics.KvCacheMetrics``), counted when its context is allocated."""

    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class RequestPerfMetrics:
    kv_cache_metrics: KvCacheMetrics = field(default_factory=KvCacheMetrics)


class Response:
    def __init__(self, request_id: int, result: Result | None = None, error_msg: str = "", client_id=None):
        self.request_id, self._result, self.error_msg, self.client_id = request_id, result, error_msg, client_id

    def has_error(self) -> bool:
        return bool(self.error_msg)

    @property
    def result(self) -> Result:
        if self.has_error():  # the C++ getter throws on an error response
            raise RuntimeError(f"Cannot get the result for a response with an error ({self.error_msg})")
        return self._result


# ---- statistics (bindings.cpp: IterationStats, KvCacheStats, InflightBatchingStats) ------------------------
@dataclass
class KvCacheStats:
    max_num_blocks: int
    free_num_blocks: int
    used_num_blocks: int
    tokens_per_block: int
    alloc_total_blocks: int = 0
    alloc_new_blocks: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0
    cache_hit_rate: float = 0.0


@dataclass
class InflightBatchingStats:
    num_scheduled_requests: int
    num_context_requests: int
    num_gen_requests: int
    num_paused_requests: int = 0
    num_ctx_tokens: int = 0
    micro_batch_id: int = 0
    avg_num_decoded_tokens_per_iter: float = 1.0


@dataclass
class IterationStats:
    timestamp: str
    iter: int
    num_active_requests: int
    num_queued_requests: int
    max_num_active_requests: int
    kv_cache_stats: KvCacheStats
    inflight_batching_stats: InflightBatchingStats
    num_completed_requests: int = 0
    iter_latency_ms: float = 0.0
    gpu_mem_usage: int = 0
    cpu_mem_usage: int = 0
    pinned_mem_usage: int = 0


# ---- the executor ---------------------------------------------------------------------------------------
def _name_os_thread(native_id: int, name: str) -> None:
    """Name a thread of this process for ``/proc/PID/task/TID/comm`` readers (Linux); elsewhere, nothing."""
    try:
        with open(f"/proc/self/task/{native_id}/comm", "w") as comm:
            comm.write(name)
    except OSError:
        pass


_REASONS = {EngineFinish.LENGTH: FinishReason.LENGTH, EngineFinish.CANCELLED: FinishReason.CANCELLED}


@dataclass
class _Running:
    request: Request
    streaming: bool
    sequences: int
    ended: int = 0
    failed: bool = False
    first_token: bool = False
    output: list[list[int]] = field(default_factory=list)  # non-streaming: per sequence, everything so far
    log_probs: list[list[float]] = field(default_factory=list)
    cum_log_probs: list[float] = field(default_factory=list)


class Executor:
    def __init__(self, model_path, model_type: ModelType, executor_config: ExecutorConfig):
        if model_type is not ModelType.DECODER_ONLY:
            raise RuntimeError("the CPU stand-in runs decoder-only engines")
        config, build = executor_config, read_config(model_path)["build_config"]
        self.max_input_len, self.max_seq_len = build["max_input_len"], build["max_seq_len"]
        self.max_batch_size = config.max_batch_size or build["max_batch_size"]
        self._max_queue_size = config.max_queue_size or _UNBOUNDED_QUEUE
        kv = config.kv_cache_config
        limits = EngineLimits.from_build(build, self._max_queue_size, max_batch_size=self.max_batch_size,
                                         max_num_tokens=config.max_num_tokens or build["max_num_tokens"],
                                         max_tokens_in_paged_kv_cache=kv.max_tokens,
                                         enable_kv_cache_reuse=kv.enable_block_reuse)
        self.tokens_per_block = limits.tokens_per_block
        self._guided = config.guided_decoding_config
        self._ids = itertools.count(1)
        self._running: dict[str, _Running] = {}  # engine request id (str of ours) → state
        self._cancelled: set[int] = set()
        self._responses: queue.SimpleQueue[Response] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._iteration = 0
        self._shut_down = False
        self._grammars = None
        if _STANDIN["token_source"] == "null":
            self.source = NullSource(limits, self._on_event, _STANDIN["null_step_s"]).start()
            self.vocab_size = None
        else:
            import torch

            torch.set_num_threads(_STANDIN["cpu_threads"] or os.cpu_count())  # once, at start-up
            loaded = load_engine(model_path)
            self.vocab_size = loaded.model.args.vocab_size
            # No token bytes: stop words match on token ids, as TensorRT-LLM matches them.
            self.source = LLMEngine(loaded.model, limits, on_event=self._on_event, dtype=loaded.compute_dtype).start()
        _name_os_thread(self.source._thread.native_id, TOKEN_THREAD_NAME)

    # ---- the API ----------------------------------------------------------------------------------------
    def enqueue_request(self, request: Request) -> int:
        if self._shut_down:
            raise RuntimeError("Shutdown called")
        request_id = next(self._ids)
        n = request.num_return_sequences
        if request.sampling_config.num_return_sequences:
            n = request.sampling_config.num_return_sequences
        running = _Running(request, request.streaming, n, output=[[] for _ in range(n)],
                           log_probs=[[] for _ in range(n)], cum_log_probs=[0.0] * n)
        error = self._invalid(request)
        if error:  # the executor answers a request it cannot run with an error response, not an exception
            self._responses.put(Response(request_id, error_msg=error))
            return request_id
        s = request.sampling_config
        sampling = SamplingParams(
            temperature=1.0 if s.temperature is None else s.temperature, top_k=1 if s.top_k is None else s.top_k,
            top_p=1.0 if s.top_p is None else s.top_p, seed=s.seed or 0, min_tokens=s.min_tokens or 0,
            repetition_penalty=1.0 if s.repetition_penalty is None else s.repetition_penalty,
            presence_penalty=s.presence_penalty or 0.0, frequency_penalty=s.frequency_penalty or 0.0,
            min_p=s.min_p or 0.0)
        gen = GenerationRequest(
            request_id=str(request_id), prompt_ids=request.input_token_ids,
            max_new_tokens=min(request.max_tokens, self.max_seq_len - len(request.input_token_ids)),
            sampling=sampling, end_id=request.end_id, stop_words=request.stop_words or [],
            bad_words=request.bad_words or [], embedding_bias=request.embedding_bias,
            is_cancelled=lambda: request_id in self._cancelled,
            return_log_probs=bool(request.output_config.return_log_probs), num_return_sequences=n,
            guide=self._guide(request.guided_decoding_params, request.end_id),
            probe=request.priority > 0.5)
        with self._lock:
            self._running[gen.request_id] = running
        try:
            self.source.submit(gen)
        except (QueueFullError, ValueError) as exc:
            with self._lock:
                del self._running[gen.request_id]
            if isinstance(exc, QueueFullError):
                raise RuntimeError(f"Maximum queue size of {self._max_queue_size} has been reached, please try again "
                                   "later") from None
            raise RuntimeError(str(exc)) from None
        return request_id

    def await_responses(self, timeout=None) -> list[Response]:
        if isinstance(timeout, datetime.timedelta):
            timeout = timeout.total_seconds()
        elif isinstance(timeout, int) and not isinstance(timeout, bool):
            raise TypeError("await_responses(): incompatible function arguments: timeout must be a timedelta or "
                            "float")
        return take_all(self._responses, timeout)

    def cancel_request(self, request_id: int) -> None:
        self._cancelled.add(request_id)

    def can_enqueue_requests(self) -> bool:
        return not self._shut_down

    def get_latest_iteration_stats(self) -> list[IterationStats]:
        active, queued = self.source.active, self.source.queued
        with self._lock:
            no_token = sum(not r.first_token for r in self._running.values())
        context = max(min(no_token - queued, active), 0)
        self._iteration += 1
        return [IterationStats(
            timestamp=time.strftime("%m-%d-%Y %H:%M:%S.000000"), iter=self._iteration, num_active_requests=active,
            num_queued_requests=queued, max_num_active_requests=self.max_batch_size,
            # Every running sequence steps in every iteration: scheduled = active, none paused (a sequence the
            # engine preempted for blocks is recomputed inside the same iterations, cpu_engine/scheduler.py).
            kv_cache_stats=self._kv_cache_stats(),
            inflight_batching_stats=InflightBatchingStats(num_scheduled_requests=active, num_context_requests=context,
                                                          num_gen_requests=active - context))]

    def _kv_cache_stats(self) -> KvCacheStats:
        if isinstance(self.source, NullSource):  # no cache: its occupancy over max_batch_size × max_seq_len tokens
            blocks = self.max_batch_size * self.max_seq_len
            used = round(self.source.kv_occupancy * blocks)
            return KvCacheStats(max_num_blocks=blocks, free_num_blocks=blocks - used, used_num_blocks=used,
                                tokens_per_block=1)
        stats, prefix = self.source.blocks.stats(), self.source.prefix_cache
        looked_up = prefix.reused_blocks + prefix.missed_blocks
        # Cached blocks nobody holds count as free, as in TensorRT-LLM (they are reclaimed when needed).
        return KvCacheStats(max_num_blocks=stats.total, free_num_blocks=stats.total - stats.used,
                            used_num_blocks=stats.used, tokens_per_block=self.tokens_per_block,
                            alloc_total_blocks=looked_up, alloc_new_blocks=prefix.missed_blocks,
                            reused_blocks=prefix.reused_blocks, missed_blocks=prefix.missed_blocks,
                            cache_hit_rate=prefix.reused_blocks / looked_up if looked_up else 0.0)

    def shutdown(self) -> None:
        if not self._shut_down:
            self._shut_down = True
            self.source.shutdown(timeout=25)

    # ---- inside -------------------------------------------------------------------------------------------
    def _invalid(self, request: Request) -> str:
        prompt = request.input_token_ids
        if not prompt:
            return "Executor failed to process the request: the prompt is empty"
        if len(prompt) > self.max_input_len:
            return f"Prompt length ({len(prompt)}) exceeds maximum input length ({self.max_input_len})."
        if self.vocab_size is not None and not all(0 <= i < self.vocab_size for i in prompt):
            return f"input_ids hold a token id outside [0, {self.vocab_size})"
        if len(prompt) >= self.max_seq_len:
            return f"Prompt length ({len(prompt)}) leaves no room to generate within max_seq_len ({self.max_seq_len})."
        if request.guided_decoding_params is not None and self._guided is None:
            return "Guided decoding is not enabled: the executor has no guided decoding config"
        bias = request.embedding_bias
        if bias is not None and (getattr(bias, "ndim", None) != 1 or str(bias.dtype) != "torch.float32"
                                 or self.vocab_size is not None and bias.shape[0] != self.vocab_size):
            return (f"embedding_bias must be a 1-D float32 torch tensor of the vocabulary's size ({self.vocab_size}), "
                    f"got {type(bias).__name__} {tuple(getattr(bias, 'shape', ()))} {getattr(bias, 'dtype', '')}")
        return ""

    def _guide(self, params: GuidedDecodingParams | None, end_id: int | None):
        if params is None or self.vocab_size is None:
            return None
        from .grammar import Grammars  # xgrammar: only for guided requests

        if self._grammars is None:
            self._grammars = Grammars(_STANDIN["tokenizer_dir"], self.vocab_size)
        kind = {GuidedDecodingParams.GuideType.JSON: "json", GuidedDecodingParams.GuideType.JSON_SCHEMA: "json_schema",
                GuidedDecodingParams.GuideType.REGEX: "regex",
                GuidedDecodingParams.GuideType.EBNF_GRAMMAR: "ebnf_grammar",
                GuidedDecodingParams.GuideType.STRUCTURAL_TAG: "structural_tag"}[params.guide_type]
        return self._grammars.compile(kind, params.guide or "")

    def _on_event(self, event: TokenEvent) -> None:
        """One CPU-engine event (engine thread) → the executor's response for it, if any."""
        with self._lock:
            running = self._running.get(event.request_id)
        if running is None or running.failed:
            return
        request_id, index = int(event.request_id), event.sequence_index
        if event.finish_reason is EngineFinish.ERROR:  # the executor fails the whole request at once
            running.failed = True
            self._forget(event.request_id)
            self._responses.put(Response(request_id, error_msg=f"Executor failed process requestId {request_id} "
                                                               f"due to the following error: {event.error}"))
            return
        new = [] if event.token_id is None else [event.token_id]
        logprobs = [] if event.logprob is None else [event.logprob]
        running.first_token |= bool(new)
        running.cum_log_probs[index] += sum(logprobs)
        ended = event.finish_reason is not None
        if not running.streaming:
            running.output[index] += new
            running.log_probs[index] += logprobs
            if not ended:
                return
            new, logprobs = running.output[index], running.log_probs[index]
        elif not new and not ended:
            return
        reason = FinishReason.NOT_FINISHED
        if ended:
            running.ended += 1
            reason = _REASONS.get(event.finish_reason) or (FinishReason.STOP_WORDS if event.token_id is not None
                                                           else FinishReason.END_ID)
        final = running.ended == running.sequences
        if final:
            self._forget(event.request_id)
        output = running.request.output_config
        wants = output.return_log_probs
        self._responses.put(Response(request_id, Result(
            is_final=final, output_token_ids=[new], finish_reasons=[reason], sequence_index=index,
            is_sequence_final=ended, log_probs=[logprobs] if wants else None,
            cum_log_probs=[running.cum_log_probs[index]] if wants else None,
            request_perf_metrics=self._perf_metrics(event) if output.return_perf_metrics else None)))

    def _perf_metrics(self, event: TokenEvent) -> RequestPerfMetrics:
        total, reused = prompt_blocks(event.num_input_tokens, event.cached_tokens, self.tokens_per_block)
        return RequestPerfMetrics(KvCacheMetrics(num_total_allocated_blocks=total, num_new_allocated_blocks=total - reused,
                                                 num_reused_blocks=reused, num_missed_blocks=total - reused,
                                                 kv_cache_hit_rate=reused / total if total else 0.0))

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)
        self._cancelled.discard(int(request_id))
