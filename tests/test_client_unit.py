"""Client SDK unit tests: no server. Request tensors, response parsing, timings, cancellation, CLI."""

from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor

from client import (AsyncLLMClient, Completion, GenerationError, Guide, LLMClient, SamplingParams,
                    ServerUnavailableError, Timings)
from client import aio
from client.__main__ import build_parser, completion_json, main, sampling_params, summary
from client.core import ResponseCollector, build_chat_inputs, build_inputs, is_final, to_error


# ------------------------------------------------------------------------------------------------ helpers


def tensors(inputs) -> dict[str, tuple[str, list[int], np.ndarray]]:
    """name → (datatype, shape, decoded values) of built InferInputs."""
    out = {}
    for tensor in inputs:
        datatype, shape, raw = tensor.datatype(), tensor.shape(), tensor._get_content()
        if datatype == "BYTES":
            values = deserialize_bytes_tensor(raw)
        else:
            values = np.frombuffer(raw, dtype={"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64,
                                               "BOOL": np.bool_}[datatype])
        out[tensor.name()] = (datatype, shape, values.reshape(shape))
    return out


def response(text: bytes | None = b"", final: bool = False, reason: bytes = b"", n_in: int = 3,
             n_out: int = 1) -> grpcclient.InferResult:
    """An ensemble response as Triton sends it over the stream (``text=None``: an empty final response)."""
    message = service_pb2.ModelInferResponse(model_name="ensemble")
    if text is not None:
        for name, value in (("text_output", text), ("finish_reason", reason)):
            message.outputs.add(name=name, datatype="BYTES", shape=[1, 1])
            message.raw_output_contents.append(serialize_byte_tensor(np.array([[value]], dtype=object)).item())
        for name, value in (("num_input_tokens", n_in), ("num_output_tokens", n_out)):
            message.outputs.add(name=name, datatype="INT32", shape=[1, 1])
            message.raw_output_contents.append(np.array([[value]], dtype=np.int32).tobytes())
    message.parameters["triton_final_response"].bool_param = final
    return grpcclient.InferResult(message)


