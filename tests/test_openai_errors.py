"""Every way a request can be wrong gets OpenAI's error object with the right status and a message naming the
problem (never a 500 for a client's mistake); API keys; 429 with Retry-After when the engine's queue is full."""

from __future__ import annotations

import concurrent.futures
import json

import openai
import pytest
import requests

from tests.openai_front import FrontDoorProcess
from tests.stack import stack_profile

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

MODEL = "tiny"
MSGS = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return {"model": MODEL, "messages": MSGS, "max_tokens": 4, **fields}


def completion(**fields):
    return {"model": MODEL, "prompt": "x = 1", "max_tokens": 4, **fields}


LONG = "word " * 400  # over TEST_LIMITS' max_input_len of 192 tokens

# (name, method, path, body (dict, or raw bytes), status, code, message fragment)
CATALOGUE = [
    ("malformed JSON", "POST", "/chat/completions", b'{"model": "tiny", "messages": [', 400, "invalid_json",
     "not valid JSON"),
    ("empty body", "POST", "/chat/completions", b"", 400, "invalid_json", "not valid JSON"),
    ("body not an object", "POST", "/chat/completions", b"[1, 2]", 400, "invalid_json", "must be a JSON object"),
    ("missing model", "POST", "/chat/completions", {"messages": MSGS}, 400, "missing_required_parameter", "'model'"),
    ("missing messages", "POST", "/chat/completions", {"model": MODEL}, 400, "missing_required_parameter",
     "'messages'"),
    ("empty messages", "POST", "/chat/completions", chat(messages=[]), 400, "invalid_value", "at least 1"),
    ("unknown role", "POST", "/chat/completions", chat(messages=[{"role": "robot", "content": "x"}]), 400,
     "invalid_value", "messages[0].role"),
    ("tool result without its call id", "POST", "/chat/completions",
     chat(messages=[{"role": "tool", "content": "x"}]), 400, "invalid_value", "needs tool_call_id"),
    ("tool result without a matching call", "POST", "/chat/completions",
     chat(messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "x", "tool_call_id": "c9"}]),
     400, "invalid_value", "no earlier assistant message made a call with that id"),
    ("unknown message field", "POST", "/chat/completions",
     chat(messages=[{"role": "user", "content": "x", "mood": "a"}]), 400, "unknown_parameter", "messages[0].mood"),
    ("content not a string", "POST", "/chat/completions", chat(messages=[{"role": "user", "content": 5}]), 400,
     "invalid_value", "messages[0].content"),
    ("image part", "POST", "/chat/completions",
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400,
     "invalid_value", "messages[0].content"),
    ("message without content", "POST", "/chat/completions", chat(messages=[{"role": "user"}]), 400,
     "invalid_value", "a user message needs content"),
    ("unknown parameter", "POST", "/chat/completions", chat(foo=1), 400, "unknown_parameter",
     "Unrecognized request argument supplied: foo"),
    ("tool parameters not an object schema", "POST", "/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]), 400,
     "invalid_value", "must be a JSON Schema of an object"),
    ("tool name with a space", "POST", "/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "get weather"}}]), 400, "invalid_value",
     "tools[0].function.name must be 1-64"),
    ("tool_choice names an unknown tool", "POST", "/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), 400, "invalid_value",
     "names the function 'g', which is not in tools"),
    ("tool_choice without tools", "POST", "/chat/completions", chat(tool_choice="required"), 400, None,
     "'tool_choice' needs 'tools'"),
    ("a custom tool", "POST", "/chat/completions",
     chat(tools=[{"type": "custom", "custom": {"name": "f"}}]), 400, "invalid_value", "tools[0].type"),
    ("tools with response_format", "POST", "/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}], response_format={"type": "json_object"}), 400,
     None, "'response_format' cannot be combined with tools"),
    ("deprecated functions", "POST", "/chat/completions", chat(functions=[{"name": "f"}]), 400,
     "unsupported_parameter", "'functions'"),
    ("stored completion", "POST", "/chat/completions", chat(store=True), 400, "unsupported_parameter", "'store'"),
    ("logit_bias key not a token id", "POST", "/chat/completions", chat(logit_bias={"the": 10}), 400,
     "invalid_value", "'logit_bias' keys are token ids"),
    ("logit_bias above 100", "POST", "/completions", completion(logit_bias={"5": 101}), 400, "invalid_value",
     "between -100 and 100"),
    ("logit_bias token beyond the vocabulary", "POST", "/chat/completions", chat(logit_bias={"99999999": 1}), 400,
     None, "not in the model's vocabulary"),
    ("audio output", "POST", "/chat/completions", chat(modalities=["text", "audio"]), 400, "unsupported_parameter",
     "'modalities'"),
    ("n above 8", "POST", "/chat/completions", chat(n=9), 400, "invalid_value", "'n' must be between 1 and 8"),
    ("n zero", "POST", "/chat/completions", chat(n=0), 400, "invalid_value", "'n' must be between 1 and 8"),
    ("frequency_penalty above 2", "POST", "/chat/completions", chat(frequency_penalty=2.5), 400, "invalid_value",
     "'frequency_penalty'"),
    ("presence_penalty below -2", "POST", "/chat/completions", chat(presence_penalty=-3), 400, "invalid_value",
     "'presence_penalty'"),
    ("presence_penalty a string", "POST", "/completions", completion(presence_penalty="1"), 400, "invalid_value",
     "'presence_penalty'"),
    ("repetition_penalty zero", "POST", "/chat/completions", chat(repetition_penalty=0), 400, "invalid_value",
     "'repetition_penalty'"),
    ("min_p above one", "POST", "/completions", completion(min_p=1.5), 400, "invalid_value", "'min_p'"),
    ("logprobs not a boolean", "POST", "/chat/completions", chat(logprobs=1), 400, "invalid_value", "'logprobs'"),
    ("top_logprobs above 20", "POST", "/chat/completions", chat(logprobs=True, top_logprobs=21), 400,
     "invalid_value", "'top_logprobs'"),
    ("top_logprobs without logprobs", "POST", "/chat/completions", chat(top_logprobs=2), 400, None,
     "'top_logprobs' needs 'logprobs'"),
    ("unknown response_format type", "POST", "/chat/completions", chat(response_format={"type": "yaml"}), 400,
     "invalid_value", "'response_format.type'"),
    ("json_schema without its spec", "POST", "/chat/completions", chat(response_format={"type": "json_schema"}),
     400, None, "'response_format.json_schema' is required"),
    ("json_schema without a schema", "POST", "/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400, "missing_required_parameter",
     "'response_format.json_schema.schema'"),
    ("json_schema name with a space", "POST", "/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}), 400,
     "invalid_value", "'response_format.json_schema.name'"),
    ("json_schema schema not an object", "POST", "/chat/completions",
     chat(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}}), 400,
     "invalid_value", "'response_format.json_schema.schema'"),
    ("temperature too high", "POST", "/chat/completions", chat(temperature=2.5), 400, "invalid_value",
     "'temperature'"),
    ("temperature a string", "POST", "/chat/completions", chat(temperature="0.5"), 400, "invalid_value",
     "'temperature'"),
    ("negative temperature", "POST", "/chat/completions", chat(temperature=-0.1), 400, "invalid_value",
     "'temperature'"),
    ("top_p zero", "POST", "/chat/completions", chat(top_p=0), 400, "invalid_value", "'top_p'"),
    ("top_p above one", "POST", "/chat/completions", chat(top_p=1.5), 400, "invalid_value", "'top_p'"),
    ("max_tokens zero", "POST", "/chat/completions", chat(max_tokens=0), 400, "invalid_value", "'max_tokens'"),
    ("max_tokens a float", "POST", "/chat/completions", chat(max_tokens=3.5), 400, "invalid_value", "'max_tokens'"),
    ("max_tokens over the context", "POST", "/chat/completions", chat(max_tokens=10**6), 400,
     "context_length_exceeded", "maximum context length"),
    ("max_tokens over the rest of the context", "POST", "/chat/completions", chat(max_tokens=250), 400,
     "context_length_exceeded", "max_tokens must be between 1 and"),
    ("prompt too long (chat)", "POST", "/chat/completions", chat(messages=[{"role": "user", "content": LONG}]), 400,
     "context_length_exceeded", "max_input_len"),
    ("prompt too long (streamed)", "POST", "/chat/completions",
     chat(messages=[{"role": "user", "content": LONG}], stream=True), 400, "context_length_exceeded", "max_input_len"),
    ("max_tokens and max_completion_tokens differ", "POST", "/chat/completions", chat(max_completion_tokens=5), 400,
     None, "differ"),
    ("five stop strings", "POST", "/chat/completions", chat(stop=list("abcde")), 400, "invalid_value", "at most 4"),
    ("empty stop string", "POST", "/chat/completions", chat(stop=""), 400, "invalid_value", "empty"),
    ("stop_options without stream", "POST", "/chat/completions", chat(stream_options={"include_usage": True}), 400,
     None, "'stream_options'"),
    ("unknown stream option", "POST", "/chat/completions", chat(stream=True, stream_options={"foo": True}), 400,
     "unknown_parameter", "stream_options.foo"),
    ("seed out of range", "POST", "/chat/completions", chat(seed=2**64), 400, "invalid_value", "'seed'"),
    ("stream a string", "POST", "/chat/completions", chat(stream="yes"), 400, "invalid_value", "'stream'"),
    ("unknown model", "POST", "/chat/completions", chat(model="gpt-4o"), 404, "model_not_found", "gpt-4o"),
    ("unknown model (completions)", "POST", "/completions", completion(model="gpt-4o"), 404, "model_not_found",
     "gpt-4o"),
    ("empty prompt", "POST", "/completions", completion(prompt=""), 400, "invalid_value", "'prompt' is empty"),
    ("two prompts", "POST", "/completions", completion(prompt=["a", "b"]), 400, "invalid_value", "exactly one"),
    ("token-id prompt", "POST", "/completions", completion(prompt=[1, 2, 3]), 400, "invalid_value", "'prompt"),
    ("echo", "POST", "/completions", completion(echo=True), 400, "unsupported_parameter", "'echo'"),
    ("best_of", "POST", "/completions", completion(best_of=3), 400, "unsupported_parameter", "'best_of'"),
    ("suffix", "POST", "/completions", completion(suffix="x"), 400, "unsupported_parameter", "'suffix'"),
    ("completion logprobs above 5", "POST", "/completions", completion(logprobs=6), 400, "invalid_value",
     "'logprobs'"),
    ("completion logprobs a boolean", "POST", "/completions", completion(logprobs=True), 400, "invalid_value",
     "'logprobs'"),
    ("response_format on completions", "POST", "/completions", completion(response_format={"type": "json_object"}),
     400, "unknown_parameter", "response_format"),
    ("prompt too long (completions)", "POST", "/completions", completion(prompt=LONG), 400,
     "context_length_exceeded", "max_input_len"),
    ("messages on completions", "POST", "/completions", {"model": MODEL, "messages": MSGS}, 400,
     "unknown_parameter", "messages"),
    ("unknown model id", "GET", "/models/nope", None, 404, "model_not_found", "nope"),
    ("unknown route", "GET", "/engines", None, 404, "unknown_url", "/v1/engines"),
    ("wrong method", "GET", "/chat/completions", None, 405, "method_not_allowed", "GET"),
    ("body too large", "POST", "/completions", b'{"x": "' + b"a" * (9 * 2**20) + b'"}', 413, "request_too_large",
     "limit"),
]


