"""Issue 17's request controls end to end through a real tritonserver, on both layouts (the CPU engine, and the GPU
layout's llm wrapper over the tensorrt_llm stand-in): penalties, log-probs (checked against Hugging Face's
teacher-forced forward of the same checkpoint), several sequences, guided decoding, and each bad value's INVALID_ARG.
Differences between the layouts are pinned here (docs/gpu.md): min_p and top_logprobs are refused by the GPU layout,
because tensorrt_llm has no min_p input and returns no alternatives."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.triton_helpers import make_input, stream_request, text_inputs, texts

pytestmark = pytest.mark.both_layouts

REPETITIVE = "the cat the cat the cat the cat"


@pytest.fixture(scope="module")
def hf(tiny_checkpoint):
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_checkpoint, local_files_only=True, dtype=torch.float32).eval()
    return tokenizer, model


LOGPROB_OUTPUTS = ("output_log_probs", "cum_log_probs", "output_token_bytes", "top_logprob_bytes", "top_logprob_values")


def ensemble(triton, prompt, max_tokens, **controls):
    responses, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, max_tokens, **controls))
    assert error is None, error
    return responses


def refused(triton, prompt="hi", max_tokens=4, **controls) -> str:
    responses, error = stream_request(triton.urls.grpc, "ensemble", text_inputs(prompt, max_tokens, **controls))
    assert error is not None and not responses, responses
    return str(error)


def text(responses, index=0) -> bytes:
    return b"".join(t for r, t in zip(responses, texts(responses)) if int(r["sequence_index"].reshape(-1)[0]) == index)


def test_penalties_change_a_repetitive_answer_and_both_layouts_agree(triton):
    plain = text(ensemble(triton, REPETITIVE, 24))
    penalised = {name: text(ensemble(triton, REPETITIVE, 24, **{name: value}))
                 for name, value in (("repetition_penalty", 1.8), ("presence_penalty", 1.5),
                                     ("frequency_penalty", 1.5))}
    assert all(answer != plain for answer in penalised.values()), penalised
    # The neutral values are the defaults: sending them changes nothing.
    assert text(ensemble(triton, REPETITIVE, 24, repetition_penalty=1.0, presence_penalty=0.0,
                         frequency_penalty=0.0)) == plain


def llm_direct(triton, ids, max_tokens, streaming, **controls):
    types = {"return_log_probs": bool, "top_logprobs": np.int32}
    inputs = [make_input("input_ids", [ids], np.int32), make_input("input_lengths", [[len(ids)]], np.int32),
              make_input("request_output_len", [[max_tokens]], np.int32),
              make_input("streaming", [[streaming]], bool)]
    bias = controls.pop("embedding_bias", None)
    inputs += [make_input(name, [[value]], types[name]) for name, value in controls.items()]
    if bias is not None:
        inputs.append(make_input("embedding_bias", [bias], np.float32))
    responses, error = stream_request(triton.urls.grpc, "llm", inputs)
    assert error is None, error
    return responses


def test_log_probs_match_a_teacher_forced_forward(triton, hf):
    tokenizer, model = hf
    prompt = tokenizer("def parse(line):", split_special_tokens=True).input_ids
    k = 3 if triton.layout == "cpu" else 0  # the GPU layout returns no alternatives (refused below)
    results = {}
    for streaming in (False, True):
        responses = llm_direct(triton, prompt, 12, streaming, return_log_probs=True, top_logprobs=k)
        ids = [int(i) for r in responses for i in r["output_ids"].reshape(-1)]
        logprobs = np.concatenate([r["output_log_probs"].reshape(-1) for r in responses])
        top = [r["top_logprob_values"].reshape(-1, k) for r in responses] if k else []
        results[streaming] = ids, logprobs, top
        assert len(logprobs) == len(ids) > 0
        assert responses[-1]["cum_log_probs"].reshape(-1)[0] == pytest.approx(logprobs.sum(), abs=1e-3)
    ids, logprobs, top = results[False]
    assert results[True][0] == ids and np.allclose(results[True][1], logprobs, atol=1e-5)
    with torch.no_grad():  # the oracle: transformers, fp32, the whole sequence at once
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
    expected = torch.log_softmax(logits.double(), -1)
    assert np.allclose(logprobs, expected[torch.arange(len(ids)), ids].numpy(), atol=1e-3)
    if k:
        alternatives = np.concatenate(top)
        assert np.allclose(alternatives, expected.topk(k).values.numpy(), atol=1e-3)
        assert np.allclose(alternatives[:, 0], logprobs, atol=1e-5)  # greedy: the chosen token is the best


def test_log_prob_outputs_follow_the_text_through_the_ensemble(triton):
    k = 2 if triton.layout == "cpu" else 0
    for stream in (False, True):
        responses = ensemble(triton, "Hello, world", 16, return_log_probs=True, top_logprobs=k, stream=stream)
        token_bytes = b"".join(b for r in responses for b in r["output_token_bytes"].reshape(-1))
        # The tokens' bytes are the text (the tiny random model makes invalid UTF-8: the text has U+FFFD there).
        assert token_bytes.decode("utf-8", "replace").encode() == b"".join(texts(responses))
        for r in responses:
            n = r["output_token_bytes"].size
            assert r["output_log_probs"].size == n and r["top_logprob_values"].shape[-2:] == (n, k)
    # Not asked for log-probs: left out, as tensorrtllm_backend leaves them out when its executor returns none, also
    # for a client that names them among the outputs it wants.
    for outputs in (None, ["text_output", "num_output_tokens", *LOGPROB_OUTPUTS]):
        plain, error = stream_request(triton.urls.grpc, "ensemble", text_inputs("Hello, world", 16), outputs=outputs)
        assert error is None and plain, error
        assert not any(name in r for r in plain for name in LOGPROB_OUTPUTS)
        assert all("text_output" in r and "num_output_tokens" in r for r in plain)


@pytest.mark.parametrize("stream", [False, True])
def test_several_sequences_per_request(triton, stream):
    sampled = ensemble(triton, "Once upon a time", 10, num_return_sequences=3, temperature=1.0, top_k=0, seed=5,
                       stream=stream)
    indices = [int(r["sequence_index"].reshape(-1)[0]) for r in sampled]
    assert sorted(set(indices)) == [0, 1, 2]
    finals = [r for r in sampled if r["finish_reason"].reshape(-1)[0]]
    assert sorted(int(r["sequence_index"].reshape(-1)[0]) for r in finals) == [0, 1, 2]  # each ends once
    answers = [text(sampled, i) for i in range(3)]
    assert len(set(answers)) > 1, answers  # sampled independently
    greedy = ensemble(triton, "Once upon a time", 10, num_return_sequences=3, stream=stream)
    assert len({text(greedy, i) for i in range(3)}) == 1  # greedy: the same answer three times
    assert text(greedy, 0) == text(ensemble(triton, "Once upon a time", 10, stream=stream))


SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}, "ok": {"type": "boolean"}},
          "required": ["colour", "ok"], "additionalProperties": False}


def test_guided_decoding(triton):
    for seed in range(3):
        answer = text(ensemble(triton, "Answer:", 40, guided_decoding_guide_type="json_schema",
                               guided_decoding_guide=json.dumps(SCHEMA), temperature=1.0, top_k=0, seed=seed))
        jsonschema.validate(json.loads(answer), SCHEMA)
    # Refused by name, before any token, on both layouts (the GPU wrapper checks before tensorrt_llm compiles it).
    assert "uniqueItems" in refused(triton, guided_decoding_guide_type="json_schema",
                                    guided_decoding_guide=json.dumps({"type": "array", "uniqueItems": True}))
    assert "regex" in refused(triton, guided_decoding_guide_type="regex", guided_decoding_guide="(unclosed")


def test_min_p_on_both_layouts_and_top_logprobs_only_on_the_cpu_one(triton):
    """The GPU layout passes min_p to TensorRT-LLM's SamplingConfig; its executor returns no alternatives."""
    assert text(ensemble(triton, "Hello", 8, min_p=0.2, temperature=1.0, top_k=0, seed=1))
    if triton.layout != "cpu":
        assert "top_logprobs is not supported" in refused(triton, top_logprobs=2)


