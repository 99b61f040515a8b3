"""End to end through a real tritonserver: ensemble, hand-chained models, HTTP generate, streaming."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import requests
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from builders import triton_config as tc
from builders.triton_config import parse_pbtxt, to_pbtxt
from tests.triton_helpers import make_input, stream_request, text_inputs, texts

pytestmark = pytest.mark.both_layouts  # the CPU layout and the GPU layout with the tensorrt_llm stand-in

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n", "class Parser:\n    def __init__(self", "x = [1, 2, 3]"]
UNICODE_PROMPTS = ["# 你好，世界 — 日本語のテキスト", "emoji 👋🏽🎉 and café", "  leading  spaces\tand tabs"]


@pytest.fixture(scope="session")
def hf(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True, dtype=torch.float32).eval()
    return tokenizer, model


def hf_greedy(hf, prompt: str, max_new_tokens: int) -> list[int]:
    """The oracle: Hugging Face transformers' own greedy decode, stopping at EOS like our engine."""
    tokenizer, model = hf
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    new = out[0, ids.shape[1]:].tolist()
    return new[: new.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in new else new


def test_rendered_configs_parse_and_have_no_placeholders(model_repository):
    configs = sorted(model_repository.glob("*/config.pbtxt"))
    assert {c.parent.name for c in configs} == {"preprocessing", "llm", "ensemble"}
    for path in configs:
        text = path.read_text()
        assert "$" not in text, f"{path} has a template placeholder"
        cfg = parse_pbtxt(text)
        assert cfg.name == path.parent.name
        assert to_pbtxt(cfg) == text  # the file is exactly what the protobuf printer writes
    llm = parse_pbtxt((model_repository / "llm" / "config.pbtxt").read_text())
    assert llm.model_transaction_policy.decoupled
    pre = parse_pbtxt((model_repository / "preprocessing" / "config.pbtxt").read_text())
    assert not pre.HasField("dynamic_batching") and not llm.HasField("dynamic_batching")  # 500 ms stalls (B12)
    # The llm is the ensemble's last step: no model after it could reorder a stream's responses.
    ensemble = parse_pbtxt((model_repository / "ensemble" / "config.pbtxt").read_text())
    assert [step.model_name for step in ensemble.ensemble_scheduling.step] == ["preprocessing", "llm"]


def test_health_and_metadata(triton):
    http = triton.urls.http
    assert requests.get(f"{http}/v2/health/live").status_code == 200
    assert requests.get(f"{http}/v2/health/ready").status_code == 200
    for model in ("ensemble", "preprocessing", "llm"):
        assert requests.get(f"{http}/v2/models/{model}/ready").status_code == 200
    meta = requests.get(f"{http}/v2/models/ensemble").json()
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "messages", "max_tokens", "stream", "temperature",
                                                   "top_k", "top_p", "seed", "stop_words", "end_id", "pad_id",
                                                   "exclude_input_in_output", "repetition_penalty",
                                                   "presence_penalty", "frequency_penalty", "min_p",
                                                   "return_log_probs", "top_logprobs", "num_return_sequences",
                                                   "guided_decoding_guide_type", "guided_decoding_guide"}
    assert {o["name"] for o in meta["outputs"]} == {"text_output", "finish_reason", "num_input_tokens",
                                                    "num_output_tokens", "num_cached_tokens", "output_log_probs",
                                                    "cum_log_probs",
                                                    "output_token_bytes", "top_logprob_bytes", "top_logprob_values",
                                                    "sequence_index"}
    assert requests.get(triton.urls.metrics).status_code == 200


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_equal_hugging_face(triton, hf, prompt):
    tokenizer, _ = hf
    expected = hf_greedy(hf, prompt, 24)
    ids = tokenizer(prompt).input_ids
    inputs = [make_input("input_ids", [ids], np.int32), make_input("input_lengths", [[len(ids)]], np.int32),
              make_input("request_output_len", [[24]], np.int32),
              make_input("end_id", [[tokenizer.eos_token_id]], np.int32)]
    responses, error = stream_request(triton.urls.grpc, "llm", inputs)
    assert error is None, error
    (response,) = responses
    assert response["output_ids"][0, 0].tolist() == expected
    # Through the whole ensemble, the text is the oracle's tokens decoded by the HF tokenizer.
    responses, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, 24))
    assert error is None, error
    assert texts(responses) == [tokenizer.decode(expected, skip_special_tokens=True).encode()]
    assert int(responses[0]["num_output_tokens"].reshape(-1)[0]) == len(expected)
    assert int(responses[0]["num_input_tokens"].reshape(-1)[0]) == len(ids)


