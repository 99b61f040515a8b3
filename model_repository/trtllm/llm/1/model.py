"""Triton ``llm`` model on GPU: the CPU llm's tensor contract over the ``tensorrt_llm`` C++ backend.

Decoupled. ``execute()`` only validates and hands each request to a worker thread, so requests never wait
for one another here (the in-flight batching happens in ``tensorrt_llm``). Each worker streams its request
through ``tensorrt_llm`` with a decoupled BLS call and answers with ``output_ids``, ``sequence_length``,
``finish_reason``, ``num_input_tokens``, ``num_output_tokens``, log-probs and ``sequence_index``
(serving/sequence_output.py). ``min_p`` and ``top_logprobs`` are refused: tensorrt_llm has no such input or output.
Guides are compiled here once (cached) only to refuse, by name, what the backend would not enforce.
Cancellation: one thread polls every stream's ``is_cancelled()`` (as the C++ backend's ``WaitForCancel`` does) and
ends a cancelled one with the backend's own ``stop`` request under that stream's request id. That works on every
Triton: the response iterator's ``cancel()`` exists only in newer Python backends (not in 2.51, which runs the CPU
tests), and the per-token path makes no ``is_cancelled()`` round trip.

Finished BLS response iterators are kept for ``RETIRE_S`` before Python lets go of them (``_retire``): in Triton
2.51's stub an iterator keeps every response it gave, and when the stub's own cleanup thread drops the last
reference it frees them without the GIL — heap corruption that aborted this stub under cancellation (core dump:
``~ResponseIterator`` in ``Stub::ServiceStubToParentRequests``). Held here, the last reference is Python's.

Known, not fixed here: with streams in several threads the Python backend's own lock order (GIL →
``response_iterator_map_mu_`` → an iterator's ``mu_`` → GIL) can deadlock this stub (docs/gpu.md, "Open").
"""

import queue
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import triton_python_backend_utils as pb_utils

from serving.drain import LLM_GRACE_S, DrainGate
from serving.early_stops import TTL_S, EarlyStops
from serving.guides import GuideCompiler
from serving.request_params import CONTROL_INPUTS, resolve_controls
from serving.sequence_output import Chunk, SequenceOutput, TokenLogprob
from serving.stub_python import check_stub
from serving.text import token_bytes_table
from serving.triton_io import (RequestError, error_response, llm_response, model_parameters, scalar,
                               shutting_down_response, single_row)

# Our tensor name → the pinned tensorrt_llm model's (builders/trtllm/layout.py: TRTLLM_INPUT_NAMES).
_FORWARD = {
    "input_ids": "input_ids", "input_lengths": "input_lengths", "request_output_len": "request_output_len",
    "end_id": "end_id", "pad_id": "pad_id", "runtime_top_k": "runtime_top_k", "runtime_top_p": "runtime_top_p",
    "temperature": "temperature", "random_seed": "seed", "min_tokens": "min_tokens", "streaming": "streaming",
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "return_log_probs": "return_log_probs",
    "num_return_sequences": "num_return_sequences",
}
_GUIDE = ("guided_decoding_guide_type", "guided_decoding_guide")  # forwarded only when a guide is asked for
_WORD_LISTS = ("stop_words_list", "bad_words_list")
CANCEL_POLL_S = 0.02  # as the CPU engine: how stale a client's cancellation may be
# How long a finished BLS iterator is held: the stub's cleanup of it is one queued IPC message (microseconds to
# milliseconds); seconds leave it done long before Python releases the iterator (module docstring).
RETIRE_S = 10.0
RESTOP_S = 0.5  # a stopped stream still running after this gets its stop again (_watch_cancellation)


