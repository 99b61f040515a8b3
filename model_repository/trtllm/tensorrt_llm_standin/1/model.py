"""A CPU stand-in for the C++ ``tensorrtllm`` backend: the GPU layout's ``tensorrt_llm`` model, run by Triton's
Python backend (``make serve LAYOUT=trtllm-standin``; builders/trtllm/standin.py renders it).

Its config.pbtxt is the one the GPU layout renders for the real backend (builders/trtllm/layout.py
``tensorrt_llm_config``) with only ``backend`` swapped and ``standin_*`` parameters added, so the ``llm``
wrapper meets the same inputs, outputs and parameters here as on a GPU. Tokens come from the CPU engine or the
``null`` source (cpu_engine/token_sources.py).

What it reproduces of the C++ backend, and where that was read (tensorrtllm_backend r25.02,
``inflight_batcher_llm/src/model_instance_state.cc`` and ``utils.cc``; the r26.07 backend lives in TensorRT-LLM's
``triton_backend/``, same functions — read, not observed on a GPU):

- one response per executor result: streaming, the new tokens of that step only; otherwise one response with the
  whole output; the last response carries COMPLETE_FINAL (``WaitForResponse``);
- ``output_ids`` [1, beam, len] and ``sequence_length`` [1, beam] = the tokens in *this* response
  (``fillTritonResponse``: ``beamLength[i] = outputIds[i].size()``); beam width is 1 here;
- ``exclude_input_in_output`` from the request, else the model parameter (``createRequestsFromInputTensors``);
- ``end_id`` ends generation and is not part of the output; ``stop_words_list`` / ``bad_words_list`` are
  [1, 2, N] (flat ids, end offsets, -1 padded; ``convertWordList``);
- ``stop`` = true: cancel the running requests with this Triton request id and answer with one empty final
  response, also when none is running (``handleStopRequest``);
- cancellation by the client is polled (``WaitForCancel``, every ``cancellation_check_period_ms``); the
  cancelled request then gets its final response;
- guided decoding only when ``guided_decoding_backend`` is ``xgrammar`` and ``xgrammar_tokenizer_info_path`` is set
  (``getGuidedDecodingConfigFromParams``), compiled with xgrammar as the executor does (cpu_engine/grammar.py);
- a bad request gets one final response with an INTERNAL error (``enqueue``: every exception →
  ``TRITONSERVER_ERROR_INTERNAL``), with the backend's message where the source has one;
- a request the executor fails while generating gets an INTERNAL error response, "Executor failed process
  requestId N due to the following error: ..." (``fillTritonResponse`` on a response with ``hasError()``); here
  each sequence the CPU engine ends with ERROR gets one (the request's last one with COMPLETE_FINAL), where the
  executor's error ends the request at once — the same for a request of one sequence.
"""

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import triton_python_backend_utils as pb_utils

from cpu_engine.token_sources import open_source
from cpu_engine import FinishReason, GenerationRequest, QueueFullError, SamplingParams, TokenEvent
from cpu_engine.engine_dir import read_config
from serving.guides import GuideCompiler
from serving.llm_metrics import LLMMetrics
from serving.request_params import resolve_end_id, resolve_sampling
from serving.stub_python import check_stub
from serving.text import from_word_list, token_bytes_table
from serving.trtllm_metrics import TrtLlmMetrics
from serving.triton_io import model_parameters

_FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class BackendError(RuntimeError):
    """What the C++ backend answers with TRITONSERVER_ERROR_INTERNAL."""


def _value(request, name: str):
    """An optional per-request scalar (shape [1] after the config's reshape, [1, 1] without it), or None."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return None
    value = t.as_numpy().reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value  # a STRING element is bytes already


def _text(value) -> str:
    """A STRING input's element (bytes), or "" when absent."""
    return "" if value is None else value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _ids(request, name: str) -> np.ndarray | None:
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