def test_llm_sends_only_the_outputs_a_request_asks_for(triton, hf):
    """The contract the ensemble relies on: only the requested outputs arrive, all of them when none is named, the
    log-prob outputs only to a request that asked for log-probs (as tensorrtllm_backend).
    (The llm must also *build* only those: Triton 2.51 corrupted its heap under load when a decoupled Python
    model's responses carried unrequested outputs, docs/reliability.md B9; the soak test is what catches that.)"""
    tokenizer, _ = hf
    ids = tokenizer("def f(x):").input_ids
    inputs = [make_input("input_ids", [ids], np.int32), make_input("input_lengths", [[len(ids)]], np.int32),
              make_input("request_output_len", [[6]], np.int32)]
    logprobs = {"output_log_probs", "cum_log_probs", "output_token_bytes", "top_logprob_bytes", "top_logprob_values"}
    with_logprobs, error = stream_request(triton.urls.grpc, "llm",
                                          inputs + [make_input("return_log_probs", [[True]], bool)])
    assert error is None, error
    assert set(with_logprobs[0]) == {t.name for t in tc.LLM_OUTPUTS}
    everything, error = stream_request(triton.urls.grpc, "llm", inputs)
    assert error is None, error
    assert set(everything[0]) == {t.name for t in tc.LLM_OUTPUTS} - logprobs
    assert everything[0]["output_ids"].tolist() == with_logprobs[0]["output_ids"].tolist()
    only_ids, error = stream_request(triton.urls.grpc, "llm", inputs, outputs=["output_ids"])
    assert error is None, error
    assert set(only_ids[0]) == {"output_ids"}
    assert only_ids[0]["output_ids"].tolist() == everything[0]["output_ids"].tolist()


def test_ensemble_equals_hand_chained_models(triton, hf):
    tokenizer, _ = hf
    prompt, max_tokens = "def parse(line):", 20
    http = triton.urls.http
    pre = requests.post(f"{http}/v2/models/preprocessing/infer", json={"inputs": [
        {"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": [prompt]},
        {"name": "max_tokens", "shape": [1, 1], "datatype": "INT32", "data": [max_tokens]}]})
    assert pre.status_code == 200, pre.text
    pre_out = {o["name"]: o for o in pre.json()["outputs"]}
    dtypes = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": bool, "BYTES": object}
    llm_inputs = [make_input(name, np.array([d.encode() if isinstance(d, str) else d for d in o["data"]],
                                            dtype=dtypes[o["datatype"]]).reshape(o["shape"]))
                  for name, o in pre_out.items()]
    responses, error = stream_request(triton.urls.grpc, "llm", llm_inputs)
    assert error is None, error
    (llm_out,) = responses
    ids = llm_out["output_ids"][0, 0, : int(llm_out["sequence_length"].reshape(-1)[0])].tolist()
    # The llm's text is its tokens as the Hugging Face tokenizer decodes them.
    assert llm_out["text_output"].reshape(-1)[0] == tokenizer.decode(ids, skip_special_tokens=True).encode()
    responses, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, max_tokens))
    assert error is None, error
    assert texts(responses) == [llm_out["text_output"].reshape(-1)[0]]
    for name in ("finish_reason", "num_input_tokens", "num_output_tokens"):
        assert responses[0][name].reshape(-1)[0] == llm_out[name].reshape(-1)[0], name


