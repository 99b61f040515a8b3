"""Prefix caching through the whole stack: the official ``openai`` SDK's usage, the gRPC client, the metrics.

Both layouts: the CPU engine reports its own cached tokens; the GPU layout's llm reads them from the executor's
per-request perf metrics (reused blocks × tokens_per_block), which the tensorrt_llm stand-in fills from the same
CPU engine. Exactness against Hugging Face is tests/test_prefix_cache.py's job; here a repeated request must give
the same greedy answer whatever part of its prompt was cached.
"""

from __future__ import annotations

import re
import uuid

import pytest
import requests

from client import LLMClient, SamplingParams
from tests.triton_helpers import wait_for

pytestmark = pytest.mark.both_layouts

BLOCK = 32  # the engines' tokens_per_block


def system_prompt() -> str:
    """About 150 tokens in the tiny model's vocabulary, unique to the call so no earlier test cached it."""
    return f"[{uuid.uuid4().hex}] " + "You answer questions about Python modules, briefly and kindly. " * 3


def metric(text: str, name: str, label: str = "") -> float:
    return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*{label}[^}}]*}} (\S+)$", text, re.M))


def test_a_shared_system_prompt_is_reported_cached_and_changes_no_answer(sdk, front, triton, layout):
    system = system_prompt()
    chat = lambda question: [{"role": "system", "content": system}, {"role": "user", "content": question}]  # noqa: E731
    before = requests.get(triton.urls.metrics).text

    first = sdk.chat.completions.create(model="tiny", messages=chat("What is os?"), max_tokens=8)
    second = sdk.chat.completions.create(model="tiny", messages=chat("What is re?"), max_tokens=8)
    again = sdk.chat.completions.create(model="tiny", messages=chat("What is re?"), max_tokens=8)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    shared = second.usage.prompt_tokens_details.cached_tokens
    # The system prompt's whole blocks: at least 2 of the ~4 it spans, never the question's tokens.
    assert shared % BLOCK == 0 and 2 * BLOCK <= shared < second.usage.prompt_tokens - 3
    # Asked again: every whole block but the one with the last prompt token, whose logits pick the first token.
    assert again.usage.prompt_tokens_details.cached_tokens == (again.usage.prompt_tokens - 1) // BLOCK * BLOCK
    assert again.choices[0].message.content == second.choices[0].message.content

    streamed = list(sdk.chat.completions.create(model="tiny", messages=chat("What is re?"), max_tokens=8, stream=True,
                                                stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens_details.cached_tokens
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == again.choices[0].message.content

    response = sdk.responses.create(model="tiny", instructions=system, input="What is re?", max_output_tokens=8)
    assert response.usage.input_tokens_details.cached_tokens >= shared

    with LLMClient(triton.urls.grpc) as client:  # the gRPC client sees the same count
        direct = client.chat(chat("What is re?"), SamplingParams(max_tokens=8))
    assert direct.num_cached_tokens == again.usage.prompt_tokens_details.cached_tokens
    assert direct.text == again.choices[0].message.content

    after = requests.get(triton.urls.metrics).text
    hits = metric(after, "llm_prefix_cache_hit_tokens_total") - metric(before, "llm_prefix_cache_hit_tokens_total")
    assert hits >= shared + 2 * again.usage.prompt_tokens_details.cached_tokens
    if layout == "cpu":
        assert metric(after, "llm_engine_kv_cache_capacity_tokens") > 0
        assert metric(after, "llm_engine_kv_cache_cached_tokens") >= shared
    else:  # TensorRT-LLM's own gauge of reused blocks, set from iteration stats every 100 ms as the backend does
        reused = lambda text: metric(text, "nv_trt_llm_kv_cache_block_metrics", 'kv_cache_block_type="reused"')  # noqa: E731
        wait_for(lambda: reused(requests.get(triton.urls.metrics).text) > reused(before), timeout=5,
                 what="the reused-blocks gauge to count the reuse")