@dataclass
class _Stream:
    sender: object
    streaming: bool
    triton_id: str
    echo: list[list[int]]  # per sequence: the prompt, when exclude_input_in_output is false
    outputs: frozenset[str]  # the outputs the request asked for
    output: list[list[int]]  # per sequence, non-streaming: everything so far
    log_probs: list[list[float]]  # per sequence, non-streaming: the log-probs so far (return_log_probs)
    cum_log_probs: list[float]
    running: int  # sequences not ended yet
    arrival: float = field(default_factory=time.monotonic)
    first_token: float | None = None
    output_tokens: int = 0  # of the sequences that ended
    failed: bool = False  # the engine failed one of its sequences: the request counts as an error


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        config = json.loads(args["model_config"])
        self.default_exclude_input = params["exclude_input_in_output"] == "true"
        queue_size = int(config["dynamic_batching"]["default_queue_policy"]["max_queue_size"])
        table = token_bytes_table(params["tokenizer_dir"])
        self.vocab_size = len(table)
        self._streams: dict[str, _Stream] = {}
        self._by_triton_id: dict[str, set[str]] = {}
        self._stopped: set[str] = set()
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        # The CPU engine's metrics (active slots, queue, finished requests), where the real backend has
        # nv_trt_llm_request_metrics: the launcher's drain (serving/drain.py) waits on the gauges.
        self.metrics = LLMMetrics(args["model_name"], args["model_version"])
        self.source = open_source(params["standin_token_source"], params["gpt_model_path"], queue_size,
                                  self._events.put, table, int(params.get("standin_cpu_threads", "0")),
                                  float(params["standin_null_step_ms"]) / 1e3)
        # What the real backend exports (nv_trt_llm_*): the chart's GPU queries read these.
        self.trt_metrics = TrtLlmMetrics(args["model_name"], args["model_version"], self.source.limits.max_batch_size,
                                         self.source.limits.max_seq_len, self._trt_stats)
        # As the backend: guided decoding only with both parameters (getGuidedDecodingConfigFromParams). The guide
        # is compiled from the tokenizer directory; the backend reads the same tokenizer from the info file.
        self.guided_decoding = params["guided_decoding_backend"] == "xgrammar" and bool(
            params["xgrammar_tokenizer_info_path"])
        self.guides = GuideCompiler(params["tokenizer_dir"], read_config(params["gpt_model_path"])
                                    ["pretrained_config"]["vocab_size"], BackendError)
        self.max_input_len = int(params["standin_max_input_len"])
        self.max_seq_len = int(params["standin_max_seq_len"])
        self._sender = threading.Thread(target=self._send_loop, name="tensorrt_llm-responses", daemon=True)
        self._sender.start()
        pb_utils.Logger.log_info(f"tensorrt_llm stand-in: {params['standin_token_source']} tokens, "
                                 f"engine {params['gpt_model_path']}")

    # ---- requests (Triton's thread) ---------------------------------------------------------------------
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                if _value(request, "stop"):
                    self._stop(request.request_id(), sender)
                    continue
                gen, stream = self._parse(request, sender)
                self._streams[gen.request_id] = stream
                self._by_triton_id.setdefault(stream.triton_id, set()).add(gen.request_id)
                try:
                    self.source.submit(gen)
                except (QueueFullError, ValueError) as exc:  # full, or more sequences than the engine has slots
                    self._forget(gen.request_id)
                    raise BackendError(str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - as the backend's enqueue: every exception is INTERNAL
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INTERNAL)),
                    flags=_FINAL)
        self.metrics.update_gauges(self.source.queued, self.source.active, self.source.kv_occupancy, force=True)
        return None

    def _stop(self, triton_id: str, sender) -> None:
        if not triton_id:
            raise BackendError("Trying to stop a request but request ID is not provided")
        self._stopped.update(self._by_triton_id.get(triton_id, ()))
        sender.send(flags=_FINAL)  # "an empty response to indicate the request has been successfully cancelled"

    def _parse(self, request, sender) -> tuple[GenerationRequest, _Stream]:
        ids = _ids(request, "input_ids")
        if ids is None:
            raise BackendError("input_ids or encoder_input_features is not present in the request.")
        max_new = _value(request, "request_output_len")
        if max_new is None:
            raise BackendError("request_output_len is not present in the request")
        prompt = [int(i) for i in ids.reshape(-1)]  # the whole tensor, as extractVector reads it
        # The executor's own checks (TensorRT-LLM executor, LlmRequest::validate): read, wording not verified.
        if not prompt:
            raise BackendError("Executor failed to process the request: the prompt is empty")
        if len(prompt) > self.max_input_len:
            raise BackendError(f"Prompt length ({len(prompt)}) exceeds maximum input length ({self.max_input_len}).")
        if not all(0 <= i < self.vocab_size for i in prompt):
            raise BackendError(f"input_ids hold a token id outside [0, {self.vocab_size})")
        # The executor shortens max_new_tokens to fit max_seq_len (a warning, not an error).
        max_new = min(int(max_new), self.max_seq_len - len(prompt))
        if max_new < 1:
            raise BackendError(f"request_output_len must be > 0 within max_seq_len ({self.max_seq_len})")
        sampling = resolve_sampling(_value(request, "temperature"), _value(request, "runtime_top_k"),
                                    _value(request, "runtime_top_p"))
        exclude = _value(request, "exclude_input_in_output")
        exclude = self.default_exclude_input if exclude is None else bool(exclude)
        guide_type = _text(_value(request, "guided_decoding_guide_type"))
        if guide_type and not self.guided_decoding:
            # The executor refuses a guided request when the model has no guided decoding config (read in
            # TensorRT-LLM's executor sources; wording not verified).
            raise BackendError("Guided decoding is not enabled: the model has no guided decoding config")
        n = int(_value(request, "num_return_sequences") or 1)
        request_id = uuid.uuid4().hex
        gen = GenerationRequest(
            request_id=request_id, prompt_ids=prompt, max_new_tokens=max_new,
            sampling=SamplingParams(
                sampling.temperature, sampling.top_k, sampling.top_p, int(_value(request, "seed") or 0),
                int(_value(request, "min_tokens") or 0),
                repetition_penalty=float(_value(request, "repetition_penalty") or 1.0),
                presence_penalty=float(_value(request, "presence_penalty") or 0.0),
                frequency_penalty=float(_value(request, "frequency_penalty") or 0.0)),
            end_id=self._end_id(_value(request, "end_id")),
            stop_words=self._words(request, "stop_words_list"), bad_words=self._words(request, "bad_words_list"),
            is_cancelled=lambda: request_id in self._stopped or sender.is_cancelled(),
            return_log_probs=bool(_value(request, "return_log_probs")), num_return_sequences=n,
            guide=self.guides(guide_type, _text(_value(request, "guided_decoding_guide"))))
        stream = _Stream(sender, bool(_value(request, "streaming")), request.request_id(),
                         [[] if exclude else list(prompt) for _ in range(n)],
                         frozenset(request.requested_output_names()), [[] for _ in range(n)],
                         [[] for _ in range(n)], [0.0] * n, running=n)
        return gen, stream

    def _end_id(self, end_id: int | None) -> int | None:
        try:
            return resolve_end_id(end_id, self.vocab_size)
        except ValueError as exc:  # the executor checks it against the vocabulary (wording ours)
            raise BackendError(str(exc)) from None

    @staticmethod
    def _words(request, name: str) -> list[list[int]]:
        value = _ids(request, name)
        if value is None:
            return []
        try:
            return from_word_list(value.reshape(2, -1))
        except ValueError as exc:
            raise BackendError(f"{name}: {exc}") from None

    def _forget(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            ours = self._by_triton_id.get(stream.triton_id)
            if ours is not None:
                ours.discard(request_id)
                if not ours:
                    del self._by_triton_id[stream.triton_id]
        self._stopped.discard(request_id)

    # ---- responses (one thread: each request's responses leave in order) --------------------------------
    def _send_loop(self):
        while (event := self._events.get()) is not None:
            stream = self._streams.get(event.request_id)
            if stream is not None:
                self._answer(stream, event)

    def _answer(self, stream: _Stream, event: TokenEvent) -> None:
        """One engine event → this sequence's response: streaming, the new token; otherwise, at the sequence's
        end, its whole output. The request's last response (its last sequence's) carries COMPLETE_FINAL."""
        index, ended = event.sequence_index, event.finish_reason is not None
        new = [] if event.token_id is None else [event.token_id]
        logprobs = [] if event.logprob is None else [event.logprob]
        if new and stream.first_token is None:
            stream.first_token = time.monotonic()
        stream.cum_log_probs[index] += sum(logprobs)
        if not stream.streaming:
            stream.output[index] += new
            stream.log_probs[index] += logprobs
            if not ended:
                return
            new, logprobs = stream.output[index], stream.log_probs[index]
        final = False
        if ended:
            stream.running -= 1
            stream.output_tokens += event.num_output_tokens
            stream.failed |= event.finish_reason is FinishReason.ERROR
            final = stream.running == 0
        if final:
            self._forget(event.request_id)
            self.metrics.request_finished("error" if stream.failed else event.finish_reason.value, stream.arrival,
                                          stream.first_token, time.monotonic(), event.num_input_tokens,
                                          stream.output_tokens)
            self.metrics.update_gauges(self.source.queued, self.source.active, self.source.kv_occupancy, force=True)
            self.trt_metrics.request_finished(event.num_input_tokens, stream.output_tokens)
        if event.finish_reason is FinishReason.ERROR:
            response = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(
                f"Executor failed process requestId {event.request_id} due to the following error: {event.error}",
                pb_utils.TritonError.INTERNAL))
        else:
            response = self._output(stream, index, new, logprobs)
        try:
            stream.sender.send(response, flags=_FINAL if final else 0)
        except Exception as exc:  # noqa: BLE001 - a client that has gone must not stop the other streams
            pb_utils.Logger.log_error(f"tensorrt_llm stand-in: sending a response failed: {exc}")

    @staticmethod
    def _output(stream: _Stream, index: int, new: list[int], logprobs: list[float]):
        # The prompt leads the sequence's first response when it is not excluded (executor OutputConfig
        # excludeInputFromOutput; for streaming this is our reading of the executor, not observed).
        ids, stream.echo[index] = stream.echo[index] + new, []
        values = {  # fillTritonResponse: [1, beam, len] ids and log-probs, [1, beam] lengths and cum log-probs
            "output_ids": np.array(ids, dtype=np.int32).reshape(1, 1, -1),
            "sequence_length": np.array([[len(ids)]], dtype=np.int32),
            "output_log_probs": np.array(logprobs, dtype=np.float32).reshape(1, 1, -1),
            "cum_log_probs": np.array([[stream.cum_log_probs[index]]], dtype=np.float32),
            "sequence_index": np.array([[index]], dtype=np.int32),
        }
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, value) for name, value in values.items()
                                                          if name in stream.outputs])

    def _trt_stats(self) -> tuple[int, int, float]:
        """(requests in a slot, those of them with no token yet, KV occupancy), read by trt_metrics' own thread."""
        no_token_yet = sum(s.first_token is None for s in list(self._streams.values()))
        return self.source.active, max(no_token_yet - self.source.queued, 0), self.source.kv_occupancy

    def finalize(self):
        self.source.shutdown(timeout=25)
        self._events.put(None)
        self._sender.join(timeout=5)
        self.trt_metrics.close()
        self.metrics.close()
