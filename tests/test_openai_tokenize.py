"""The front door's /tokenize and /detokenize (vLLM's request and response shapes), answered by the served model's own
preprocessing: the ids are the ones the model gets. The oracle: transformers' tokenizer of the same checkpoint."""

from __future__ import annotations

import pytest
import requests
from transformers import AutoTokenizer

MODEL = "tiny"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi </s> 日本語 😀"}]


@pytest.fixture(scope="module")
def hf(tiny_checkpoint):
    return AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)


def post(front, path: str, **body) -> requests.Response:
    return requests.post(f"{front.url}{path}", json=body, timeout=30)


def test_a_prompt_and_a_chat_give_the_ids_the_model_gets(front, hf, triton):
    answer = post(front, "/tokenize", model=MODEL, prompt="def parse(line): </s> 日本語").json()
    expected = hf("def parse(line): </s> 日本語", split_special_tokens=True).input_ids  # text is never a control token
    assert answer == {"count": len(expected), "max_model_len": 256, "tokens": expected, "token_strs": None}
    chat = post(front, "/tokenize", messages=CHAT).json()  # model may be left out, as vLLM allows
    assert chat["tokens"] == hf.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    # The count is what chat completions report as prompt_tokens.
    usage = requests.post(f"{front.v1}/chat/completions", timeout=60,
                          json={"model": MODEL, "messages": CHAT, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == chat["count"]


def test_detokenize_inverts_tokenize(front, hf):
    text = "Hello 日本語 😀 </s>"
    ids = post(front, "/tokenize", prompt=text).json()["tokens"]
    answer = post(front, "/detokenize", model=MODEL, tokens=ids).json()
    assert answer == {"prompt": hf.decode(ids)}
    assert post(front, "/detokenize", tokens=[]).json() == {"prompt": ""}


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}, 400, "exactly one of"),
    ("/tokenize", {}, 400, "exactly one of"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": False}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "a" * 4000}, 400, "maximum context length"),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404, "does not exist"),
    ("/tokenize", {"messages": [{"role": "tool", "content": "x"}]}, 400, "tool_call_id"),
    ("/detokenize", {"tokens": [10**6]}, 400, "not a token id"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
])
def test_bad_requests_get_openai_errors(front, path, body, status, fragment):
    answer = post(front, path, **body)
    assert answer.status_code == status and fragment in answer.json()["error"]["message"], answer.text
