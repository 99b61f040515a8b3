"""The GPU ``llm`` wrapper: per-request stream state, and the model itself driven through a stand-in
``triton_python_backend_utils`` whose ``tensorrt_llm`` BLS stream behaves like the C++ backend (new tokens per
response). The real backend cannot run here; this checks our side of the contract."""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from builders import triton_config as tc

from builders.trtllm.stream_state import StreamState

WRAPPER = Path(__file__).parents[1] / "model_repository" / "trtllm" / "llm" / "1" / "model.py"
# Byte table: ids 0..255 are single bytes, 256 is a special token (empty).
TABLE = [bytes([i]) for i in range(256)] + [b""]
EURO = list("€".encode())  # 3 bytes: a character split across three tokens


def test_streaming_holds_back_split_characters():
    s = StreamState(TABLE, streaming=True, max_tokens=10, num_input_tokens=4)
    assert s.push([ord("a"), EURO[0]]).ids == [ord("a")]
    assert s.push([EURO[1]]) is None  # still inside the character
    c = s.push([EURO[2], ord("b")])
    assert c.ids == EURO + [ord("b")]
    assert (c.num_input_tokens, c.num_output_tokens, c.finish_reason, c.final) == (4, 5, "", False)
    end = s.finish()
    assert end.final and end.finish_reason == "stop" and end.ids == [] and end.num_output_tokens == 5


def test_finish_reasons_and_echo():
    s = StreamState(TABLE, streaming=False, max_tokens=3, num_input_tokens=2, echo_ids=[7, 8])
    assert s.push([1, 2]) is None and s.push([3]) is None
    end = s.finish()
    assert end.ids == [7, 8, 1, 2, 3] and end.finish_reason == "length" and end.num_output_tokens == 3
    assert StreamState(TABLE, False, 3, 2).finish(cancelled=True).finish_reason == "cancelled"
    s = StreamState(TABLE, streaming=True, max_tokens=5, num_input_tokens=2, echo_ids=[9])
    assert s.push([EURO[0]]).ids == [9]  # the prompt goes out first, even while a character is open


# ---------------------------------------------------------------------------------- the model, stand-in pb_utils


class _Tensor:
    def __init__(self, name, array):
        self.name, self._a = name, np.asarray(array)

    def as_numpy(self):
        return self._a


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self._t, self._e = list(output_tensors or []), error

    def output_tensors(self):
        return self._t

    def has_error(self):
        return self._e is not None

    def error(self):
        return self._e


class _Error:
    INTERNAL, INVALID_ARG = 13, 3

    def __init__(self, msg, code=None):
        self._m, self.code = msg, code

    def message(self):
        return self._m


class _Sender:
    def __init__(self, cancel_after=None):
        self.sent, self.done, self.cancel_after = [], threading.Event(), cancel_after

    def send(self, response, flags=0):
        self.sent.append((response, flags))
        if flags:
            self.done.set()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after


class _Request:
    def __init__(self, tensors, sender, outputs=None):
        self._t, self._s = {k: _Tensor(k, v) for k, v in tensors.items()}, sender
        self._outputs = outputs

    def get_response_sender(self):
        return self._s

    def requested_output_names(self):  # a client that names no outputs gets them all (Triton normalises)
        return self._outputs or [t.name for t in tc.LLM_OUTPUTS]


class _Stream(list):
    cancelled = False

    def cancel(self):
        self.cancelled = True


def make_pb_utils(script):
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor
    pb.InferenceResponse = _Response
    pb.TritonError = _Error
    pb.TritonModelException = RuntimeError
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    pb.Logger = types.SimpleNamespace(log_error=lambda m: None, log_info=lambda m: None)
    pb.get_input_tensor_by_name = lambda req, name: req._t.get(name)
    pb.get_output_tensor_by_name = lambda resp, name: next((t for t in resp.output_tensors() if t.name == name), None)
    pb.bls_calls = []

    class InferenceRequest:
        def __init__(self, model_name, inputs, requested_output_names):
            self.model_name, self.inputs = model_name, {t.name: t.as_numpy() for t in inputs}
            pb.bls_calls.append(self)

        def exec(self, decoupled=False):
            assert decoupled
            stream = _Stream()
            for ids in script(self.inputs):
                if ids is None:
                    stream.append(_Response())  # the backend's empty final response
                else:
                    stream.append(_Response([_Tensor("output_ids", np.array([[ids]], dtype=np.int32)),
                                             _Tensor("sequence_length", np.array([[len(ids)]], dtype=np.int32))]))
            pb.last_stream = stream
            return stream

    pb.InferenceRequest = InferenceRequest
    return pb


@pytest.fixture
def wrapper(monkeypatch, tmp_path):
    def load(script):
        pb = make_pb_utils(script)
        monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
        for mod in ("serving.triton_io",):
            monkeypatch.delitem(sys.modules, mod, raising=False)
        spec = importlib.util.spec_from_file_location("gpu_llm_model_under_test", WRAPPER)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        monkeypatch.setattr(module, "token_bytes_table", lambda _dir: TABLE)
        model = module.TritonPythonModel()
        model.initialize({"model_name": "llm", "model_config": '{"parameters": {"tensorrt_llm_model_name": {"string_value": '
                                          '"tensorrt_llm"}, "tokenizer_dir": {"string_value": "/t"}, '
                                          '"max_inflight": {"string_value": "4"}}}'})
        return model, pb

    yield load
    monkeypatch.delitem(sys.modules, "serving.triton_io", raising=False)


