"""Triton ``llm`` model of both layouts: the tensorrtllm backend's tensor contract over an in-flight-batching engine.

The engine is the CPU engine (cpu_engine; the CPU layout) or TensorRT-LLM's executor in this process
(serving/executor_engine.py; the GPU layout, ``executor_bindings`` set — on CPU over cpu_engine/trtllm_executor.py).
Both report cpu_engine ``TokenEvent``s, so everything here — text, finish reasons, ``stop``, drain, metrics, liveness
probes — is one code path for both.

Decoupled, vllm_backend style: ``execute()`` only validates and enqueues; the engine's own threads run steps, a
sender thread turns token events into responses, and a watch thread asks Triton which requests their clients
cancelled (serving/cancel_watch.py), so none of them waits on another. No BLS: nothing here can wait on
another model (docs/gpu.md says why that matters).
"""

import importlib
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial

import torch
import triton_python_backend_utils as pb_utils

from cpu_engine import (EngineLimits, FinishReason, GenerationRequest, LLMEngine, QueueFullError, SamplingParams,
                        TokenEvent, load_engine, read_config)
from cpu_engine.queues import take_all
from serving.cancel_watch import CancelWatch
from serving.drain import LLM_GRACE_S, DrainGate
from serving.early_stops import TTL_S, EarlyStops
from serving.health import is_probe
from serving.llm_metrics import LLMMetrics
from serving.queue_full import QueueFullFlag, instance_index
from serving.guides import GuideCompiler
from serving.request_params import (CONTROL_INPUTS, check_embedding_bias, check_lengths, check_min_tokens,
                                    resolve_controls, resolve_end_id, resolve_sampling)
from serving.sequence_output import SequenceOutput, TokenLogprob
from serving.stub_python import check_stub
from serving.text import from_word_list, token_bytes_table
from serving.triton_io import (LOGPROB_OUTPUTS, RequestError, error_response, llm_response, model_parameters,
                               scalar, shutting_down_response, single_row)