def test_catalogue_is_big_enough():
    assert len(CATALOGUE) >= 30


@pytest.mark.parametrize("name, method, path, body, status, code, fragment", CATALOGUE,
                         ids=[c[0] for c in CATALOGUE])
def test_bad_request(front, name, method, path, body, status, code, fragment):
    kwargs = {"data": body} if isinstance(body, bytes) else ({"json": body} if body is not None else {})
    response = requests.request(method, front.v1 + path, timeout=60, **kwargs)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert fragment in error["message"], error
    if code is not None:
        assert error["code"] == code, error


def test_the_sdk_raises_typed_errors(front):
    with openai.OpenAI(base_url=front.v1, api_key="x", max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as bad:
            sdk.chat.completions.create(model=MODEL, messages=MSGS, modalities=["audio"])
        assert bad.value.param == "modalities" and bad.value.code == "unsupported_parameter"
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: guided_json"):
            sdk.chat.completions.create(model=MODEL, messages=MSGS, extra_body={"guided_json": {}})
        with pytest.raises(openai.NotFoundError):
            sdk.chat.completions.create(model="nope", messages=MSGS)


def test_server_is_live_after_the_catalogue(front):
    assert requests.get(front.url + "/health").status_code == 200
    done = requests.post(front.v1 + "/chat/completions", json=chat(max_tokens=3), timeout=60)
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] >= 1
    assert front.process.poll() is None


