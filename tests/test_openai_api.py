"""The OpenAI front door through the official ``openai`` SDK (sync and async, streamed and not) on the tiny model.

The tiny model's weights are random, so its text is noise: what is checked is the protocol — the SDK parses every
response, streamed deltas concatenate byte for byte to the non-streamed content, usage comes from the server's own
token counts, finish_reason is honest, stop strings end the text as OpenAI's do.
"""

from __future__ import annotations

import asyncio

import openai
import pytest
import requests

from client import LLMClient, SamplingParams

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

CHAT = [{"role": "user", "content": "def fibonacci(n): 日本語 😀"}]


@pytest.fixture(scope="module")
def model_id(sdk) -> str:
    return sdk.models.list().data[0].id


def test_ready_line_and_models(front, sdk, model_id):
    assert front.ready_line == f"openai front door ready on http://127.0.0.1:{front.port} (model {model_id})"
    assert model_id == "tiny"  # the ensemble's served_model_name: the tokenizer dir's name when the profile has none
    card = sdk.models.retrieve(model_id)
    assert card.id == model_id and card.object == "model"
    assert requests.get(front.v1 + "/models").json()["data"][0]["max_model_len"] == 256  # tests/stack.py TEST_LIMITS


def test_chat_non_streamed(sdk, model_id, triton):
    done = sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=12)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-") and done.model == model_id
    choice = done.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    with LLMClient(triton.urls.grpc) as direct:  # the same greedy answer as the ensemble gives over gRPC
        expected = direct.chat(CHAT, SamplingParams(max_tokens=12))
    assert choice.message.content == expected.text
    assert done.usage.prompt_tokens == expected.num_input_tokens
    assert done.usage.completion_tokens == expected.num_output_tokens
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    if done.usage.completion_tokens == 12:
        assert choice.finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [1, 7, 40])
def test_chat_streamed_equals_non_streamed_bytes(sdk, model_id, max_tokens):
    whole = sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=max_tokens)
    chunks = list(sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=max_tokens, stream=True,
                                              stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.encode("utf-8") == whole.choices[0].message.content.encode("utf-8")
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-2].choices[0].finish_reason is not None  # finish_reason in the last choice chunk
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage  # then the usage chunk
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_and_no_usage_unless_asked(front, model_id):
    response = requests.post(front.v1 + "/chat/completions", stream=True, timeout=60, json={
        "model": model_id, "messages": CHAT, "max_tokens": 5, "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.iter_lines(decode_unicode=True) if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert '"usage":null' in events[-2]


def test_completions_streamed_and_not(sdk, model_id, triton):
    prompt = "def parse(line):"
    whole = sdk.completions.create(model=model_id, prompt=prompt, max_tokens=20)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    with LLMClient(triton.urls.grpc) as direct:
        assert whole.choices[0].text == direct.generate(prompt, SamplingParams(max_tokens=20)).text
    chunks = list(sdk.completions.create(model=model_id, prompt=prompt, max_tokens=20, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    default = sdk.completions.create(model=model_id, prompt=[prompt])  # OpenAI's default max_tokens: 16
    assert default.usage.completion_tokens <= 16


def test_stop_strings_end_the_text_before_them(sdk, model_id):
    whole = sdk.completions.create(model=model_id, prompt="x = [1, 2, 3]", max_tokens=40).choices[0].text
    cut = next((i for i in range(3, len(whole) - 2) if whole[i] != " "), None)
    if cut is None:
        pytest.skip(f"the tiny model's text is too short to cut: {whole!r}")
    stop = whole[cut:cut + 2]
    first = min(i for i in range(len(whole)) if whole.startswith(stop, i))
    for stream in (False, True):
        result = sdk.completions.create(model=model_id, prompt="x = [1, 2, 3]", max_tokens=40, stop=[stop, "\x00"],
                                        stream=stream)
        if stream:
            chunks = list(result)
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, reason = result.choices[0].text, result.choices[0].finish_reason
        assert (text, reason) == (whole[:first], "stop")


def test_sampling_parameters_are_honoured(sdk, model_id):
    def sample(seed):
        return sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=16, temperature=1.0, top_p=0.9,
                                           seed=seed).choices[0].message.content
    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3)}) > 1
    assert sample(-1) == sample(2**64 - 1)  # OpenAI's int64 seed, two's complement as the engine's uint64


def test_with_raw_response_headers(sdk, model_id):
    raw = sdk.chat.completions.with_raw_response.create(model=model_id, messages=CHAT, max_tokens=3)
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"
    assert raw.parse().choices[0].message.role == "assistant"
    with sdk.chat.completions.with_streaming_response.create(model=model_id, messages=CHAT, max_tokens=3,
                                                             stream=True) as streamed:
        assert streamed.headers["content-type"].startswith("text/event-stream")
        assert streamed.headers["cache-control"] == "no-cache"
        assert sum(1 for _ in streamed.parse()) >= 2


def test_async_sdk_concurrent_streams(front, sdk, model_id):
    expected = sdk.chat.completions.create(model=model_id, messages=CHAT, max_tokens=24).choices[0].message.content

    async def run():
        async with openai.AsyncOpenAI(base_url=front.v1, api_key="unused", max_retries=0) as client:
            async def one_stream():
                stream = await client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=24,
                                                              stream=True)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            async def one():
                done = await client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=24)
                return done.choices[0].message.content
            return await asyncio.gather(*[one_stream() for _ in range(6)], *[one() for _ in range(2)])

    assert asyncio.run(run()) == [expected] * 8


def test_health_and_metrics(front, model_id):
    assert requests.get(front.url + "/health/live").status_code == 200
    health = requests.get(front.url + "/health")
    assert health.status_code == 200 and health.json()["model"] == model_id
    text = requests.get(front.url + "/metrics").text
    assert 'openai_requests_total{route="/v1/chat/completions",status="200"}' in text
    assert 'openai_time_to_first_token_seconds_count{route="/v1/chat/completions"}' in text
    assert "openai_request_duration_seconds_bucket" in text and "openai_completion_tokens_total" in text