@dataclass
class _Stream:
    """What the sender thread needs to answer one request: one SequenceOutput per returned sequence."""

    sender: object
    sequences: list[SequenceOutput]
    client_id: str = ""
    outputs: frozenset[str] = frozenset()  # what the request asked for: only those are sent
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    running: int = 1  # sequences not ended yet
    output_tokens: int = 0  # of the sequences that ended
    failed: bool = False  # the engine failed one of its sequences: the request counts as an error
    due: list[float] = field(init=False)  # per sequence: when its next response may go (monotonic)

    def __post_init__(self) -> None:
        self.due = [0.0] * len(self.sequences)  # a first token goes at once


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        self.table = token_bytes_table(params["tokenizer_dir"])
        self.drain_timeout_s = float(params.get("drain_timeout_s", "25"))
        self.stream_interval_s = float(params.get("stream_interval_ms", "0")) / 1e3
        self._streams: dict[str, _Stream] = {}
        self._by_client_id: dict[str, str] = {}  # client request id → ours, for the `stop` input
        self._stopped: set[str] = set()
        self._early_stops = EarlyStops()  # stops that overtook their request (serving/early_stops.py)
        self.cancels = CancelWatch().start()  # clients' cancellations, asked off the engine's thread
        self.metrics = LLMMetrics(args["model_name"], args["model_version"])
        self.trt_metrics = None
        self.gate = DrainGate()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        # While this instance's queue is full, the ensemble's entry refuses new requests (serving/queue_full.py).
        flag = QueueFullFlag()
        if flag.problem:
            pb_utils.Logger.log_warn(flag.problem)
        index = instance_index(args["model_instance_name"])
        self._on_queue_full = partial(flag.publish, index) if flag.shared and index is not None else None
        if self._on_queue_full is not None:  # a stub restarted by Triton must not inherit its predecessor's "full"
            self._on_queue_full(False)
        if params.get("executor_bindings"):
            self.engine, build, self.vocab_size = self._open_executor(args, params)
        else:
            self.engine, build, self.vocab_size = self._open_cpu_engine(params)
        self.max_input_len, self.max_seq_len = build["max_input_len"], build["max_seq_len"]
        self.guides = GuideCompiler(params["tokenizer_dir"], self.vocab_size, RequestError)
        self._sender = threading.Thread(target=self._send_loop, name="llm-responses", daemon=True)
        self._sender.start()

    def _limits(self, build: dict, params: dict) -> EngineLimits:
        return EngineLimits.from_build(
            build, int(params["max_queue_size"]),
            max_tokens_in_paged_kv_cache=int(params.get("max_tokens_in_paged_kv_cache") or 0) or None,
            enable_kv_cache_reuse=params.get("enable_kv_cache_reuse", "true") == "true")

    def _open_cpu_engine(self, params: dict):
        threads = int(params.get("cpu_threads", "0")) or os.cpu_count()
        torch.set_num_threads(threads)  # once, at start-up: changing it later slows small models down
        if params.get("token_source") == "null":  # tokens without model compute: loadtest/cost_per_token.py
            from cpu_engine.token_sources import NullSource

            config = read_config(params["engine_dir"])
            limits = self._limits(config["build_config"], params)
            engine = NullSource(limits, self._events.put, float(params.get("null_step_ms", "0")) / 1e3,
                                self._on_queue_full).start()
            return engine, config["build_config"], config["pretrained_config"]["vocab_size"]
        loaded = load_engine(params["engine_dir"])
        limits = self._limits(loaded.build_config, params)
        engine = LLMEngine(loaded.model, limits, on_event=self._events.put, token_bytes=self.table,
                           dtype=loaded.compute_dtype, on_queue_full=self._on_queue_full).start()
        pb_utils.Logger.log_info(f"CPU engine loaded from {params['engine_dir']} in {loaded.load_seconds:.2f}s "
                                 f"({loaded.compute_dtype}, {threads} threads, {limits}; decode step "
                                 f"{loaded.decode}; C++ kernels {loaded.kernels})")
        return engine, loaded.build_config, loaded.model.args.vocab_size

    def _open_executor(self, args: dict, params: dict):
        """TensorRT-LLM's executor over the engine in ``engine_dir`` (the GPU layout), from ``executor_bindings``:
        ``tensorrt_llm.bindings.executor``, or its CPU stand-in with the options the stand-in's renderer set."""
        from serving.executor_engine import ExecutorEngine
        from serving.trtllm_metrics import TrtLlmMetrics

        bindings = importlib.import_module(params["executor_bindings"])
        if params.get("standin_token_source"):  # only cpu_engine.trtllm_executor has these (builders/trtllm/standin.py)
            bindings.configure(params["standin_token_source"], float(params["standin_null_step_ms"]) / 1e3,
                               int(params.get("standin_cpu_threads", "0")), params["tokenizer_dir"])
        config = read_config(params["engine_dir"])
        build = config["build_config"]
        engine = ExecutorEngine(bindings, params["engine_dir"], params, self._limits(build, params),
                                self._events.put, self.table, self._on_queue_full).start()
        # What the C++ backend exports (nv_trt_llm_*), from the executor's own iteration stats: the chart's GPU
        # queries read these.
        self.trt_metrics = TrtLlmMetrics(args["model_name"], args["model_version"], engine.iteration_stats)
        pb_utils.Logger.log_info(f"TensorRT-LLM executor ({params['executor_bindings']}) over {params['engine_dir']}")
        return engine, build, config["pretrained_config"]["vocab_size"]

    # ---- request intake (Triton's thread) -----------------------------------------------------------
    def execute(self, requests):
        draining = self.gate.closed_for(LLM_GRACE_S)
        submitted = False
        for request in requests:
            sender = request.get_response_sender()
            try:
                if scalar(request, "stop", bool):  # honoured while draining too: it ends work, starts none
                    self._stop(request.request_id(), sender)
                    continue
                if draining and not is_probe(request.request_id()):  # a probe answers while draining too
                    sender.send(shutting_down_response(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                gen, stream = self._parse(request, sender)
            except (RequestError, ValueError) as exc:
                sender.send(error_response(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            self._streams[gen.request_id] = stream
            self.cancels.watch(gen.request_id, sender)
            if stream.client_id:
                self._by_client_id[stream.client_id] = gen.request_id
                if self._early_stops.claim(stream.client_id):  # its stop came first: it ends at its first step
                    self._stopped.add(gen.request_id)
            try:
                self.engine.submit(gen)
                submitted = True
            except QueueFullError as exc:
                self._forget(gen.request_id)
                sender.send(error_response(exc, pb_utils.TritonError.UNAVAILABLE),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except ValueError as exc:  # a request this engine cannot run (more sequences than slots)
                self._forget(gen.request_id)
                sender.send(error_response(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as exc:  # noqa: BLE001 - answered here, after _forget (serving/cancel_watch.py)
                self._forget(gen.request_id)
                sender.send(error_response(exc, pb_utils.TritonError.INTERNAL),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if submitted:  # at once, not at the next period: a drain must never read a stale "idle"
            self._update_gauges(force=True)
        return None

    def _stop(self, client_id: str, sender) -> None:
        """TensorRT-LLM's ``stop`` input: end the running request with the same request id."""
        ours = self._by_client_id.get(client_id) if client_id else None
        if ours is None:
            if client_id:
                self._early_stops.remember(client_id)
            raise RequestError(f"stop: no running request with id {client_id!r} (one that arrives with this id "
                               f"within {TTL_S:.0f} s is ended at once)")
        self._stopped.add(ours)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _forget(self, request_id: str) -> None:
        self.cancels.forget(request_id)  # before any final response (serving/cancel_watch.py)
        stream = self._streams.pop(request_id, None)
        if stream is not None and stream.client_id:
            self._by_client_id.pop(stream.client_id, None)
        self._stopped.discard(request_id)

    def _parse(self, request, sender) -> tuple[GenerationRequest, _Stream]:
        ids = single_row(request, "input_ids")
        if ids is None or ids.size == 0:
            raise RequestError("input_ids is empty: send at least one token")
        ids = ids.reshape(-1)
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise RequestError(f"input_ids must be token ids in [0, {self.vocab_size}), got "
                               f"min {ids.min()} max {ids.max()}")
        length = scalar(request, "input_lengths", int)
        if length is not None:
            if not 1 <= length <= ids.size:
                raise RequestError(f"input_lengths {length} does not match input_ids of length {ids.size}")
            ids = ids[:length]
        max_tokens = scalar(request, "request_output_len", int)
        if max_tokens is None:
            raise RequestError("request_output_len is required")
        probe = is_probe(request.request_id())  # serving/health.py: one token, ahead of every queue
        if probe:
            max_tokens = 1
        prompt = ids.tolist()
        check_lengths(len(prompt), max_tokens, self.max_input_len, self.max_seq_len)
        min_tokens = scalar(request, "min_tokens", int) or 0
        check_min_tokens(min_tokens, max_tokens)
        sampling = resolve_sampling(scalar(request, "temperature", float), scalar(request, "runtime_top_k", int),
                                    scalar(request, "runtime_top_p", float))
        controls = resolve_controls({name: scalar(request, name, cast) for name, cast in CONTROL_INPUTS.items()})
        if controls.top_logprobs and not getattr(self.engine, "supports_top_logprobs", True):
            raise RequestError("top_logprobs is not supported by the TensorRT-LLM layout (its executor returns the "
                               "chosen tokens' log-probs only): use return_log_probs")
        seed = scalar(request, "random_seed", int) or 0
        exclude_input = scalar(request, "exclude_input_in_output", bool)
        request_id = uuid.uuid4().hex  # the client's id may be empty or reused; ours keys the stream
        gen = GenerationRequest(
            request_id=request_id,
            prompt_ids=prompt,
            max_new_tokens=max_tokens,
            sampling=SamplingParams(sampling.temperature, sampling.top_k, sampling.top_p, seed, min_tokens,
                                    controls.repetition_penalty, controls.presence_penalty,
                                    controls.frequency_penalty, controls.min_p),
            end_id=resolve_end_id(scalar(request, "end_id", int), self.vocab_size),
            stop_words=self._word_list(request, "stop_words_list"),
            bad_words=self._word_list(request, "bad_words_list"),
            embedding_bias=self._embedding_bias(request),
            is_cancelled=lambda: request_id in self._stopped or self.cancels.is_cancelled(request_id),
            return_log_probs=controls.return_log_probs,
            top_logprobs=controls.top_logprobs,
            num_return_sequences=controls.num_return_sequences,
            guide=self.guides(controls.guided_decoding_guide_type, controls.guided_decoding_guide),
            probe=probe,
        )
        streaming = bool(scalar(request, "streaming", bool))
        echo = [] if exclude_input in (None, True) else prompt
        sequences = [SequenceOutput(self.table, streaming, max_tokens, len(prompt), list(echo), index)
                     for index in range(controls.num_return_sequences)]
        outputs = frozenset(request.requested_output_names())
        if not controls.return_log_probs:
            outputs -= LOGPROB_OUTPUTS
        stream = _Stream(sender=sender, sequences=sequences, client_id=request.request_id(), outputs=outputs,
                         running=len(sequences))
        return gen, stream

    def _embedding_bias(self, request) -> torch.Tensor | None:
        bias = check_embedding_bias(single_row(request, "embedding_bias"), self.vocab_size)
        return None if bias is None else torch.from_numpy(bias.copy())

    @staticmethod
    def _word_list(request, name) -> list[list[int]]:
        row = single_row(request, name)
        if row is None:
            return []
        if row.ndim != 2 or row.shape[0] != 2:
            raise RequestError(f"{name} must have shape [1, 2, N] (ids and offsets), got [1, {', '.join(map(str, row.shape))}]")
        return from_word_list(row)

    # ---- responses (sender thread) ------------------------------------------------------------------
    def _send_loop(self):
        # Tokens that arrived together leave together, and a stream's next response waits until
        # ``stream_interval_ms`` after its last one (its first token and its end go at once): responses are what the
        # serving path pays for (docs/benchmarks/serving-cost.md), so under load one response carries several tokens.
        pending: dict[tuple[str, int], _Stream] = {}  # sequences with tokens not sent yet
        stop = False
        while not stop:
            due = min((stream.due[index] for (_, index), stream in pending.items()), default=None)
            events = take_all(self._events, None if due is None else max(0.0, due - time.monotonic()))
            for event in events:
                if event is None:
                    stop = True
                    continue
                stream = self._streams.get(event.request_id)
                if stream is None:
                    continue
                self._take(stream, event)
                key = (event.request_id, event.sequence_index)
                if event.finish_reason is None:
                    pending[key] = stream
                else:
                    pending.pop(key, None)
                    self._finish(stream, event)
            now = time.monotonic()
            for key in [key for key, stream in pending.items() if stream.due[key[1]] <= now]:
                stream = pending.pop(key)
                chunk = stream.sequences[key[1]].ready()
                if chunk is not None:
                    self._send(stream, chunk, final=False)
                    stream.due[key[1]] = now + self.stream_interval_s
            self._update_gauges()

    def _update_gauges(self, force: bool = False) -> None:
        engine = self.engine
        self.metrics.update_gauges(engine.queued, engine.active, engine.kv_occupancy, force, engine.kv_size)

    def _take(self, stream: _Stream, event: TokenEvent):
        if event.token_id is None:
            return
        if stream.first_token is None:
            stream.first_token = time.monotonic()
        logprobs = None if event.logprob is None else [TokenLogprob(event.logprob, event.top_logprobs)]
        sequence = stream.sequences[event.sequence_index]
        sequence.num_cached_tokens = event.cached_tokens
        sequence.add([event.token_id], logprobs)

    def _finish(self, stream: _Stream, event: TokenEvent):
        """One sequence ended; the request ends with its last sequence (that response is the final one). A sequence
        the engine failed ends with an INTERNAL error response instead of its output."""
        stream.running -= 1
        stream.output_tokens += event.num_output_tokens
        stream.failed |= event.finish_reason is FinishReason.ERROR
        last = stream.running == 0
        if last:
            self._forget(event.request_id)
            self.metrics.request_finished("error" if stream.failed else event.finish_reason.value, stream.arrival,
                                          stream.first_token, time.monotonic(), event.num_input_tokens,
                                          stream.output_tokens, event.cached_tokens)
            if self.trt_metrics is not None:
                self.trt_metrics.request_finished(event.num_input_tokens, stream.output_tokens)
            # Before the final response: a client that has its answer reads the slot free on /metrics.
            self._update_gauges(force=True)
        if event.finish_reason is FinishReason.ERROR:
            self._send(stream, None, final=last, error=event.error)
        else:
            self._send(stream, stream.sequences[event.sequence_index].finish(event.finish_reason.value), final=last)

    def _send(self, stream: _Stream, chunk, final: bool, error: str | None = None):
        """Send one response (``chunk``'s, or the engine's ``error``); a failed send (the client has gone) must not
        stop the other streams."""
        try:
            if error is None:
                response = llm_response(self.table, chunk, stream.outputs)
            else:
                response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                    f"the engine failed while generating this request: {error}", pb_utils.TritonError.INTERNAL))
            stream.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        except Exception as exc:
            pb_utils.Logger.log_error(f"sending a response failed: {exc}")

    def finalize(self):
        # Drain: requests already accepted finish (up to the timeout) before the process exits.
        self.engine.shutdown(timeout=self.drain_timeout_s)
        self.cancels.close()  # after the drain: a request cancelled while draining still ends early
        if self._on_queue_full is not None:  # unloaded, it holds nothing
            self._on_queue_full(False)
        self._events.put(None)
        self._sender.join(timeout=5)
        if self.trt_metrics is not None:
            self.trt_metrics.close()
        self.metrics.close()