# ------------------------------------------------------------------------------------------------------ API keys

@pytest.fixture(scope="module")
def keyed(triton):
    door = FrontDoorProcess(triton.urls.grpc, api_keys="key-one, key-two")
    yield door
    assert door.stop() == 0


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer key-one-extra", "Basic key-one", "key-one",
                                    "Bearer ", "Bearer key-on"])
def test_missing_or_wrong_key_is_401(keyed, header):
    headers = {"Authorization": header} if header is not None else {}
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/metrics"),
                         ("GET", "/v1/nowhere")):
        response = requests.request(method, keyed.url + path, headers=headers, json=chat(), timeout=30)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"


def test_every_configured_key_works_and_probes_need_none(keyed):
    for key in ("key-one", "key-two"):
        with openai.OpenAI(base_url=keyed.v1, api_key=key, max_retries=0) as sdk:
            assert sdk.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2).choices
    with openai.OpenAI(base_url=keyed.v1, api_key="nope", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            sdk.models.list()
    assert requests.get(keyed.url + "/health").status_code == 200
    assert requests.get(keyed.url + "/health/live").status_code == 200


# ------------------------------------------------------------------------------------- 429 when the queue is full

@pytest.fixture(scope="module")
def small_queue_triton(engine_dir, tiny_checkpoint, tmp_path_factory):
    """A server whose llm holds one request in its queue (beyond its KV slots): easy to overload."""
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    profile = stack_profile(engine_dir, tiny_checkpoint, llm_queue=1)
    repo = render_repository(profile, tmp_path_factory.mktemp("openai-queue") / "model_repository")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=tmp_path_factory.mktemp("openai-queue-triton") / "tritonserver.log")
    with TritonServer(config, ready_timeout=240) as server:
        yield server


