"""A stream's responses are spaced by the ``llm``'s ``stream_interval_ms`` (builders/profile.py; the suite's profiles
keep the default): its first token and its end go at once, the tokens in between wait until the interval since the
stream's last response has passed, so one response carries several tokens and none is lost or reordered.

Checked on the tiny model's long streams (tests/conftest.py ``long_triton``: hundreds of tokens over seconds, each
step far shorter than the interval), on both layouts: the responses counted against the bound that spacing implies,
the streamed text against the same request not streamed.
"""

from __future__ import annotations

import time

import pytest

from builders.profile import LLMStage
from tests.triton_helpers import stream_request, text_inputs, texts

pytestmark = pytest.mark.both_layouts

INTERVAL_S = LLMStage.model_fields["stream_interval_ms"].default / 1e3
TOKENS = 600


def _stream(url: str, stream: bool):
    start = time.monotonic()
    responses, error = stream_request(url, "ensemble", text_inputs("def fibonacci(n):", TOKENS, stream=stream,
                                                                   min_tokens=TOKENS))
    assert error is None, error
    return responses, time.monotonic() - start


def test_responses_are_spaced_by_the_stream_interval_and_carry_every_token(long_triton):
    assert INTERVAL_S > 0, "the default profile holds a stream's tokens: this test checks that it does"
    chunks, wall = _stream(long_triton.urls.grpc, stream=True)
    (whole,), _ = _stream(long_triton.urls.grpc, stream=False)
    # Every response but the last left at least INTERVAL_S after the one before it, all within the request's wall
    # time; one response per step would be ~TOKENS responses.
    assert 2 <= len(chunks) <= 2 + wall / INTERVAL_S, (len(chunks), wall)
    assert b"".join(texts(chunks)) == texts([whole])[0]
    counts = [int(c["num_output_tokens"].reshape(-1)[0]) for c in chunks]
    assert counts == sorted(counts) and counts[-1] == TOKENS
    assert [c["finish_reason"].reshape(-1)[0] for c in chunks][-1] == b"length"