def test_a_penalty_that_is_not_a_number_is_refused(triton):
    """The rest of the bad values are in tests/test_bad_input.py's catalogue (HTTP and gRPC); NaN has no JSON."""
    assert "presence_penalty must be a finite number" in refused(triton, presence_penalty=float("nan"))


def test_embedding_bias_forces_and_bans_tokens(triton, hf):
    """TensorRT-LLM's embedding_bias (one value per vocabulary entry) into the llm: the CPU engine adds it to the
    logits, the GPU layout hands it to the executor. The oracle: transformers' logits of the prompt. Through the
    ensemble it is OpenAI's logit_bias by token id (preprocessing makes the row): the same text."""
    tokenizer, model = hf
    prompt = "def parse(line):"
    ids = tokenizer(prompt, split_special_tokens=True).input_ids
    with torch.no_grad():
        ranked = model(torch.tensor([ids])).logits[0, -1].argsort(descending=True).tolist()
    vocab = model.config.vocab_size

    def row(**bias):
        values = np.zeros(vocab, dtype=np.float32)
        for token, value in bias.values():
            values[token] += value
        return values

    def ids_and_text(responses):
        return ([int(i) for r in responses for i in r["output_ids"].reshape(-1)], b"".join(texts(responses)))

    forced = ranked[-1]  # the least likely token, every step
    out, forced_text = ids_and_text(llm_direct(triton, ids, 5, False, embedding_bias=row(f=(forced, 1e4))))
    assert out == [forced] * 5
    assert text(ensemble(triton, prompt, 5, embedding_bias_token_ids=[forced], embedding_bias_weights=[1e4])) \
        == forced_text
    out, banned_text = ids_and_text(llm_direct(triton, ids, 1, True, embedding_bias=row(b=(ranked[0], -120.0))))
    assert out == [ranked[1]]  # the greedy choice banned: the runner-up
    # A repeated id adds up (-60 + -60), as tensorrtllm_backend's preprocessing adds repeated words' weights.
    assert text(ensemble(triton, prompt, 1, embedding_bias_token_ids=[ranked[0], ranked[0]],
                         embedding_bias_weights=[-60.0, -60.0])) == banned_text

    assert "same length" in refused(triton, embedding_bias_token_ids=[1, 2], embedding_bias_weights=[1.0])
    assert "go together" in refused(triton, embedding_bias_token_ids=[1])
    assert f"token ids in [0, {vocab})" in refused(triton, embedding_bias_token_ids=[vocab],
                                                   embedding_bias_weights=[1.0])
    assert "finite" in refused(triton, embedding_bias_token_ids=[1], embedding_bias_weights=[float("inf")])
    short, error = stream_request(triton.urls.grpc, "llm", [
        make_input("input_ids", [ids], np.int32), make_input("request_output_len", [[1]], np.int32),
        make_input("embedding_bias", [[1.0, 2.0]], np.float32)])
    assert error is not None and f"one value per vocabulary entry ({vocab})" in str(error), (short, error)


def test_end_id_minus_one_means_none_and_other_bad_ids_are_refused(triton):
    """-1 is TensorRT-LLM's "no end id"; an id outside the vocabulary is refused before it reaches the engine (with a
    guide, xgrammar would otherwise fail on the engine's thread)."""
    assert text(ensemble(triton, "Hello", 6, end_id=-1, guided_decoding_guide_type="json")) is not None
    assert "end_id must be a token id" in refused(triton, end_id=10**6, guided_decoding_guide_type="json")
