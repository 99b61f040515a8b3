"""bench/gguf_export.py: the GGUF a llama.cpp peer runs must hold our checkpoint's weights and tokenizer exactly.

No llama.cpp here (it is built only for the benchmark): the checks use the ``gguf`` package's reader and
numpy. The RoPE permutation is checked by what it is for: llama.cpp's pairwise RoPE on permuted q/k rows gives
the same attention scores as Hugging Face's rotate_half RoPE on the original rows.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import gguf
from bench.gguf_export import (LAYER_TENSORS, export_gguf, gguf_name, rope_permute, rope_unpermute,
                               tokenizer_metadata)


def _rope_neox(x: np.ndarray, pos: int, theta: float = 10000.0) -> np.ndarray:
    """Hugging Face Llama: rotate_half, dims i and i + d/2 form a pair. x: [heads, d]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = np.concatenate([pos * inv, pos * inv])
    rot = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


def _rope_norm(x: np.ndarray, pos: int, theta: float = 10000.0) -> np.ndarray:
    """llama.cpp LLM_ARCH_LLAMA (rope type NORM): dims 2i and 2i + 1 form a pair."""
    d = x.shape[-1]
    ang = pos * theta ** (-np.arange(0, d, 2) / d)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * np.cos(ang) - x1 * np.sin(ang)
    out[..., 1::2] = x0 * np.sin(ang) + x1 * np.cos(ang)
    return out


@pytest.mark.parametrize("n_head,head_dim,cols", [(4, 16, 64), (2, 32, 64), (8, 8, 48)])
def test_rope_permute_round_trips(n_head, head_dim, cols):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, cols)).astype(np.float32)
    p = rope_permute(w, n_head)
    assert p.shape == w.shape and not np.array_equal(p, w)
    np.testing.assert_array_equal(rope_unpermute(p, n_head), w)
    # Rows are only moved within their own head.
    for h in range(n_head):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        assert sorted(map(tuple, p[rows])) == sorted(map(tuple, w[rows]))


