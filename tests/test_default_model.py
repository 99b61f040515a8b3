"""Fast tests of builders.default_model (tiny specs only; the whole file runs in well under a minute)."""

from __future__ import annotations

import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch

from builders.default_model import (
    ModelSpec,
    build_default_model,
    build_model,
    build_random_model,
    corpus_files,
    is_complete_checkpoint,
    read_build_info,
    train_tokenizer,
)

SAMPLES = [
    "héllo 世界 👋🏽 \t\n  spaces",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "   leading and trailing   ",
    "\r\n\t\x00\x7f\u00a0\u200b",
    "日本語のテキスト、한국어, Ελληνικά, العربية, עברית",
    "👩‍👩‍👧‍👦 🏳️‍🌈 e\u0301 \U0010ffff",
    "",
    " ",
    "\n\n\n",
]


def _random_unicode(rng: random.Random, n: int) -> str:
    out = []
    while len(out) < n:
        cp = rng.choice([rng.randrange(0x20, 0x80), rng.randrange(0x80, 0x800), rng.randrange(0x800, 0x10000),
                         rng.randrange(0x10000, 0x110000), rng.choice([0x9, 0xA, 0xD, 0x20])])
        if 0xD800 <= cp <= 0xDFFF:  # surrogates are not encodable as UTF-8
            continue
        out.append(chr(cp))
    return "".join(out)


@pytest.fixture(scope="module")
def split():
    return corpus_files()


@pytest.fixture(scope="module")
def tokenizer(split, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    tok = train_tokenizer(split.train, 512, out, max_chars=200_000)
    return tok, out


def test_corpus_split_is_deterministic_and_disjoint(split):
    again = corpus_files()
    assert split == again
    assert split.val and split.train
    assert not set(split.train) & set(split.val)
    names = [p.name for p in split.all]
    assert names == sorted(names)
    assert len(split.val) == len(names) // 20


def test_tokenizer_round_trips_arbitrary_utf8(tokenizer):
    from transformers import AutoTokenizer

    tok, out = tokenizer
    assert (out / "tokenizer.json").is_file()
    loaded = AutoTokenizer.from_pretrained(str(out))
    rng = random.Random(0)
    samples = SAMPLES + [_random_unicode(rng, rng.randrange(1, 60)) for _ in range(200)]
    for t in (tok, loaded):
        assert (t.bos_token, t.eos_token, t.pad_token) == ("<s>", "</s>", "<pad>")
        assert (t.bos_token_id, t.eos_token_id, t.pad_token_id) == (0, 1, 2)
        for s in samples:
            ids = t(s).input_ids
            assert ids[0] == t.bos_token_id  # Llama-style <s> prefix
            assert t.decode(ids, skip_special_tokens=True) == s, repr(s)
            assert t.decode(t(s, add_special_tokens=False).input_ids) == s, repr(s)


def test_random_model_builds_loads_and_is_byte_identical(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = build_random_model(tmp_path / "a", seed=3)
    b = build_random_model(tmp_path / "b", seed=3)
    c = build_random_model(tmp_path / "c", seed=4)
    assert is_complete_checkpoint(a)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()

    info = read_build_info(a)
    assert info["kind"] == "random" and info["seed"] == 3 and info["spec"] == ModelSpec.tiny().to_dict()

    model = AutoModelForCausalLM.from_pretrained(str(a))
    tok = AutoTokenizer.from_pretrained(str(a))
    spec = ModelSpec.tiny()
    cfg = model.config
    assert cfg.model_type == "llama"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.vocab_size) == (spec.hidden_size, spec.num_hidden_layers, spec.num_attention_heads,
                                spec.num_key_value_heads, spec.vocab_size)
    assert model.dtype == torch.float32
    gc = model.generation_config
    assert (gc.bos_token_id, gc.eos_token_id, gc.pad_token_id, gc.do_sample) == (0, 1, 2, False)
    enc = tok("def f(x):", return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=4, min_new_tokens=4)
    assert out.shape[1] == enc.input_ids.shape[1] + 4


def test_training_is_deterministic_and_loss_decreases(split, tokenizer):
    tok, _ = tokenizer
    spec = ModelSpec.tiny()
    kw = dict(steps=25, seed=7, seq_len=64, batch_size=8, lr=3e-3, progress=False)
    m1, s1 = build_model(spec, tok, split.train[:6], split.val[:1], max_val_tokens=2048, **kw)
    m2, s2 = build_model(spec, tok, split.train[:6], **kw)
    sd1, sd2 = m1.state_dict(), m2.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        assert torch.equal(sd1[k], sd2[k]), k
    assert s1.losses == s2.losses
    assert sum(s1.losses[-5:]) / 5 < sum(s1.losses[:5]) / 5 - 0.5
    assert s1.val_perplexity is not None and 1 < s1.val_perplexity < spec.vocab_size * 2


def test_build_default_model_is_cached(tmp_path):
    out = tmp_path / "m"
    spec = ModelSpec.tiny()
    build_default_model(out, seed=1, steps=2, spec=spec, progress=False)
    info = read_build_info(out)
    assert info["kind"] == "trained" and info["steps"] == 2 and info["seed"] == 1
    assert info["val_perplexity"] > 1 and info["corpus_files"] == len(corpus_files().all)
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    build_default_model(out, seed=1, steps=2, spec=spec, progress=False)  # cache hit: untouched
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
