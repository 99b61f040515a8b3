"""Issue 14's "Done when" on the real default model (SmolLM2-135M-Instruct): the official SDK's chat call names
Paris, and the same streamed arrives chunk by chunk and equals the non-streamed answer."""

from __future__ import annotations

import openai
import pytest

from tests.openai_front import FrontDoorProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def front(real_triton):
    door = FrontDoorProcess(real_triton.urls.grpc, extra_args=("--served-model-name", "SmolLM2-135M-Instruct"))
    yield door
    assert door.stop() == 0, "".join(door.output)


def test_chat_names_paris_streamed_and_not(front):
    with openai.OpenAI(base_url=front.v1, api_key="x", max_retries=0) as sdk:
        model = sdk.models.list().data[0].id
        assert model == "SmolLM2-135M-Instruct"
        answer = sdk.chat.completions.create(model=model, messages=QUESTION).choices[0].message.content
        assert "Paris" in answer
        chunks = [c.choices[0].delta.content for c in sdk.chat.completions.create(model=model, messages=QUESTION,
                                                                                   stream=True)
                  if c.choices and c.choices[0].delta.content]
    # Streamed: the first token at once, the rest at most every stream_interval_ms (builders/profile.py).
    assert len(chunks) >= 2 and "".join(chunks) == answer