@pytest.mark.parametrize("prompt", PROMPTS[:2] + UNICODE_PROMPTS)
@pytest.mark.parametrize("exclude_input", [True, False])
def test_streamed_text_equals_non_streamed_bytes(triton, prompt, exclude_input):
    kwargs = dict(exclude_input_in_output=exclude_input, temperature=0.9, top_k=40, seed=7)
    whole, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, 48, stream=False, **kwargs))
    assert error is None, error
    chunks, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, 48, stream=True, **kwargs))
    assert error is None, error
    assert len(whole) == 1 and len(chunks) > 1
    streamed = b"".join(texts(chunks))
    assert streamed == texts(whole)[0]
    for chunk in texts(chunks):
        chunk.decode("utf-8")  # every chunk is whole UTF-8 on its own
    if not exclude_input:
        assert streamed.startswith(prompt.encode())
        assert "\ufffd" not in streamed[: len(prompt.encode())].decode()
    final = chunks[-1]
    assert final["finish_reason"].reshape(-1)[0] in (b"length", b"stop")
    assert all(c["finish_reason"].reshape(-1)[0] == b"" for c in chunks[:-1])



@pytest.mark.parametrize("stream", [True, False])
def test_end_id_ends_the_answer_streamed_and_not(triton, hf, stream):
    """Hitting end_id: the answer stops before it with finish_reason "stop". In the GPU layout the backend's last
    response then carries no token at all (end_id is not output), which the llm wrapper once failed to reshape —
    every chat answer that ended its turn came back with an error after its text."""
    tokenizer, _ = hf
    prompt = PROMPTS[0]
    free = hf_greedy(hf, prompt, 8)
    assert len(free) == 8, free
    cut = next(i for i in range(2, 8) if free[i] not in free[:i])  # its first occurrence ends the answer
    responses, error = stream_request(triton.urls.grpc, "ensemble",
                                      text_inputs(prompt, 8, end_id=free[cut], stream=stream))
    assert error is None, error
    assert b"".join(texts(responses)) == tokenizer.decode(free[:cut]).encode()
    assert responses[-1]["finish_reason"].reshape(-1)[0] == b"stop"
    assert responses[-1]["num_output_tokens"].reshape(-1)[0] == cut

def test_http_generate_and_generate_stream_agree(triton):
    body = {"text_input": "for i in range(", "max_tokens": 32, "temperature": 0.8, "seed": 4}
    whole = requests.post(f"{triton.urls.http}/v2/models/ensemble/generate", json=body)
    assert whole.status_code == 200, whole.text
    stream = requests.post(f"{triton.urls.http}/v2/models/ensemble/generate_stream", json={**body, "stream": True})
    assert stream.status_code == 200, stream.text
    events = [json.loads(line[len("data: "):]) for line in stream.text.splitlines() if line.startswith("data: ")]
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == whole.json()["text_output"]
    assert events[-1]["num_output_tokens"] == whole.json()["num_output_tokens"] > 0


def test_seed_reproduces_sampling(triton):
    def sample(seed):
        responses, error = stream_request(triton.urls.grpc, "ensemble",
                                          text_inputs("def main():", 32, temperature=1.0, top_p=0.95, seed=seed))
        assert error is None, error
        return texts(responses)[0]

    assert sample(11) == sample(11)
    assert len({sample(s) for s in (1, 2, 3)}) > 1


def test_stop_words_end_generation(triton, hf):
    tokenizer, _ = hf
    free, _ = stream_request(triton.urls.grpc, "ensemble", text_inputs("x = 1\n", 48, exclude_input_in_output=True))
    text = texts(free)[0].decode()
    # A readable stretch of the free-running output (the tiny test model is untrained), mid-text.
    match = re.search(r"[A-Za-z]{3,}", text[3:])
    assert match, text
    stop = match.group(0)[1:]  # starts inside a token: matching is on text, not token boundaries
    stopped, error = stream_request(triton.urls.grpc, "ensemble",
                                    text_inputs("x = 1\n", 48, stop_words=[stop]))
    assert error is None, error
    out = texts(stopped)[0].decode()
    assert stop in out and len(out) < len(text) + 1, (text, stop, out)
    assert stopped[0]["finish_reason"].reshape(-1)[0] == b"stop", (text, stop, out)
