"""The tiny random checkpoint the suite runs on: reproducible, and shaped like the default model's tokenizer."""

from __future__ import annotations

import json

from builders.tiny_model import ModelSpec, build_random_model


def _files(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = build_random_model(tmp_path / "a", seed=3)
    b = build_random_model(tmp_path / "b", seed=3)
    c = build_random_model(tmp_path / "c", seed=4)
    assert _files(a) == _files(b)
    assert _files(a)["model.safetensors"] != _files(c)["model.safetensors"]
    info = json.loads((a / "build_info.json").read_text())
    assert info["seed"] == 3 and info["spec"] == ModelSpec.tiny().to_dict()


def test_tokenizer_has_chatml_control_tokens_and_template(tiny_checkpoint):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token_id == 2 and tok("x = 1").input_ids[0] != 1  # no BOS added, like SmolLM2
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    assert ids.count(1) == 2 and ids.count(2) == 1  # two turns opened, one closed: the assistant's is open
    text = "déjà vu 🙂 <|im_end|>"
    assert tok.decode(tok(text, split_special_tokens=True).input_ids) == text


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path):
    import pytest

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError):
        build_random_model(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
