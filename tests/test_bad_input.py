"""Bad requests get INVALID_ARG (HTTP 400) with a message a person understands, and the server stays up."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from tests.triton_helpers import make_input, stream_request, text_inputs

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

CASES = [
    ({"text_input": "", "max_tokens": 8}, "text_input is empty"),
    ({"text_input": "x = 1 " * 400, "max_tokens": 8}, "at most 192 input tokens"),
    ({"text_input": "def f():", "max_tokens": 0}, "max_tokens must be between 1 and"),
    ({"text_input": "def f():", "max_tokens": -5}, "max_tokens must be between 1 and"),
    ({"text_input": "def f():", "max_tokens": 100000}, "max_tokens must be between 1 and"),
    ({"text_input": "def f():", "max_tokens": 8, "temperature": -0.5}, "temperature must be a finite number >= 0"),
    ({"text_input": "def f():", "max_tokens": 8, "top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"text_input": "def f():", "max_tokens": 8, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"text_input": "def f():", "max_tokens": 8, "top_k": -1}, "top_k must be >= 0"),
    ({"text_input": "def f():", "max_tokens": 8, "min_tokens": 9}, "min_tokens must be between 0 and max_tokens"),
    ({"text_input": "def f():"}, "max_tokens"),
    ({"text_input": "def f():", "max_tokens": 8, "repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
    ({"text_input": "def f():", "max_tokens": 8, "min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"text_input": "def f():", "max_tokens": 8, "top_logprobs": 21}, "top_logprobs must be between 0 and 20"),
    ({"text_input": "def f():", "max_tokens": 8, "num_return_sequences": 9},
     "num_return_sequences must be between 1 and 8"),
    ({"text_input": "def f():", "max_tokens": 8, "guided_decoding_guide_type": "yaml"},
     "guided_decoding_guide_type must be one of"),
    ({"text_input": "def f():", "max_tokens": 8, "guided_decoding_guide_type": "regex"},
     "needs the regex in guided_decoding_guide"),
    ({"text_input": "def f():", "max_tokens": 8, "guided_decoding_guide": "[a-z]+"},
     "without guided_decoding_guide_type"),
]


def assert_alive(triton):
    assert requests.get(f"{triton.urls.http}/v2/health/ready", timeout=5).status_code == 200
    ok = requests.post(f"{triton.urls.http}/v2/models/ensemble/generate",
                       json={"text_input": "def f():", "max_tokens": 4}, timeout=60)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("body,message", CASES, ids=[m for _, m in CASES])
def test_http_generate_rejects_with_400_and_a_clear_message(triton, body, message):
    response = requests.post(f"{triton.urls.http}/v2/models/ensemble/generate", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]
    assert_alive(triton)


@pytest.mark.parametrize("body,message", CASES[:9], ids=[m for _, m in CASES[:9]])
def test_grpc_stream_reports_the_same_message(triton, body, message):
    optional = {k: v for k, v in body.items() if k not in ("text_input", "max_tokens")}
    responses, error = stream_request(triton.urls.grpc, "ensemble",
                                      text_inputs(body["text_input"], body["max_tokens"], stream=True, **optional))
    assert error is not None and message in str(error)
    assert responses == []


def test_batch_of_two_prompts_is_refused(triton):
    inputs = [make_input("text_input", [[b"a"], [b"b"]], object), make_input("max_tokens", [[4], [4]], np.int32)]
    _, error = stream_request(triton.urls.grpc, "ensemble", inputs)
    assert error is not None and "send one prompt per request" in str(error)


def test_llm_model_rejects_out_of_vocabulary_ids(triton):
    inputs = [make_input("input_ids", [[1, 99999]], np.int32), make_input("input_lengths", [[2]], np.int32),
              make_input("request_output_len", [[4]], np.int32)]
    _, error = stream_request(triton.urls.grpc, "llm", inputs)
    assert error is not None and "input_ids must be token ids in [0, 512)" in str(error)
    assert_alive(triton)


def test_unknown_model_is_not_found(triton):
    response = requests.post(f"{triton.urls.http}/v2/models/nope/generate", json={"text_input": "a"}, timeout=10)
    assert response.status_code in (400, 404)
    assert "nope" in response.json()["error"]