@dataclass
class _Inflight:
    """A stream handed to a worker: who asked (``stop`` finds it by the client's id) and whether it was ended."""

    sender: object
    client_id: str
    cancelled: bool = False
    started: bool = False  # its BLS request was sent (a worker took it); before that, ending it needs no stop
    stopped_at: float = 0.0  # when its last stop was sent: a stop that overtook its request is sent again


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        self.trt_model = params["tensorrt_llm_model_name"]
        self.guided_decoding = bool(params.get("guided_decoding_backend"))  # as the tensorrt_llm config has it
        self.table = token_bytes_table(params["tokenizer_dir"])
        # Guides are checked here, before tensorrt_llm compiles them: the backend would drop a JSON-schema keyword
        # that xgrammar does not enforce, where the CPU llm refuses it by name.
        self.guides = GuideCompiler(params["tokenizer_dir"], len(self.table), RequestError)
        self.pool = ThreadPoolExecutor(max_workers=int(params["max_inflight"]), thread_name_prefix="trtllm-stream")
        self.gate = DrainGate()  # the launcher's drain, as the CPU llm has it (serving/drain.py)
        self._inflight: dict[str, _Inflight] = {}  # our BLS request id → the stream; execute() adds, workers remove
        # A stream leaves _inflight under this lock *before* its final response: is_cancelled() on a sender whose
        # final response has gone crashes Triton 2.51 (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled).
        self._inflight_lock = threading.Lock()
        self._closing = threading.Event()
        self._to_end: queue.SimpleQueue[str] = queue.SimpleQueue()  # streams a client's `stop` named
        self._early_stops = EarlyStops()  # stops that overtook their request (serving/early_stops.py)
        self._retired: deque[tuple[float, object]] = deque()  # (release time, finished BLS iterator)
        self._canceller = threading.Thread(target=self._watch_cancellation, name="llm-cancel", daemon=True)
        self._canceller.start()

    # ---- request side (model thread): validate, build the BLS inputs, hand over -----------------------
    def execute(self, requests):
        draining = self.gate.closed_for(LLM_GRACE_S)
        for request in requests:
            sender = request.get_response_sender()
            try:
                if scalar(request, "stop", bool):  # honoured while draining too: it ends work, starts none
                    self._stop(request.request_id(), sender)
                    continue
                if draining:
                    sender.send(shutting_down_response(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    continue
                inputs, wanted, sequences = self._prepare(request)
                outputs = frozenset(request.requested_output_names())
            except (RequestError, ValueError) as exc:
                sender.send(error_response(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            bls_id = uuid.uuid4().hex  # the client's id may be empty or shared; ours names exactly this stream
            with self._inflight_lock:
                self._inflight[bls_id] = _Inflight(sender, request.request_id())
            if request.request_id() and self._early_stops.claim(request.request_id()):  # its stop came first
                self._to_end.put(bls_id)
            self.pool.submit(self._stream, inputs, wanted, sequences, sender, outputs, bls_id)
        return None

    def _stop(self, client_id: str, sender) -> None:
        """TensorRT-LLM's ``stop`` input, as the CPU llm takes it: end the running request with this request id."""
        with self._inflight_lock:
            ours = [bls_id for bls_id, f in self._inflight.items() if client_id and f.client_id == client_id]
        if not ours:
            if client_id:
                self._early_stops.remember(client_id)
            raise RequestError(f"stop: no running request with id {client_id!r} (one that arrives with this id "
                               f"within {TTL_S:.0f} s is ended at once)")
        for bls_id in ours:
            self._to_end.put(bls_id)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _end(self, bls_id: str) -> None:
        """Stop one BLS stream with the backend's ``stop`` request (handleStopRequest: it cancels the requests with
        this request id and answers with one empty final response). Triton wants the backend's two required
        inputs even on a stop request."""
        with self._inflight_lock:
            stream = self._inflight.get(bls_id)
            if stream is None:
                return
            stream.cancelled = True
            if not stream.started:  # still waiting for a worker: it sends its request, then asks for this stop
                return
            stream.stopped_at = time.monotonic()
        one = np.ones((1, 1), dtype=np.int32)
        stop = pb_utils.InferenceRequest(
            model_name=self.trt_model, request_id=bls_id, requested_output_names=[],
            inputs=[pb_utils.Tensor("stop", np.array([[True]])), pb_utils.Tensor("input_lengths", one),
                    pb_utils.Tensor("request_output_len", one)])
        responses = stop.exec(decoupled=True)
        try:
            for response in responses:
                if response.has_error():
                    pb_utils.Logger.log_error(f"llm: stopping {bls_id} failed: {response.error().message()}")
        finally:
            self._retire(responses)

    def _retire(self, responses) -> None:
        """Hold a finished BLS response iterator for RETIRE_S (module docstring: Triton 2.51 frees it without the
        GIL when its cleanup thread holds the last reference)."""
        self._retired.append((time.monotonic() + RETIRE_S, responses))

    def _watch_cancellation(self) -> None:
        """The one thread that sends stop requests (clients' ``stop`` and cancellations alike)."""
        while not self._closing.is_set():
            try:
                gone = [self._to_end.get(timeout=CANCEL_POLL_S)]
            except queue.Empty:
                gone = []
            now = time.monotonic()
            with self._inflight_lock:
                gone += [bls_id for bls_id, stream in self._inflight.items()
                         if not stream.cancelled and stream.sender.is_cancelled()]
                # A stop sent between a worker marking its stream started and the request reaching tensorrt_llm
                # finds nothing to stop (the backend ignores it): a stream still running a while later gets another.
                gone += [bls_id for bls_id, stream in self._inflight.items()
                         if stream.stopped_at and now - stream.stopped_at > RESTOP_S]
            for bls_id in dict.fromkeys(gone):
                try:
                    self._end(bls_id)
                except Exception as exc:  # noqa: BLE001 - one failed stop must not stop the watch
                    pb_utils.Logger.log_error(f"llm: cancelling {bls_id} failed: {exc}")
            now = time.monotonic()
            while self._retired and self._retired[0][0] <= now:
                self._retired.popleft()

    def _prepare(self, request):
        ids = single_row(request, "input_ids")
        if ids is None or ids.size == 0:
            raise RequestError("input_ids is empty: send at least one token")
        if ids.min() < 0 or ids.max() >= len(self.table):  # the CPU llm's check; TensorRT-LLM may not check at all
            raise RequestError(f"input_ids must be token ids in [0, {len(self.table)}), got "
                               f"min {ids.min()} max {ids.max()}")
        max_tokens = scalar(request, "request_output_len", int)
        if max_tokens is None or max_tokens < 1:
            raise RequestError("request_output_len must be ≥ 1")
        length = scalar(request, "input_lengths", int) or int(ids.size)
        exclude = scalar(request, "exclude_input_in_output", bool)
        streaming = bool(scalar(request, "streaming", bool))
        controls = resolve_controls({name: scalar(request, name, cast) for name, cast in CONTROL_INPUTS.items()})
        if controls.min_p:
            raise RequestError("min_p is not supported by the TensorRT-LLM layout (tensorrt_llm has no min_p input)")
        if controls.top_logprobs:
            raise RequestError("top_logprobs is not supported by the TensorRT-LLM layout (tensorrt_llm returns the "
                               "chosen tokens' log-probs only): use return_log_probs")
        if controls.guided_decoding_guide_type and not self.guided_decoding:
            raise RequestError("guided decoding is off in this deployment's tensorrt_llm model (its "
                               "guided_decoding_backend parameter is empty: no xgrammar tokenizer info beside the engine)")
        self.guides(controls.guided_decoding_guide_type, controls.guided_decoding_guide)
        inputs = []
        for ours, theirs in _FORWARD.items():
            t = pb_utils.get_input_tensor_by_name(request, ours)
            if t is not None:
                inputs.append(pb_utils.Tensor(theirs, t.as_numpy()))
        for name in _GUIDE if controls.guided_decoding_guide_type else ():
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None:
                inputs.append(pb_utils.Tensor(name, t.as_numpy()))
        for name in _WORD_LISTS:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None and (t.as_numpy()[..., 1, :] >= 0).any():  # skip the empty list ([0] / [-1])
                inputs.append(pb_utils.Tensor(name, t.as_numpy()))
        # The prompt is echoed here (first response), like the CPU llm; TensorRT-LLM returns new tokens only.
        inputs.append(pb_utils.Tensor("exclude_input_in_output", np.array([[True]], dtype=bool)))
        echo = [] if exclude in (None, True) else [int(i) for i in ids.reshape(-1)[:length]]
        sequences = [SequenceOutput(self.table, streaming, max_tokens, length, list(echo), index)
                     for index in range(controls.num_return_sequences)]
        # What tensorrt_llm is asked to return: the log-probs only when wanted (it may fill them with zeros otherwise).
        wanted = ["output_ids", "sequence_length", "sequence_index"]
        return inputs, wanted + ["output_log_probs"] * controls.return_log_probs, sequences

    # ---- worker threads: one BLS stream per request ------------------------------------------------------
    def _stream(self, inputs, wanted: list[str], sequences: list[SequenceOutput], sender, outputs: frozenset[str],
                bls_id: str):
        stream = self._inflight[bls_id]
        responses = None
        try:
            with self._inflight_lock:
                stream.started = True
                cancelled_while_waiting = stream.cancelled
            bls = pb_utils.InferenceRequest(model_name=self.trt_model, inputs=inputs, request_id=bls_id,
                                            requested_output_names=wanted)
            responses = bls.exec(decoupled=True)
            if cancelled_while_waiting:  # ended through tensorrt_llm like any other, so its metrics count it
                self._to_end.put(bls_id)
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if stream.cancelled or not response.output_tensors():
                    continue
                sequence = sequences[self._index(response)]
                out = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy()
                seq = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
                row = out.reshape(-1)[: out.shape[-1]]  # batch 1, beam 0; [1, 1, 0] when end_id ends it
                n = min(int(seq.reshape(-1)[0]), row.shape[0])
                chunk = sequence.push([int(i) for i in row[:n]], self._logprobs(response, n))
                if chunk is not None:
                    sender.send(self._response(chunk, outputs), flags=0)
            # tensorrt_llm ends the request once, after its last sequence: every sequence ends here.
            finals = [self._response(s.finish(s.reason_without_engine(stream.cancelled)), outputs) for s in sequences]
        except Exception as exc:  # noqa: BLE001 - the client must get an answer whatever failed
            finals = [error_response(exc, pb_utils.TritonError.INTERNAL)]
        finally:
            if responses is not None:
                self._retire(responses)
        with self._inflight_lock:
            del self._inflight[bls_id]
        try:
            for response in finals[:-1]:
                sender.send(response, flags=0)
            sender.send(finals[-1], flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # noqa: BLE001 - client gone
            pb_utils.Logger.log_error(f"llm: sending the final response failed: {exc}")

    @staticmethod
    def _index(response) -> int:
        t = pb_utils.get_output_tensor_by_name(response, "sequence_index")
        return 0 if t is None else int(t.as_numpy().reshape(-1)[0])

    @staticmethod
    def _logprobs(response, n: int) -> list[TokenLogprob] | None:
        """The new tokens' log-probs ([1, beam, n]), when the request asked for them (return_log_probs)."""
        t = pb_utils.get_output_tensor_by_name(response, "output_log_probs")
        if t is None:
            return None
        return [TokenLogprob(float(v)) for v in t.as_numpy().reshape(-1)[-n:]] if n else []

    def _response(self, chunk: Chunk, outputs: frozenset[str]):
        return llm_response(self.table, chunk, outputs)

    def finalize(self):
        # Drain: streams already handed to workers finish before the stub exits.
        self.pool.shutdown(wait=True, cancel_futures=False)
        self._closing.set()
        self._canceller.join(timeout=1)
