"""The real default model (SmolLM2-135M-Instruct) end to end: what the server answers greedily is what Hugging Face
transformers' own ``generate`` answers from the same checkpoint — for a raw completion and for a chat turn."""

from __future__ import annotations

import json

import pytest
import requests
import torch

PROMPTS = ["The capital of France is", "Water boils at a temperature of"]
QUESTIONS = ["What is the capital of France?", "Name three primary colours."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hf(real_checkpoint):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(real_checkpoint, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(real_checkpoint, local_files_only=True, dtype=torch.float32).eval()
    return tokenizer, model


def hf_greedy_text(hf, ids: list[int]) -> tuple[str, str]:
    """The oracle's greedy continuation (stopping at the end of turn like the server) and its finish reason."""
    tokenizer, model = hf
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    new = out[0, len(ids):].tolist()
    reason = "stop" if tokenizer.eos_token_id in new else "length"
    new = new[: new.index(tokenizer.eos_token_id)] if reason == "stop" else new
    return tokenizer.decode(new, clean_up_tokenization_spaces=False), reason


def generate(real_triton, body: dict) -> dict:
    r = requests.post(f"{real_triton.urls.http}/v2/models/ensemble/generate", json={**body, "max_tokens": MAX_TOKENS},
                      timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_equals_transformers_generate(real_triton, hf, prompt):
    expected, reason = hf_greedy_text(hf, hf[0](prompt).input_ids)
    answer = generate(real_triton, {"text_input": prompt})
    assert (answer["text_output"], answer["finish_reason"]) == (expected, reason)


@pytest.mark.parametrize("question", QUESTIONS)
def test_chat_turn_equals_transformers_generate(real_triton, hf, question):
    messages = [{"role": "user", "content": question}]
    ids = hf[0].apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected, reason = hf_greedy_text(hf, ids)
    answer = generate(real_triton, {"messages": json.dumps(messages)})
    assert (answer["text_output"], answer["finish_reason"]) == (expected, reason)
    assert answer["num_input_tokens"] == len(ids)
    if question.startswith("What is the capital of France"):
        assert "Paris" in answer["text_output"]