def _request(sender, ids, max_tokens, streaming, exclude=True, stop=None):
    one = lambda v, t: np.array([[v]], dtype=t)  # noqa: E731
    words = np.array([[[0], [-1]]], dtype=np.int32) if stop is None else np.array([stop], dtype=np.int32)
    return _Request({
        "input_ids": np.array([ids], dtype=np.int32), "input_lengths": one(len(ids), np.int32),
        "request_output_len": one(max_tokens, np.int32), "end_id": one(256, np.int32), "pad_id": one(256, np.int32),
        "stop_words_list": words, "bad_words_list": np.array([[[0], [-1]]], dtype=np.int32),
        "runtime_top_k": one(1, np.int32), "runtime_top_p": one(1.0, np.float32),
        "temperature": one(1.0, np.float32), "random_seed": one(5, np.uint64), "min_tokens": one(0, np.int32),
        "streaming": one(streaming, bool), "exclude_input_in_output": one(exclude, bool)}, sender)


def _outputs(sender):
    rows = []
    for resp, flags in sender.sent:
        t = {x.name: x.as_numpy() for x in resp.output_tensors()}
        rows.append((t["output_ids"].reshape(-1).tolist(), t["finish_reason"].reshape(-1)[0].decode(),
                     int(t["num_input_tokens"].reshape(-1)[0]), int(t["num_output_tokens"].reshape(-1)[0]), flags))
    return rows


def test_wrapper_streams_with_the_cpu_contract(wrapper):
    model, pb = wrapper(lambda inputs: [[ord("h"), EURO[0]], [EURO[1]], [EURO[2]], None])
    sender = _Sender()
    assert model.execute([_request(sender, [1, 2, 3], max_tokens=4, streaming=True)]) is None
    assert sender.done.wait(5)
    model.finalize()
    call = pb.bls_calls[0]
    assert call.model_name == "tensorrt_llm"
    assert "seed" in call.inputs and "random_seed" not in call.inputs  # renamed for the pinned backend
    assert "stop_words_list" not in call.inputs  # the empty word list is not forwarded
    assert bool(call.inputs["exclude_input_in_output"].reshape(-1)[0]) is True
    assert _outputs(sender) == [([ord("h")], "", 3, 2, 0), (EURO, "", 3, 4, 0), ([], "length", 3, 4, 1)]
    # The wrapper answers in text too, each chunk whole UTF-8 (the ensemble ends with it: no postprocessing).
    texts = [r.output_tensors()[2].as_numpy().reshape(-1)[0] for r, _ in sender.sent]
    assert [r.output_tensors()[2].name for r, _ in sender.sent] == ["text_output"] * 3
    assert texts == [b"h", "€".encode(), b""]


def test_wrapper_non_streaming_echo_and_stop(wrapper):
    model, pb = wrapper(lambda inputs: [[10, 11]])
    sender = _Sender()
    model.execute([_request(sender, [5, 6], max_tokens=8, streaming=False, exclude=False, stop=[[3], [1]])])
    assert sender.done.wait(5)
    model.finalize()
    assert "stop_words_list" in pb.bls_calls[0].inputs
    assert _outputs(sender) == [([5, 6, 10, 11], "stop", 2, 2, 1)]


def test_wrapper_cancellation_and_errors(wrapper):
    model, pb = wrapper(lambda inputs: [[1], [2], [3], [4]])
    sender = _Sender(cancel_after=1)
    model.execute([_request(sender, [5], max_tokens=8, streaming=True)])
    assert sender.done.wait(5)
    model.finalize()
    assert pb.last_stream.cancelled
    assert _outputs(sender)[-1][1] == "cancelled"

    model, pb = wrapper(lambda inputs: [[1]])
    bad = _Sender()
    model.execute([_request(bad, [], max_tokens=8, streaming=False)])
    resp, flags = bad.sent[0]
    assert flags == 1 and resp.has_error() and "input_ids is empty" in resp.error().message()
    model.finalize()


def test_wrapper_sends_only_the_requested_outputs(wrapper):
    """The ensemble asks the llm for text, finish reason and counts, not ids: a response carrying outputs nobody
    asked for made Triton 2.51 corrupt its heap under load (docs/reliability.md B9), so none are sent."""
    model, _ = wrapper(lambda inputs: [[ord("o"), ord("k")], None])
    sender = _Sender()
    request = _request(sender, [1, 2], max_tokens=2, streaming=True)
    request._outputs = ["text_output", "finish_reason"]
    model.execute([request])
    assert sender.done.wait(5)
    model.finalize()
    assert [[t.name for t in r.output_tensors()] for r, _ in sender.sent] == [["text_output", "finish_reason"]] * 2
    assert b"".join(r.output_tensors()[0].as_numpy().reshape(-1)[0] for r, _ in sender.sent) == b"ok"
