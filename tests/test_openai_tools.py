"""Tool calling through the OpenAI front door with the official ``openai`` SDK, both layouts: forced calls whose
arguments validate against the tool's parameters, streamed deltas in OpenAI's shape that join to the non-streamed call,
``required`` and ``auto``, a conversation that carries calls and results, the tolerant schema, X-Request-Id and CORS.

The tiny model's weights are random, so what it writes is noise; what is checked holds for any model: the guide
(serving/tools.py) makes every call one of the offered tools, with arguments that validate, and greedy decoding makes
the streamed answer the non-streamed one.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import requests

from tests.openai_front import FrontDoorProcess

pytestmark = pytest.mark.both_layouts

MODEL = "tiny"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                   "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                  "required": ["city", "days"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather forecast",
                                            "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris this week?"}]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME["function"]["parameters"]}


@pytest.fixture(scope="module")
def triton(long_triton):
    """The tiny model with room for a prompt that lists tools (tests/conftest.py: 768 input tokens)."""
    return long_triton


def check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


def streamed(sdk, **kwargs) -> tuple[dict[int, dict], str, str | None, list]:
    """The stream's calls by index (id, name, joined arguments), its content and finish reason, and the raw deltas."""
    calls: dict[int, dict] = {}
    content, finish, deltas = "", None, []
    for chunk in sdk.chat.completions.create(**kwargs, stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        finish = choice.finish_reason or finish
        for delta in choice.delta.tool_calls or ():
            deltas.append(delta)
            call = calls.setdefault(delta.index, {"id": None, "name": None, "arguments": ""})
            if delta.id is not None:
                assert call["id"] is None, "a call's id comes once, in its first delta"
                call.update(id=delta.id, name=delta.function.name)
            call["arguments"] += delta.function.arguments or ""
    return calls, content, finish, deltas


def test_a_named_tool_choice_is_a_call_whose_arguments_validate(sdk):
    for seed in range(3):
        answer = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], temperature=1.0,
                                             seed=seed, max_tokens=120,
                                             tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        assert choice.message.tool_calls[0].function.name == "get_weather"
        check_call(choice.message.tool_calls[0])


def test_streamed_call_deltas_are_openais_shape_and_join_to_the_non_streamed_call(sdk):
    kwargs = dict(model=MODEL, messages=ASK, tools=[WEATHER], max_tokens=120,
                  tool_choice={"type": "function", "function": {"name": "get_weather"}})  # greedy: reproducible
    whole = sdk.chat.completions.create(**kwargs).choices[0].message.tool_calls[0]
    calls, content, finish, deltas = streamed(sdk, **kwargs)
    assert finish == "tool_calls" and content == ""
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].type == "function"
    assert deltas[0].function.name == "get_weather" and deltas[0].function.arguments == ""
    assert all(d.id is None and d.type is None and d.function.name is None for d in deltas[1:])
    assert calls[0]["name"] == whole.function.name and calls[0]["arguments"] == whole.function.arguments
    check_call(whole)


def test_required_makes_a_call_of_an_offered_tool_and_parallel_false_only_one(sdk):
    for seed in range(3):
        answer = sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                             parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=120)
        message = answer.choices[0].message
        assert answer.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) == 1
        check_call(message.tool_calls[0])


def test_auto_answers_in_text_or_calls_and_streams_what_it_answers(sdk):
    kwargs = dict(model=MODEL, messages=ASK, tools=[WEATHER, TIME], max_tokens=60)
    whole = sdk.chat.completions.create(**kwargs).choices[0]
    calls, content, finish, _ = streamed(sdk, **kwargs)
    assert (whole.message.content or "") == content and finish == whole.finish_reason
    assert [c.function.arguments for c in whole.message.tool_calls or ()] == [c["arguments"] for c in calls.values()]
    for call in whole.message.tool_calls or ():
        check_call(call)


def test_a_conversation_with_calls_and_results_continues(sdk):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"forecast": "sun"}'},
    ]
    answer = sdk.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], tool_choice="none",
                                         max_tokens=8)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason in ("stop", "length")


def test_what_clients_always_send_is_accepted(sdk):
    """The fields agent frameworks and SDKs send besides the ones that matter, and what clients echo back."""
    history = [{"role": "system", "content": "Be brief.", "name": "policy"},
               {"role": "user", "content": [{"type": "text", "text": "Hi"}], "name": "ana"},
               {"role": "assistant", "content": "Hello.", "refusal": None, "reasoning_content": "greet back"},
               {"role": "user", "content": "Again?"}]
    answer = sdk.chat.completions.create(
        model=MODEL, messages=history, max_tokens=4, store=False, metadata={"run": "1"}, service_tier="auto",
        user="u1", prompt_cache_key="k", safety_identifier="s", parallel_tool_calls=True,
        extra_body={"top_k": 5, "min_tokens": 2, "repetition_penalty": 1.1, "chat_template_kwargs": {"x": 1}})
    assert answer.usage.completion_tokens >= 2


def test_without_max_tokens_the_answer_may_run_to_the_end_of_the_context(front):
    body = {"model": MODEL, "messages": ASK, "temperature": 1.0, "seed": 1}
    usage = requests.post(front.v1 + "/chat/completions", json=body, timeout=300).json()["usage"]
    assert usage["completion_tokens"] > 256 or usage["total_tokens"] <= 1024  # no fixed 256 cap


def test_tool_parameters_the_guide_would_not_enforce_are_refused_by_name(sdk):
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"host": {"type": "string", "format": "hostname"}}}}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[bad], tool_choice="required", max_tokens=8)
    assert "format 'hostname' is not enforced" in refused.value.message and refused.value.param == "tools"


def test_x_request_id_is_echoed_and_a_bad_one_refused(front):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    response = requests.post(front.v1 + "/chat/completions", json=body, headers={"X-Request-Id": "trace-42"},
                             timeout=60)
    assert response.status_code == 200 and response.headers["X-Request-Id"] == "trace-42"
    assert requests.get(front.v1 + "/models", timeout=10).headers["X-Request-Id"]  # one is made when none is sent
    response = requests.post(front.v1 + "/chat/completions", json=body, headers={"X-Request-Id": "two words"},
                             timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-Request-Id"


def test_cors_preflight_is_answered_before_the_key_check(triton):
    door = FrontDoorProcess(triton.urls.grpc, api_keys="sekrit", extra_args=("--cors-origins", "https://app.test"))
    try:
        preflight = requests.options(door.v1 + "/chat/completions", timeout=10, headers={
            "Origin": "https://app.test", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200, preflight.text
        assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.test"
        denied = requests.post(door.v1 + "/chat/completions", json={"model": MODEL, "messages": ASK}, timeout=10,
                               headers={"Origin": "https://app.test"})
        assert denied.status_code == 401 and denied.headers["Access-Control-Allow-Origin"] == "https://app.test"
        other = requests.options(door.v1 + "/chat/completions", timeout=10, headers={
            "Origin": "https://evil.test", "Access-Control-Request-Method": "POST"})
        assert "Access-Control-Allow-Origin" not in other.headers
    finally:
        assert door.stop() == 0
