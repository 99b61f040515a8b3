"""Write a llama.cpp GGUF file from one of our Hugging Face Llama checkpoints, with the ``gguf`` package only.

What llama.cpp's ``convert_hf_to_gguf.py`` does for a Llama checkpoint with a byte-level BPE tokenizer, reduced
to what our checkpoints need (no torch required: safetensors are read as numpy):

* tensors renamed to llama.cpp's names (``token_embd``, ``blk.N.attn_q`` …, ``output_norm``, ``output``);
* the rows of ``q_proj`` / ``k_proj`` permuted: Hugging Face stores RoPE's two halves of each head apart
  (rotate_half), llama.cpp's ``LLM_ARCH_LLAMA`` expects them interleaved in pairs;
* the tokenizer as GPT-2-style BPE metadata (``tokenizer.ggml.model = gpt2``, pre-tokenizer ``gpt-2``): the
  byte-level token strings of ``tokenizer.json``, its merges, special tokens as CONTROL, BOS added;
* file types F32, F16 (2-D weights; norms stay F32, as llama.cpp does) and Q8_0 (2-D weights whose rows are a
  multiple of 32, quantised by ``gguf.quants``; the benchmark quantises with llama.cpp's own
  ``llama_model_quantize`` instead, see ``bench/llama_cpp_peer.py``).

    python -m bench.gguf_export build/models/smollm2 build/bench/gguf/smollm2-f32.gguf --type f32
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

FILE_TYPES = ("f32", "f16", "q8_0")

# Hugging Face parameter name (after "model.layers.N.") → GGUF tensor name (after "blk.N.").
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


# ---------------------------------------------------------------------------------------------- weights


def rope_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate_half: halves of each head apart) → llama.cpp (pairs interleaved), per head, on rows."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def rope_unpermute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`rope_permute` (llama.cpp → HF); used to check the round trip."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def gguf_name(hf_name: str) -> str:
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name]
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and ".".join(parts[3:]) in LAYER_TENSORS:
        return f"blk.{int(parts[2])}.{LAYER_TENSORS['.'.join(parts[3:])]}"
    raise KeyError(f"no GGUF name for tensor {hf_name!r} (not a Llama checkpoint?)")


def read_config(checkpoint: Path) -> dict:
    hf = json.loads((checkpoint / "config.json").read_text())
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in ("LlamaForCausalLM", "MistralForCausalLM"):
        raise ValueError(f"{checkpoint}: {arch} is not a Llama-family checkpoint")
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError("rope scaling is not exported (the benchmark's checkpoints do not use it)")
    return hf


def _safetensors_files(checkpoint: Path) -> list[Path]:
    index = checkpoint / "model.safetensors.index.json"
    if index.exists():
        return [checkpoint / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [checkpoint / "model.safetensors"]


def gguf_tensors(checkpoint: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array) for every tensor, q/k permuted, in the checkpoint's order."""
    from safetensors import safe_open

    checkpoint = Path(checkpoint)
    hf = read_config(checkpoint)
    n_head = hf["num_attention_heads"]
    n_kv = hf.get("num_key_value_heads") or n_head
    tied = bool(hf.get("tie_word_embeddings", False))
    for path in _safetensors_files(checkpoint):
        with safe_open(str(path), framework="np") as f:
            for name in f.keys():
                if tied and name == "lm_head.weight":
                    continue  # llama.cpp falls back to token_embd when output is absent
                data = f.get_tensor(name).astype(np.float32)
                if name.endswith("self_attn.q_proj.weight"):
                    data = rope_permute(data, n_head)
                elif name.endswith("self_attn.k_proj.weight"):
                    data = rope_permute(data, n_kv)
                yield gguf_name(name), data


def encode_tensor(name: str, data: np.ndarray, file_type: str):
    """(array, raw_dtype or None) as stored for ``file_type``; 1-D tensors (norms) always stay F32."""
    import gguf

    if data.ndim == 1 or file_type == "f32":
        return data.astype(np.float32), None
    if file_type == "f16" or data.shape[-1] % 32 != 0:
        return data.astype(np.float16), None
    if file_type == "q8_0":
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    raise ValueError(f"file type must be one of {FILE_TYPES}, got {file_type!r}")


# -------------------------------------------------------------------------------------------- tokenizer


def tokenizer_metadata(checkpoint: str | Path, vocab_size: int) -> dict:
    """GPT-2-style BPE vocabulary from ``tokenizer.json``: tokens by id, token types, merges, special ids.

    Ids the tokenizer does not use (vocab_size > len(tokenizer)) become ``[PAD{i}]`` UNUSED tokens, like
    llama.cpp's converter does.
    """
    import gguf

    checkpoint = Path(checkpoint)
    tj = json.loads((checkpoint / "tokenizer.json").read_text())
    model = tj["model"]
    if model.get("type") != "BPE" or (tj.get("pre_tokenizer") or {}).get("type") not in ("ByteLevel", "Sequence"):
        raise ValueError("only byte-level BPE tokenizers are exported (tokenizer.json model BPE + ByteLevel)")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    special = {}
    for added in tj.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special[added["content"]] = added["id"]
    if max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer has id {max(by_id)} >= the model's vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in special else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    tc = {}
    if (checkpoint / "tokenizer_config.json").exists():
        tc = json.loads((checkpoint / "tokenizer_config.json").read_text())

    def special_id(key: str) -> int | None:
        value = tc.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return special.get(value) if value else None

    post = json.dumps(tj.get("post_processor") or {})
    return {
        "tokens": tokens, "types": [int(t) for t in types], "merges": merges,
        "bos": special_id("bos_token"), "eos": special_id("eos_token"), "pad": special_id("pad_token"),
        # Our tokenizers prepend <s> in their post-processor (TemplateProcessing), like Llama's.
        "add_bos": special_id("bos_token") is not None and '"TemplateProcessing"' in post,
    }


# ------------------------------------------------------------------------------------------------ write


def export_gguf(checkpoint: str | Path, out_path: str | Path, file_type: str = "f32",
                name: str | None = None) -> Path:
    import gguf

    if file_type not in FILE_TYPES:
        raise ValueError(f"file type must be one of {FILE_TYPES}, got {file_type!r}")
    checkpoint, out_path = Path(checkpoint), Path(out_path)
    hf = read_config(checkpoint)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[file_type]
    rope = dict(hf.get("rope_parameters") or {})
    theta = hf.get("rope_theta") or rope.get("rope_theta", 10000.0)

    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), "llama")
    w.add_name(name or checkpoint.name)
    w.add_file_type(int(ftype))
    w.add_context_length(hf["max_position_embeddings"])
    w.add_embedding_length(hf["hidden_size"])
    w.add_block_count(hf["num_hidden_layers"])
    w.add_feed_forward_length(hf["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(hf.get("num_key_value_heads") or heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(hf.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(hf["vocab_size"])

    tok = tokenizer_metadata(checkpoint, hf["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex: what tokenizers' ByteLevel(use_regex=True) uses
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
        if tok[key] is not None:
            add(tok[key])
    w.add_add_bos_token(tok["add_bos"])
    w.add_add_eos_token(False)

    for tname, data in gguf_tensors(checkpoint):
        stored, raw_dtype = encode_tensor(tname, data, file_type)
        if raw_dtype is None:
            w.add_tensor(tname, stored)
        else:
            w.add_tensor(tname, stored, raw_shape=stored.shape, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(out_path)
    return out_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gguf_export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--type", choices=FILE_TYPES, default="f32")
    args = parser.parse_args(argv)
    print(export_gguf(args.checkpoint, args.out, args.type))


if __name__ == "__main__":
    main()
