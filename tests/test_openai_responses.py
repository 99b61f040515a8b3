"""The Responses API (``POST /v1/responses``, stateless) with the official ``openai`` SDK, both layouts: text answers,
streamed events the SDK's stream reads into the same response, structured output (``responses.parse`` with a pydantic
model), function calls whose arguments validate, a conversation replayed in ``input``, and the stateful parameters
refused by name."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

pytestmark = pytest.mark.both_layouts

MODEL = "tiny"
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                  "required": ["city"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather", "parameters": WEATHER_PARAMS,
           "strict": True}


@pytest.fixture(scope="module")
def triton(long_triton):
    return long_triton


def test_a_text_answer_and_its_stream_are_the_same_response(sdk):
    whole = sdk.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=12)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.status in ("completed", "incomplete") and whole.output[0].type == "message"
    assert whole.usage.output_tokens >= 1 and whole.usage.total_tokens == whole.usage.input_tokens + \
        whole.usage.output_tokens
    events = list(sdk.responses.create(model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=12,
                                       stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == f"response.{whole.status}"
    final = events[-1].response  # completed, or incomplete at max_output_tokens (as OpenAI ends such a stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == whole.output_text  # greedy: the same text
    assert final.id == events[0].response.id and final.status == whole.status


def test_structured_output_parses_into_a_pydantic_model(sdk):
    class City(BaseModel):  # bounded: the tiny random model would otherwise write one string to max_output_tokens
        name: str = Field(max_length=8)
        population: int = Field(ge=0, le=10**9)

    parsed = sdk.responses.parse(model=MODEL, input="Name a city.", text_format=City, max_output_tokens=200,
                                 temperature=1.0).output_parsed
    assert isinstance(parsed, City)


def test_a_required_function_call_validates_and_streams_the_same(sdk):
    kwargs = dict(model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=120)  # one call, then the end
    whole = sdk.responses.create(**kwargs)
    calls = [item for item in whole.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    with sdk.responses.stream(**kwargs) as s:
        events = list(s)
        final = s.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert [c.arguments for c in streamed] == [c.arguments for c in calls]
    assert [e.type for e in events][:2] == ["response.created", "response.in_progress"]
    assert "response.function_call_arguments.delta" in {e.type for e in events}


def test_a_replayed_conversation_with_a_call_and_its_output_continues(sdk):
    answer = sdk.responses.create(model=MODEL, max_output_tokens=8, tools=[WEATHER], tool_choice="none", input=[
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ])
    assert answer.output[0].type == "message"


@pytest.mark.parametrize("fields, param", [({"store": True}, "store"), ({"previous_response_id": "resp_1"},
                                                                         "previous_response_id")])
def test_state_the_server_does_not_keep_is_refused_by_name(sdk, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(model=MODEL, input="hi", max_output_tokens=4, **fields)
    assert refused.value.param == param and "keeps no responses" in refused.value.message