def test_full_queue_is_429_with_retry_after(small_queue_triton):
    door = FrontDoorProcess(small_queue_triton.urls.grpc)
    try:
        def one(_):
            return requests.post(door.v1 + "/chat/completions", timeout=120,
                                 json=chat(max_tokens=120, stream=bool(_ % 2)))

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            responses = list(pool.map(one, range(32)))
        statuses = [r.status_code for r in responses]
        assert set(statuses) <= {200, 429}, statuses
        assert 429 in statuses and 200 in statuses, statuses
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "queue_full" and error["type"] == "rate_limit_error" and "queue is full" in \
            error["message"]
        with openai.OpenAI(base_url=door.v1, api_key="x", max_retries=0) as sdk:  # and the server recovers
            assert sdk.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2).choices
    finally:
        assert door.stop() == 0


def test_catalogue_bodies_are_json_or_bytes():
    for case in CATALOGUE:
        assert case[3] is None or isinstance(case[3], (bytes, dict)), case[0]
        if isinstance(case[3], dict):
            json.dumps(case[3])


@pytest.mark.parametrize("message", [
    "the engine failed while generating this request: ValueError: the schema must be an object",
    "Executor failed process requestId 7 due to the following error: stop word list must be [1, 2, N]",
])
def test_an_engine_failure_is_a_500_whatever_its_words(message):
    """Both layouts' words for a request the engine failed: a 500, even when the exception's text reads like a
    client's mistake ("schema", "must be", "stop")."""
    from client import GenerationError
    from serving.openai.errors import from_triton

    error = from_triton(GenerationError(message), "messages")
    assert error.status == 500 and error.code == "engine_error" and message in error.message
