"""Triton ``llm`` model on GPU: the CPU llm's tensor contract over the ``tensorrt_llm`` C++ backend.

Decoupled. ``execute()`` only validates and hands each request to a worker thread, so requests never wait
for one another here (the in-flight batching happens in ``tensorrt_llm``). Each worker streams its request
through ``tensorrt_llm`` with a decoupled BLS call and answers with ``output_ids``, ``sequence_length``,
``finish_reason``, ``num_input_tokens``, ``num_output_tokens`` (see builders/trtllm/stream_state.py).
Cancellation by the client cancels the BLS stream, which stops the request inside TensorRT-LLM.
"""

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

from builders.trtllm.stream_state import Chunk, StreamState
from serving.drain import LLM_GRACE_S, DrainGate
from serving.stub_python import check_stub
from serving.text import token_bytes_table
from serving.triton_io import (RequestError, error_response, llm_response, model_parameters, scalar,
                               shutting_down_response, single_row)

# Our tensor name → the pinned tensorrt_llm model's (builders/trtllm/layout.py: TRTLLM_INPUT_NAMES).
_FORWARD = {
    "input_ids": "input_ids", "input_lengths": "input_lengths", "request_output_len": "request_output_len",
    "end_id": "end_id", "pad_id": "pad_id", "runtime_top_k": "runtime_top_k", "runtime_top_p": "runtime_top_p",
    "temperature": "temperature", "random_seed": "seed", "min_tokens": "min_tokens", "streaming": "streaming",
}
_WORD_LISTS = ("stop_words_list", "bad_words_list")


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info(check_stub(args["model_name"]))
        params = model_parameters(args)
        self.trt_model = params["tensorrt_llm_model_name"]
        self.table = token_bytes_table(params["tokenizer_dir"])
        self.pool = ThreadPoolExecutor(max_workers=int(params["max_inflight"]), thread_name_prefix="trtllm-stream")
        self.gate = DrainGate()  # the launcher's drain, as the CPU llm has it (serving/drain.py)
        self._running: Counter[str] = Counter()  # client request ids of the streams in flight, for `stop`
        self._running_lock = threading.Lock()  # execute() adds, worker threads remove

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
                inputs, state = self._prepare(request)
                outputs = frozenset(request.requested_output_names())
            except (RequestError, ValueError) as exc:
                sender.send(error_response(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            client_id = request.request_id()
            with self._running_lock:
                self._running[client_id] += 1
            self.pool.submit(self._stream, inputs, state, sender, outputs, client_id)
        return None

    def _stop(self, client_id: str, sender) -> None:
        """TensorRT-LLM's ``stop`` input, as the CPU llm takes it: end the running request with this request id.
        The BLS stream carries the client's id, so ``tensorrt_llm`` finds it (the backend's handleStopRequest);
        it answers with one empty final response. Triton wants the backend's two required inputs even here."""
        if not client_id or not self._running[client_id]:
            raise RequestError(f"stop: no running request with id {client_id!r}")
        one = np.ones((1, 1), dtype=np.int32)
        stop = pb_utils.InferenceRequest(
            model_name=self.trt_model, request_id=client_id, requested_output_names=[],
            inputs=[pb_utils.Tensor("stop", np.array([[True]])), pb_utils.Tensor("input_lengths", one),
                    pb_utils.Tensor("request_output_len", one)])
        for response in stop.exec(decoupled=True):
            if response.has_error():
                raise RequestError(f"stop: {response.error().message()}")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

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
        inputs = []
        for ours, theirs in _FORWARD.items():
            t = pb_utils.get_input_tensor_by_name(request, ours)
            if t is not None:
                inputs.append(pb_utils.Tensor(theirs, t.as_numpy()))
        for name in _WORD_LISTS:
            t = pb_utils.get_input_tensor_by_name(request, name)
            if t is not None and (t.as_numpy()[..., 1, :] >= 0).any():  # skip the empty list ([0] / [-1])
                inputs.append(pb_utils.Tensor(name, t.as_numpy()))
        # The prompt is echoed here (first response), like the CPU llm; TensorRT-LLM returns new tokens only.
        inputs.append(pb_utils.Tensor("exclude_input_in_output", np.array([[True]], dtype=bool)))
        echo = [] if exclude in (None, True) else [int(i) for i in ids.reshape(-1)[:length]]
        return inputs, StreamState(self.table, streaming, max_tokens, length, echo)

    # ---- worker threads: one BLS stream per request ------------------------------------------------------
    def _stream(self, inputs, state: StreamState, sender, outputs: frozenset[str], client_id: str):
        try:
            bls = pb_utils.InferenceRequest(model_name=self.trt_model, inputs=inputs, request_id=client_id,
                                            requested_output_names=["output_ids", "sequence_length"])
            responses = bls.exec(decoupled=True)
            cancelled = False
            for response in responses:
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                if not cancelled and sender.is_cancelled():
                    cancelled = True
                    cancel = getattr(responses, "cancel", None)
                    if cancel is not None:
                        cancel()  # the backend stops the request and ends the stream
                if cancelled or not response.output_tensors():
                    continue
                out = pb_utils.get_output_tensor_by_name(response, "output_ids").as_numpy()
                seq = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
                row = out.reshape(-1, out.shape[-1])[0]  # batch 1, beam 0
                n = min(int(seq.reshape(-1)[0]), row.shape[0])
                chunk = state.push([int(i) for i in row[:n]])
                if chunk is not None:
                    sender.send(self._response(chunk, outputs), flags=0)
            sender.send(self._response(state.finish(cancelled), outputs),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:  # noqa: BLE001 - the client must get an answer whatever failed
            try:
                sender.send(error_response(exc, pb_utils.TritonError.INTERNAL),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as send_exc:  # noqa: BLE001 - client gone
                pb_utils.Logger.log_error(f"llm: sending an error response failed: {send_exc}")
        finally:
            with self._running_lock:
                self._running[client_id] -= 1
                if not self._running[client_id]:
                    del self._running[client_id]

    def _response(self, chunk: Chunk, outputs: frozenset[str]):
        return llm_response(self.table, chunk.ids, chunk.finish_reason, chunk.num_input_tokens,
                            chunk.num_output_tokens, outputs)

    def finalize(self):
        # Drain: streams already handed to workers finish before the stub exits.
        self.pool.shutdown(wait=True, cancel_futures=False)