def test_permuted_weights_under_llama_cpp_rope_give_hf_attention_scores():
    rng = np.random.default_rng(1)
    n_head, n_kv, d, hidden = 4, 2, 16, 32
    wq = rng.standard_normal((n_head * d, hidden))
    wk = rng.standard_normal((n_kv * d, hidden))
    xq, xk = rng.standard_normal(hidden), rng.standard_normal(hidden)
    for pq, pk in [(0, 0), (5, 2), (37, 11)]:
        hf_q = _rope_neox((wq @ xq).reshape(n_head, d), pq)
        hf_k = _rope_neox((wk @ xk).reshape(n_kv, d), pk)
        cpp_q = _rope_norm((rope_permute(wq, n_head) @ xq).reshape(n_head, d), pq)
        cpp_k = _rope_norm((rope_permute(wk, n_kv) @ xk).reshape(n_kv, d), pk)
        group = n_head // n_kv
        for h in range(n_head):  # GQA: query head h reads kv head h // group
            np.testing.assert_allclose(cpp_q[h] @ cpp_k[h // group], hf_q[h] @ hf_k[h // group], rtol=1e-10)
        # Without the permutation the scores differ: the test can fail.
        wrong = _rope_norm((wq @ xq).reshape(n_head, d), pq)
        if pq:
            assert not np.allclose(wrong[0] @ cpp_k[0], hf_q[0] @ hf_k[0])


def test_tensor_names_follow_llama_cpp():
    assert gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert gguf_name("model.norm.weight") == "output_norm.weight"
    assert gguf_name("lm_head.weight") == "output.weight"
    assert gguf_name("model.layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight"
    assert gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    # The names are the ones gguf's own tensor map gives for LLAMA.
    expected = set(gguf.TENSOR_NAMES[t].format(bid=0) + ".weight" for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.LLAMA]
                   if "{bid}" in gguf.TENSOR_NAMES[t])
    assert {f"blk.0.{v}" for v in LAYER_TENSORS.values()} <= expected
    with pytest.raises(KeyError):
        gguf_name("model.layers.0.self_attn.q_norm.weight")


def _fields(reader: gguf.GGUFReader) -> dict:
    return {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}


@pytest.mark.parametrize("file_type", ["f32", "f16", "q8_0"])
def test_export_reproduces_checkpoint(tiny_checkpoint, tmp_path, file_type):
    path = export_gguf(tiny_checkpoint, tmp_path / f"tiny-{file_type}.gguf", file_type)
    hf = json.loads((tiny_checkpoint / "config.json").read_text())
    state = load_file(str(tiny_checkpoint / "model.safetensors"))
    reader = gguf.GGUFReader(str(path))
    meta = _fields(reader)
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == hf["num_hidden_layers"]
    assert meta["llama.embedding_length"] == hf["hidden_size"]
    assert meta["llama.feed_forward_length"] == hf["intermediate_size"]
    assert (meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]) == (heads, kv)
    assert meta["llama.rope.dimension_count"] == hf["hidden_size"] // heads
    assert meta["llama.rope.freq_base"] == pytest.approx(hf["rope_parameters"]["rope_theta"])
    assert meta["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(hf["rms_norm_eps"])
    assert meta["general.file_type"] == {"f32": 0, "f16": 1, "q8_0": 7}[file_type]

    tensors = {t.name: t for t in reader.tensors}
    expected_names = {gguf_name(n) for n in state}
    assert set(tensors) == expected_names
    tol = {"f32": 0.0, "f16": 1e-3, "q8_0": 1.5e-2}[file_type]
    for name, hf_w in state.items():
        t = tensors[gguf_name(name)]
        # GGUF lists dimensions innermost first.
        assert [int(x) for x in t.shape] == list(reversed(hf_w.shape)), name
        if hf_w.ndim == 1:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        else:
            assert t.tensor_type.name == file_type.upper(), name
        data = gguf.quants.dequantize(t.data, t.tensor_type).reshape(hf_w.shape).astype(np.float32)
        if name.endswith("q_proj.weight"):
            data = rope_unpermute(data, heads)
        elif name.endswith("k_proj.weight"):
            data = rope_unpermute(data, kv)
        err = np.abs(data - hf_w).max() / max(np.abs(hf_w).max(), 1e-12)
        assert err <= tol, f"{name}: max relative error {err:.2e} > {tol}"


def test_tokenizer_metadata_matches_hf(tiny_checkpoint, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_checkpoint), local_files_only=True)
    hf = json.loads((tiny_checkpoint / "config.json").read_text())
    path = export_gguf(tiny_checkpoint, tmp_path / "tiny.gguf", "f32")
    meta = _fields(gguf.GGUFReader(str(path)))
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == hf["vocab_size"]
    n = len(tok)
    assert tokens[:n] == tok.convert_ids_to_tokens(list(range(n)))
    types = meta["tokenizer.ggml.token_type"]
    for special in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id):
        assert types[special] == gguf.TokenType.CONTROL
    assert types[10] == gguf.TokenType.NORMAL
    merges = json.loads((tiny_checkpoint / "tokenizer.json").read_text())["model"]["merges"]
    assert meta["tokenizer.ggml.merges"] == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (tok.bos_token_id,
                                                                                          tok.eos_token_id)
    # add_bos_token tells llama.cpp what the HF tokenizer does on encode (SmolLM2's, like the tiny one's, adds none).
    assert meta["tokenizer.ggml.add_bos_token"] is (tok("x = 1")["input_ids"][0] == tok.bos_token_id) is False


def test_unused_ids_are_padded(tiny_checkpoint):
    n = len(json.loads((tiny_checkpoint / "tokenizer.json").read_text())["model"]["vocab"])
    meta = tokenizer_metadata(tiny_checkpoint, n + 3)
    assert meta["tokens"][n:] == [f"[PAD{i}]" for i in range(n, n + 3)]
    assert meta["types"][n:] == [gguf.TokenType.UNUSED] * 3
    with pytest.raises(ValueError, match="vocab_size"):
        tokenizer_metadata(tiny_checkpoint, n - 1)