def token_response(tokens: list[tuple[bytes, float, list[tuple[bytes, float]]]], index: int, reason: bytes = b"",
                   final: bool = False, cum: float | None = None, n_out: int = 1) -> grpcclient.InferResult:
    """A response of a request that asked for log-probs: ``tokens`` = (bytes, logprob, alternatives) per token, the
    text is their bytes joined, ``index`` the sequence it belongs to (the contract's outputs and shapes)."""
    result = response(b"".join(t for t, _, _ in tokens), final=final, reason=reason, n_out=n_out)
    message = result.get_response()
    k = len(tokens[0][2]) if tokens else 0
    outputs = [("output_log_probs", "FP32", [1, len(tokens)], np.array([[v for _, v, _ in tokens]], np.float32)),
               ("cum_log_probs", "FP32", [1, 1 if cum is not None else 0],
                np.array([[cum] if cum is not None else []], np.float32)),
               ("output_token_bytes", "BYTES", [1, len(tokens)], np.array([[t for t, _, _ in tokens]], object)),
               ("top_logprob_bytes", "BYTES", [1, len(tokens), k],
                np.array([[[b for b, _ in top] for _, _, top in tokens]], object).reshape(1, len(tokens), k)),
               ("top_logprob_values", "FP32", [1, len(tokens), k],
                np.array([[[v for _, v in top] for _, _, top in tokens]], np.float32).reshape(1, len(tokens), k)),
               ("sequence_index", "INT32", [1, 1], np.array([[index]], np.int32))]
    for name, datatype, shape, array in outputs:
        message.outputs.add(name=name, datatype=datatype, shape=shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" and array.size else array.tobytes()
        message.raw_output_contents.append(raw)
    return grpcclient.InferResult(message)


# ------------------------------------------------------------------------------------------- request tensors


def test_defaults_send_only_required_inputs_stream_and_echo_flag():
    sent = tensors(build_inputs("héllo", SamplingParams(max_tokens=32), stream=False))
    assert list(sent) == ["text_input", "max_tokens", "stream", "exclude_input_in_output"]
    assert sent["text_input"][:2] == ("BYTES", [1, 1])
    assert sent["text_input"][2][0, 0] == "héllo".encode()
    assert sent["max_tokens"][:2] == ("INT32", [1, 1]) and sent["max_tokens"][2][0, 0] == 32
    assert sent["stream"][:2] == ("BOOL", [1, 1]) and not sent["stream"][2][0, 0]
    assert sent["exclude_input_in_output"][2][0, 0]


def test_every_optional_input_has_the_contract_name_dtype_and_shape():
    params = SamplingParams(max_tokens=8, temperature=0.7, top_k=40, top_p=0.9, seed=2**63 + 5, stop=["\n\n", "def"],
                            bad_words=["import"], min_tokens=2, end_id=2, pad_id=0, exclude_input_in_output=False)
    sent = tensors(build_inputs("x", params, stream=True))
    expected = {"text_input": ("BYTES", [1, 1]), "max_tokens": ("INT32", [1, 1]), "stream": ("BOOL", [1, 1]),
                "exclude_input_in_output": ("BOOL", [1, 1]), "temperature": ("FP32", [1, 1]),
                "top_k": ("INT32", [1, 1]), "top_p": ("FP32", [1, 1]), "seed": ("UINT64", [1, 1]),
                "min_tokens": ("INT32", [1, 1]), "end_id": ("INT32", [1, 1]), "pad_id": ("INT32", [1, 1]),
                "stop_words": ("BYTES", [1, 2]), "bad_words": ("BYTES", [1, 1])}
    assert {name: value[:2] for name, value in sent.items()} == expected
    assert sent["stream"][2][0, 0] and not sent["exclude_input_in_output"][2][0, 0]
    assert sent["temperature"][2][0, 0] == np.float32(0.7) and sent["top_p"][2][0, 0] == np.float32(0.9)
    assert sent["seed"][2][0, 0] == 2**63 + 5  # the full uint64 range survives
    assert sent["stop_words"][2].tolist() == [[b"\n\n", b"def"]]
    assert sent["bad_words"][2].tolist() == [[b"import"]]
    assert (sent["top_k"][2][0, 0], sent["min_tokens"][2][0, 0], sent["end_id"][2][0, 0]) == (40, 2, 2)


def test_issue_17_inputs_have_the_contract_names_dtypes_and_shapes():
    params = SamplingParams(repetition_penalty=1.3, presence_penalty=-0.5, frequency_penalty=2.0, min_p=0.05, n=3,
                            logprobs=True, top_logprobs=4, guide=Guide.json_schema({"type": "object"}))
    sent = tensors(build_inputs("x", params, stream=True))
    new = {name: value[:2] for name, value in sent.items() if name not in ("text_input", "max_tokens", "stream",
                                                                           "exclude_input_in_output")}
    assert new == {"repetition_penalty": ("FP32", [1, 1]), "presence_penalty": ("FP32", [1, 1]),
                   "frequency_penalty": ("FP32", [1, 1]), "min_p": ("FP32", [1, 1]),
                   "num_return_sequences": ("INT32", [1, 1]), "return_log_probs": ("BOOL", [1, 1]),
                   "top_logprobs": ("INT32", [1, 1]), "guided_decoding_guide_type": ("BYTES", [1, 1]),
                   "guided_decoding_guide": ("BYTES", [1, 1])}
    values = {name: sent[name][2][0, 0] for name in new}
    assert values["repetition_penalty"] == np.float32(1.3) and values["presence_penalty"] == np.float32(-0.5)
    assert values["frequency_penalty"] == 2.0 and values["min_p"] == np.float32(0.05)
    assert (values["num_return_sequences"], values["return_log_probs"], values["top_logprobs"]) == (3, True, 4)
    assert values["guided_decoding_guide_type"] == b"json_schema"
    assert json.loads(values["guided_decoding_guide"]) == {"type": "object"}


def test_a_json_guide_sends_only_its_type_and_guides_are_checked_before_sending():
    sent = tensors(build_inputs("x", SamplingParams(guide=Guide("json")), stream=False))
    assert sent["guided_decoding_guide_type"][2][0, 0] == b"json" and "guided_decoding_guide" not in sent
    assert tensors(build_inputs("x", SamplingParams(guide=Guide("regex", "[0-9]+")), stream=False))[
        "guided_decoding_guide"][2][0, 0] == b"[0-9]+"
    with pytest.raises(ValueError, match="json, json_schema, regex, ebnf_grammar"):
        Guide("yaml", "x")
    with pytest.raises(ValueError, match="needs its text"):
        Guide("ebnf_grammar")
    with pytest.raises(ValueError, match="takes no guide text"):
        Guide("json", "{}")


def test_collector_splits_interleaved_sequences_and_keeps_each_tokens_log_probs():
    collector = ResponseCollector("r", SamplingParams(n=2, top_logprobs=2))
    collector.mark_sent()
    euro = "€".encode()
    chunks = [
        collector.add(token_response([(b"a", -0.5, [(b"a", -0.5), (b"b", -1.5)])], index=1, cum=-0.5)),
        collector.add(token_response([(euro[:2], -0.25, [(euro[:2], -0.25), (b"x", -2.0)]),
                                      (euro[2:], -0.0, [(euro[2:], 0.0), (b"y", -float("inf"))])], index=0,
                                     cum=-0.25, n_out=2)),
        collector.add(token_response([(b"!", -1.0, [(b"?", -0.75), (b"!", -1.0)])], index=1, reason=b"length",
                                     cum=-1.5, n_out=2)),
        collector.add(token_response([], index=0, reason=b"stop", final=True, cum=-0.25, n_out=2)),
    ]
    assert [(c.index, c.text, c.finish_reason) for c in chunks] == [
        (1, "a", None), (0, "€", None), (1, "!", "length"), (0, "", "stop")]
    assert [[t.bytes for t in c.logprobs] for c in chunks] == [[b"a"], [euro[:2], euro[2:]], [b"!"], []]
    first, second = collector.completions
    assert (first.index, first.text, first.finish_reason, first.num_output_tokens) == (0, "€", "stop", 2)
    assert (second.index, second.text, second.finish_reason) == (1, "a!", "length")
    assert b"".join(t.bytes for t in first.logprobs) == first.text.encode()  # bytes kept: a split character
    assert first.logprobs[0].token == "\ufffd"  # a token holding part of a character has no text of its own
    assert [t.logprob for t in second.logprobs] == [-0.5, -1.0]
    assert [(t.token, t.logprob) for t in second.logprobs[1].top] == [("?", -0.75), ("!", -1.0)]
    assert first.logprobs[1].top[1].logprob == -float("inf")
    assert (first.cum_log_prob, second.cum_log_prob) == (-0.25, -1.5)
    assert collector.completion is first


def test_logprobs_are_none_unless_asked_and_empty_outputs_are_no_tokens():
    collector = ResponseCollector("r", SamplingParams())
    collector.add(response(b"hi", final=True, reason=b"stop"))
    assert collector.completion.logprobs is None and collector.completion.cum_log_prob is None
    asked = ResponseCollector("r", SamplingParams(logprobs=True))
    asked.add(token_response([(b"hi", -0.125, [])], index=0, reason=b"stop", final=True, cum=-0.125))
    assert [(t.token, t.logprob, t.top) for t in asked.completion.logprobs] == [("hi", -0.125, ())]


def test_n_sequences_come_from_generate_n_and_chunks_while_one_sequence_calls_refuse_n():
    script = [(token_response([(b"A", -1.0, [])], index=1), None),
              (token_response([(b"B", -2.0, [])], index=0, reason=b"stop"), None),
              (token_response([], index=1, reason=b"length", final=True), None)]
    llm, fake = fake_client(script)
    params = SamplingParams(n=2, logprobs=True)
    assert [(c.index, c.text, c.finish_reason) for c in llm.generate_n("p", params)] == [
        (0, "B", "stop"), (1, "A", "length")]
    assert fake.inputs[0]["num_return_sequences"][2][0, 0] == 2
    with pytest.raises(ValueError, match="call generate_n"):
        llm.generate("p", params)
    with pytest.raises(ValueError, match="call chat_n"):
        llm.chat(CHAT, params)
    stream = llm.stream("p", params)
    with pytest.raises(TypeError, match="iterate stream.chunks"):
        next(stream)
    assert [(c.index, c.text) for c in stream.chunks()] == [(1, "A"), (0, "B"), (1, "")]
    assert [c.text for c in stream.completions] == ["B", "A"]


def test_async_generate_n_and_chunks():
    script = [(token_response([(b"A", -1.0, [])], index=1), None),
              (token_response([(b"B", -2.0, [])], index=0, reason=b"stop", final=True), None)]

    async def run():
        llm, _ = fake_aio_client(script)
        params = SamplingParams(n=2, logprobs=True)
        completions = await llm.chat_n(CHAT, params)
        stream = llm.stream("p", params)
        chunks = [chunk async for chunk in stream.chunks()]
        return completions, chunks

    completions, chunks = asyncio.run(run())
    assert [c.text for c in completions] == ["B", "A"]
    assert [(c.index, c.text, [t.logprob for t in c.logprobs]) for c in chunks] == [(1, "A", [-1.0]),
                                                                                    (0, "B", [-2.0])]


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Où est <|im_end|> ?"}]


def test_chat_sends_the_conversation_as_one_json_string_instead_of_text_input():
    sent = tensors(build_chat_inputs(CHAT, SamplingParams(max_tokens=8, temperature=0.5), stream=True))
    assert list(sent) == ["messages", "max_tokens", "stream", "exclude_input_in_output", "temperature"]
    assert sent["messages"][:2] == ("BYTES", [1, 1])
    assert json.loads(sent["messages"][2][0, 0].decode()) == CHAT  # verbatim: the server applies the template
    assert sent["stream"][2][0, 0]


@pytest.mark.parametrize("messages", ["hello", {"role": "user", "content": "hi"}, [{"role": "user", "content": b"x"}]])
def test_chat_refuses_what_is_not_a_list_of_json_dicts_before_sending(messages):
    with pytest.raises(ValueError, match="messages must be a list of"):
        build_chat_inputs(messages, SamplingParams(), stream=False)


def test_zero_values_are_sent_but_empty_word_lists_are_not():
    sent = tensors(build_inputs("x", SamplingParams(temperature=0.0, top_k=0, seed=0, stop=[]), stream=False))
    assert {"temperature", "top_k", "seed"} <= set(sent)
    assert "stop_words" not in sent and "bad_words" not in sent


@pytest.mark.parametrize("params, name", [(SamplingParams(seed=-1), "seed"),
                                          (SamplingParams(max_tokens=2**31), "max_tokens"),
                                          (SamplingParams(top_k=-(2**31) - 1), "top_k")])
def test_integers_that_do_not_fit_their_dtype_are_refused_instead_of_wrapping(params, name):
    with pytest.raises(ValueError, match=name):
        build_inputs("x", params, stream=False)


# ------------------------------------------------------------------------------------------------ timings


def test_streamed_timings():
    t = Timings.measure(start=10.0, text_times=[10.1, 10.2, 10.5], end=10.5, output_tokens=5)
    assert t.ttft_s == pytest.approx(0.1)
    assert t.tpot_s == pytest.approx(0.4 / 4)  # first → last chunk, per token after the first
    assert t.total_s == pytest.approx(0.5)
    assert t.decode_tokens_per_s == pytest.approx(5 / 0.4)
    assert t.tokens_per_s == pytest.approx(5 / 0.5)


def test_single_chunk_timings_have_no_per_token_figures():
    t = Timings.measure(start=1.0, text_times=[1.3], end=1.3, output_tokens=12)
    assert t.ttft_s == pytest.approx(0.3) and t.total_s == pytest.approx(0.3)
    assert t.tpot_s is None and t.decode_tokens_per_s is None
    assert t.tokens_per_s == pytest.approx(40.0)


def test_timings_without_any_text_use_the_final_response():
    t = Timings.measure(start=0.0, text_times=[], end=0.25, output_tokens=0)
    assert (t.ttft_s, t.tpot_s, t.total_s) == (0.25, None, 0.25)
    assert t.tokens_per_s == 0.0


# --------------------------------------------------------------------------------------- response parsing


def test_final_flag_is_read_from_response_parameters():
    assert is_final(response(b"x", final=True))
    assert not is_final(response(b"x", final=False))
    assert is_final(response(None, final=True))


def test_collector_joins_deltas_keeps_split_characters_and_reads_the_final_response():
    collector = ResponseCollector("r1")
    collector.mark_sent()
    euro = "€".encode()
    deltas = [collector.add(response(b"a " + euro[:1], n_out=1)),
              collector.add(response(euro[1:] + b"b", n_out=2)),
              collector.add(response(b"", final=True, reason=b"length", n_out=3))]
    assert [chunk.text for chunk in deltas] == ["a ", "€b", ""]
    assert [chunk.finish_reason for chunk in deltas] == [None, None, "length"]
    completion = collector.completion
    assert completion.text == "a €b" and completion.finish_reason == "length"
    assert (completion.num_input_tokens, completion.num_output_tokens) == (3, 3)
    assert completion.request_id == "r1" and completion.timings.output_tokens == 3
    assert completion.timings.tpot_s is not None


def test_collector_accepts_an_empty_final_response():
    collector = ResponseCollector("r2")
    collector.mark_sent()
    collector.add(response(b"done", reason=b"stop", n_out=4))
    assert collector.completion is None
    collector.add(response(None, final=True))
    assert collector.completion.text == "done" and collector.completion.finish_reason == "stop"
    assert collector.completion.num_output_tokens == 4


def test_server_errors_keep_their_message_and_transport_errors_say_unreachable():
    message = "max_tokens must be between 1 and 256, got 0"
    error = to_error(InferenceServerException(msg=message), "h:1")
    assert type(error) is GenerationError and str(error) == message
    down = to_error(InferenceServerException(msg="connection refused", status="StatusCode.UNAVAILABLE"), "h:1")
    assert isinstance(down, ServerUnavailableError) and isinstance(down, GenerationError)
    assert str(down) == "cannot reach Triton at h:1: connection refused"


# ------------------------------------------------------------- request lifecycle (fake tritonclient stream)


class FakeStreamClient:
    """Stands in for tritonclient.grpc.InferenceServerClient: replays ``script`` through the stream callback."""

    def __init__(self, script):
        self.script, self.sent, self.stopped, self.inputs = script, [], [], []

    def start_stream(self, callback, stream_timeout=None):
        self.callback = callback

    def async_stream_infer(self, model_name, inputs, request_id="", enable_empty_final_response=False):
        assert enable_empty_final_response
        self.sent.append((model_name, request_id, [i.name() for i in inputs]))
        self.inputs.append(tensors(inputs))
        for result, error in self.script:
            self.callback(result=result, error=error)

    def stop_stream(self, cancel_requests=False):
        self.stopped.append(cancel_requests)

    def close(self):
        pass


STREAM_SCRIPT = [(response(b"Hel", n_out=1), None), (response(b"lo", n_out=2), None),
                 (response(b"!", final=True, reason=b"length", n_out=3), None)]


def fake_client(script) -> tuple[LLMClient, FakeStreamClient]:
    llm = LLMClient("fake:1")
    llm._grpc = fake = FakeStreamClient(script)
    llm._client_factory = lambda url: fake  # the stop request's own client
    return llm, fake


def test_stream_yields_deltas_then_has_the_completion_and_closes_the_stream_gracefully():
    llm, fake = fake_client(STREAM_SCRIPT)
    stream = llm.stream("p", SamplingParams(max_tokens=3))
    assert list(stream) == ["Hel", "lo", "!"]
    assert stream.completion.text == "Hello!" and stream.completion.finish_reason == "length"
    assert fake.sent == [("ensemble", stream.request_id, ["text_input", "max_tokens", "stream",
                                                          "exclude_input_in_output"])]
    assert fake.stopped == [False]


def test_generate_returns_the_completion_with_a_fresh_request_id_each_time():
    llm, fake = fake_client(STREAM_SCRIPT)
    first, second = llm.generate("p"), llm.generate("p")
    assert isinstance(first, Completion) and first.text == "Hello!"
    assert first.request_id != second.request_id
    assert fake.stopped == [False, False]


def test_chat_and_stream_chat_share_the_generate_path():
    llm, fake = fake_client(STREAM_SCRIPT)
    completion = llm.chat(CHAT, SamplingParams(max_tokens=3))
    stream = llm.stream_chat(CHAT, SamplingParams(max_tokens=3))
    assert completion.text == "".join(stream) == "Hello!" and stream.completion.finish_reason == "length"
    assert [names[0] for _, _, names in fake.sent] == ["messages", "messages"]
    assert [sent["stream"][2][0, 0] for sent in fake.inputs] == [False, True]
    assert fake.stopped == [False, False]


def test_stopping_iteration_early_cancels_the_request_and_frees_the_client():
    llm, fake = fake_client(STREAM_SCRIPT)
    with llm.stream("p") as stream:
        assert next(stream) == "Hel"
    # The stream is cancelled, then TensorRT-LLM's `stop` goes to the LLM model under the same request id
    # (Triton's ensemble does not cancel a step that is already running).
    assert fake.stopped == [True, False] and stream.completion is None
    (_, request_id, _), (stop_model, stop_id, stop_inputs) = fake.sent
    assert stop_model == "llm" and stop_id == request_id and "stop" in stop_inputs
    assert llm.generate("p").text == "Hello!"  # the one-request-at-a-time lock was released


def test_a_server_error_raises_and_ends_the_stream_without_cancel_or_stop():
    message = "max_tokens must be between 1 and 256, got 0"
    llm, fake = fake_client([(None, InferenceServerException(msg=message))])
    with pytest.raises(GenerationError, match=message):
        llm.generate("p", SamplingParams(max_tokens=0))
    # The request is over on the server: the stream closes gracefully and no `stop` request follows.
    assert fake.stopped == [False] and [model for model, _, _ in fake.sent] == ["ensemble"]


def test_a_transport_error_cancels_and_stops_the_request():
    llm, fake = fake_client([(None, InferenceServerException(msg="socket closed", status="StatusCode.UNAVAILABLE"))])
    with pytest.raises(GenerationError, match="socket closed"):
        llm.generate("p")
    assert fake.stopped[0] is True and fake.sent[-1][0] == "llm"


def test_bad_params_fail_when_the_stream_is_created_not_when_it_is_iterated():
    llm, fake = fake_client(STREAM_SCRIPT)
    with pytest.raises(ValueError, match="seed"):
        llm.stream("p", SamplingParams(seed=-1))
    assert fake.sent == []


def test_a_second_concurrent_request_on_one_sync_client_is_refused():
    llm, _ = fake_client(STREAM_SCRIPT)
    with llm.stream("p") as stream:
        next(stream)
        with pytest.raises(RuntimeError, match="one request at a time"):
            llm.generate("p")


class FakeAioCall:
    """Stands in for the asyncio client's stream_infer response iterator."""

    def __init__(self, requests, script):
        self.requests, self.script, self.cancelled, self.read_to_end = requests, list(script), False, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.script:
            self.read_to_end = True  # the call's status was read
            raise StopAsyncIteration
        return self.script.pop(0)

    def cancel(self):
        self.cancelled = True


def fake_aio_client(script) -> tuple[AsyncLLMClient, list[FakeAioCall]]:
    llm = AsyncLLMClient.__new__(AsyncLLMClient)  # no channel: nothing here touches the network
    llm.url, llm.model, llm._timeout, llm.stop_model, calls = "fake:1", "ensemble", None, "llm", []
    llm._background, llm._closed = set(), False

    class Grpc:
        def stream_infer(self, requests, stream_timeout=None):
            calls.append(FakeAioCall(requests, script))
            return calls[-1]

        async def close(self):
            pass

    llm._grpc = Grpc()
    return llm, calls


def test_async_stream_and_generate():
    async def run():
        llm, calls = fake_aio_client(STREAM_SCRIPT)
        stream = llm.stream("p")
        deltas = [delta async for delta in stream]
        request = [r async for r in calls[0].requests]
        return deltas, stream.completion, await llm.generate("p"), calls, request

    deltas, completion, generated, calls, request = asyncio.run(run())
    assert deltas == ["Hel", "lo", "!"] and completion.text == generated.text == "Hello!"
    assert [call.cancelled for call in calls] == [False, False]
    assert all(call.read_to_end for call in calls)  # not dropped at the final response (B5)
    assert request[0]["parameters"] == {"triton_enable_empty_final_response": True}
    assert request[0]["request_id"] == completion.request_id


def test_async_chat_and_stream_chat():
    async def run():
        llm, calls = fake_aio_client(STREAM_SCRIPT)
        completion = await llm.chat(CHAT)
        deltas = [delta async for delta in llm.stream_chat(CHAT)]
        return completion, deltas, [[r async for r in call.requests][0] for call in calls]

    completion, deltas, requests = asyncio.run(run())
    assert completion.text == "".join(deltas) == "Hello!"
    sent = [tensors(request["inputs"]) for request in requests]
    assert [json.loads(s["messages"][2][0, 0].decode()) for s in sent] == [CHAT, CHAT]
    assert [s["stream"][2][0, 0] for s in sent] == [False, True]


def test_async_early_close_stops_the_request_and_reads_its_call_to_the_end():
    """Never a mid-stream cancel (docs/reliability.md, cause D): `stop` to the llm under the request's id, and the
    call read to its final response by the client's own task, which close() waits for."""
    async def run():
        llm, calls = fake_aio_client(STREAM_SCRIPT)
        async with llm.stream("p") as stream:
            await stream.__anext__()
        await llm.close()
        stop_request = [r async for r in calls[1].requests]
        assert stop_request[0]["model_name"] == "llm" and stop_request[0]["request_id"] == stream.request_id
        failing, failed_calls = fake_aio_client([(None, InferenceServerException(msg="bad prompt")), (None, None)])
        with pytest.raises(GenerationError, match="bad prompt"):
            await failing.generate("p")
        await failing.close()
        # A server error ends the request: the call is read to its end, not cancelled, and no `stop` is sent.
        assert len(failed_calls) == 1 and not failed_calls[0].cancelled and failed_calls[0].read_to_end
        cut, _ = fake_aio_client(STREAM_SCRIPT[:1])
        with pytest.raises(GenerationError, match="before sending a final response"):
            await cut.generate("p")
        return calls

    abandoned = asyncio.run(run())[0]
    assert not abandoned.cancelled and abandoned.read_to_end


class SilentAioCall(FakeAioCall):
    """A call whose server never answers again after its first response."""

    async def __anext__(self):
        if self.script:
            return self.script.pop(0)
        await asyncio.Event().wait()


def test_an_abandoned_call_that_does_not_end_is_cancelled_after_the_timeout(monkeypatch):
    monkeypatch.setattr(aio, "ABANDONED_END_TIMEOUT_S", 0.05)

    async def run():
        llm, calls = fake_aio_client([])

        def stream_infer(requests, stream_timeout=None):  # the generation goes silent; its `stop` is answered
            calls.append(SilentAioCall(requests, STREAM_SCRIPT[:1]) if not calls else FakeAioCall(requests, []))
            return calls[-1]

        llm._grpc.stream_infer = stream_infer
        async with llm.stream("p") as stream:
            await stream.__anext__()
        await llm.close()
        return calls

    calls = asyncio.run(run())
    assert calls[0].cancelled and len(calls) == 2  # stopped first, then cancelled


# ---------------------------------------------------------------------------------------------------- CLI


def test_cli_generate_arguments():
    args = build_parser().parse_args(["generate", "def f(x):", "--max-tokens", "16", "--stream", "--temperature",
                                      "0.8", "--top-k", "5", "--top-p", "0.9", "--seed", "7", "--stop", "\n",
                                      "--stop", "def", "--no-exclude-input", "--json", "--url", "h:9"])
    assert (args.command, args.prompt, args.url, args.model, args.stream, args.json) == (
        "generate", "def f(x):", "h:9", "ensemble", True, True)
    assert sampling_params(args) == SamplingParams(max_tokens=16, temperature=0.8, top_k=5, top_p=0.9, seed=7,
                                                   stop=["\n", "def"], exclude_input_in_output=False)


def test_cli_defaults_leave_sampling_to_the_server():
    args = build_parser().parse_args(["generate", "x"])
    assert (args.url, args.model, args.stream, args.json) == ("localhost:8001", "ensemble", False, False)
    assert sampling_params(args) == SamplingParams(max_tokens=64)
    assert build_parser().parse_args(["health", "--url", "h:1"]).url == "h:1"


def test_cli_summary_and_json():
    timings = Timings.measure(start=0.0, text_times=[0.02, 0.1], end=0.1, output_tokens=9)
    completion = Completion(text="héllo", finish_reason="stop", num_input_tokens=4, num_output_tokens=9,
                            timings=timings, request_id="r")
    line = summary(completion)
    assert "TTFT 20.0 ms" in line and "decode 112.5 tok/s" in line and "overall 90.0 tok/s" in line
    assert line.endswith("finish: stop") and "\n" not in line
    data = json.loads(json.dumps(completion_json(completion)))
    assert data["text"] == "héllo" and data["num_output_tokens"] == 9
    assert data["timings"]["ttft_s"] == pytest.approx(0.02)
    one_chunk = Timings.measure(start=0.0, text_times=[0.05], end=0.05, output_tokens=24)
    assert "TTFT 50.0 ms (one chunk)" in summary(Completion(text="x", finish_reason="length", num_input_tokens=4,
                                                           num_output_tokens=24, timings=one_chunk, request_id="r"))


def test_cli_unreachable_server_is_one_clean_line_and_exit_1(capsys):
    with socket.socket() as sock:  # bound, not listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"127.0.0.1:{sock.getsockname()[1]}"
        for argv in (["generate", "x", "--url", url], ["generate", "x", "--stream", "--url", url],
                     ["chat", "x", "--url", url], ["health", "--url", url]):
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert err.startswith(f"error: cannot reach Triton at {url}: ") and err.count("\n") == 1


def test_cli_issue_17_flags(tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "required": ["a"]}')
    args = build_parser().parse_args(["generate", "x", "-n", "3", "--logprobs", "--top-logprobs", "5",
                                      "--repetition-penalty", "1.2", "--presence-penalty", "0.5",
                                      "--frequency-penalty", "-0.5", "--min-p", "0.1", "--json-schema", str(schema)])
    assert sampling_params(args) == SamplingParams(
        max_tokens=64, n=3, logprobs=True, top_logprobs=5, repetition_penalty=1.2, presence_penalty=0.5,
        frequency_penalty=-0.5, min_p=0.1, guide=Guide("json_schema", '{"type": "object", "required": ["a"]}'))
    for flags, expected in ((["--json-object"], Guide("json")), (["--regex", "[a-z]+"], Guide("regex", "[a-z]+"))):
        assert sampling_params(build_parser().parse_args(["generate", "x", *flags])).guide == expected
    with pytest.raises(SystemExit):  # one guide at a time
        build_parser().parse_args(["generate", "x", "--json-object", "--regex", "a"])
    chat = build_parser().parse_args(["chat", "Hi?", "--min-p", "0.2", "--json-object"])
    assert sampling_params(chat) == SamplingParams(max_tokens=256, min_p=0.2, guide=Guide("json"))


@pytest.mark.parametrize("argv", [["--help"], ["generate", "--help"]])
def test_cli_help_lists_every_issue_17_flag(capsys, argv):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag in ("--repetition-penalty", "--presence-penalty", "--frequency-penalty", "--min-p", "-n N",
                 "--logprobs", "--top-logprobs", "--json-schema FILE", "--json-object", "--regex", "--grammar"):
        assert flag in help_text, flag


def test_cli_missing_schema_file_is_one_line(tmp_path, capsys):
    assert main(["generate", "x", "--json-schema", str(tmp_path / "nope.json"), "--url", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read ") and "nope.json" in err and err.count("\n") == 1


def test_cli_n_sequences_with_logprobs_print_one_json_line_each(monkeypatch, capsys):
    script = [(token_response([(b"A", -1.0, [(b"A", -1.0)])], index=1, reason=b"length"), None),
              (token_response([(b"B", -float("inf"), [(b"C", -0.5)])], index=0, reason=b"stop", final=True,
                              cum=-3.0), None)]
    llm, fake = fake_client(script)
    monkeypatch.setattr("client.__main__.LLMClient", lambda url, model: llm)
    assert main(["generate", "p", "-n", "2", "--top-logprobs", "1", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["index"], d["text"], d["finish_reason"]) for d in lines] == [(0, "B", "stop"), (1, "A", "length")]
    assert lines[0]["logprobs"] == [{"token": "B", "bytes": [66], "logprob": None,  # -inf: JSON has none
                                     "top_logprobs": [{"token": "C", "bytes": [67], "logprob": -0.5}]}]
    assert lines[0]["cum_log_prob"] == -3.0
    assert fake.inputs[0]["top_logprobs"][2][0, 0] == 1 and fake.inputs[0]["num_return_sequences"][2][0, 0] == 2
    assert main(["generate", "p", "-n", "2", "--stream"]) == 1
    assert "drop --stream" in capsys.readouterr().err


def test_cli_chat_arguments():
    args = build_parser().parse_args(["chat", "Hi?", "--system", "Be brief.", "--max-tokens", "9", "--temperature",
                                      "0.5", "--stats"])
    assert (args.command, args.question, args.system, args.stats) == ("chat", "Hi?", "Be brief.", True)
    assert sampling_params(args) == SamplingParams(max_tokens=9, temperature=0.5)
    args = build_parser().parse_args(["chat"])
    assert args.question is None and sampling_params(args) == SamplingParams(max_tokens=256)


def test_cli_chat_one_question_streams_the_answer(monkeypatch, capsys):
    llm, fake = fake_client(STREAM_SCRIPT)
    monkeypatch.setattr("client.__main__.LLMClient", lambda url, model: llm)
    assert main(["chat", "Hi?", "--system", "Be brief."]) == 0
    assert capsys.readouterr() == ("Hello!\n", "")
    assert json.loads(fake.inputs[0]["messages"][2][0, 0].decode()) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    assert fake.inputs[0]["stream"][2][0, 0]


def test_cli_chat_from_stdin_keeps_the_history(monkeypatch, capsys):
    import io

    llm, fake = fake_client(STREAM_SCRIPT)
    monkeypatch.setattr("client.__main__.LLMClient", lambda url, model: llm)
    monkeypatch.setattr("sys.stdin", io.StringIO("first\n\n  \nsecond\n"))
    assert main(["chat"]) == 0
    assert capsys.readouterr() == ("Hello!\nHello!\n", "")  # blank lines are skipped; no prompt when piped
    sent = [json.loads(inputs["messages"][2][0, 0].decode()) for inputs in fake.inputs]
    assert sent == [[{"role": "user", "content": "first"}],
                    [{"role": "user", "content": "first"}, {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "second"}]]


def test_cli_chat_from_stdin_reports_a_failed_turn_drops_it_and_goes_on(monkeypatch, capsys):
    import io

    message = "conversation (after the chat template) is 300 tokens long"
    answers = iter([[(None, InferenceServerException(msg=message))], STREAM_SCRIPT])
    llm, fake = fake_client([])
    monkeypatch.setattr(fake, "async_stream_infer", lambda model_name, inputs, request_id="", **kw: (
        fake.inputs.append(tensors(inputs)),
        [fake.callback(result=r, error=e) for r, e in next(answers)]))
    monkeypatch.setattr("client.__main__.LLMClient", lambda url, model: llm)
    monkeypatch.setattr("sys.stdin", io.StringIO("too long\nshort\n"))
    assert main(["chat"]) == 1
    out, err = capsys.readouterr()
    assert out == "Hello!\n" and err == f"error: {message}\n"
    assert json.loads(fake.inputs[1]["messages"][2][0, 0].decode()) == [{"role": "user", "content": "short"}]
