"""Memory budget arithmetic against the published Llama numbers (ANCHORS.md §3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.trtllm.gpus import GIB, lookup_gpu
from builders.trtllm.memory import ModelShape, compute_budget, kv_bytes_per_token, weight_bytes

HF = Path(__file__).parent / "fixtures" / "trtllm" / "hf"
LLAMA2 = ModelShape.from_checkpoint(HF / "llama-2-7b")
LLAMA3 = ModelShape.from_checkpoint(HF / "llama-3-8b")
MISTRAL = ModelShape.from_checkpoint(HF / "mistral-7b")
KIB = 1024


def test_kv_bytes_per_token():
    assert kv_bytes_per_token(LLAMA2, 2) == 512 * KIB  # fp16
    assert kv_bytes_per_token(LLAMA2, 1) == 256 * KIB  # fp8 / int8
    assert kv_bytes_per_token(LLAMA3, 2) == 128 * KIB
    assert kv_bytes_per_token(MISTRAL, 2) == 128 * KIB
    # per GPU: KV heads split by TP, layers by PP
    assert kv_bytes_per_token(LLAMA2, 2, tp=2) == 256 * KIB
    assert kv_bytes_per_token(LLAMA3, 2, tp=2, pp=2) == 32 * KIB
    assert kv_bytes_per_token(LLAMA3, 2, tp=16) == 2 * 32 * 1 * 128 * 2  # fewer KV heads than ranks: replicated


@pytest.mark.parametrize("variant,expected_gb", [("fp16", 13.5), ("bf16", 13.5), ("fp8", 7.0), ("int8_sq", 7.0),
                                                 ("int8_wo", 7.0), ("int4_awq", 3.9)])
def test_llama2_weight_bytes_match_anchors(variant, expected_gb):
    got = weight_bytes(LLAMA2, variant) / 1e9
    assert abs(got - expected_gb) / expected_gb <= 0.05, f"{variant}: {got:.2f} GB vs {expected_gb} GB"


def test_param_counts():
    assert abs(LLAMA2.total_params / 1e9 - 6.74) < 0.01
    assert abs(LLAMA3.total_params / 1e9 - 8.03) < 0.01


def test_budget_fills_triton_config_and_json(tmp_path):
    b = compute_budget(LLAMA3, "fp16", lookup_gpu("A100"), max_batch_size=64, max_seq_len=8192,
                       max_num_tokens=8192, kv_cache_free_gpu_mem_fraction=0.9)
    assert b.fits and b.kv_bytes_per_token == 128 * KIB
    free = b.gpu_memory_bytes - b.weight_bytes_per_gpu - b.activation_bytes_estimate - b.runtime_overhead_bytes_estimate
    assert b.kv_cache_bytes == int(free * 0.9)
    assert b.kv_cache_tokens == b.kv_cache_bytes // b.kv_bytes_per_token // 32 * 32
    assert b.max_tokens_in_paged_kv_cache == min(b.kv_cache_tokens, 64 * 8192)
    assert b.batch_at_seq_len[8192] == min(64, b.kv_cache_tokens // 8192)
    path = b.write(tmp_path / "memory_budget.json")
    data = json.loads(path.read_text())
    assert data["kv_bytes_per_token"] == 131072
    assert data["max_tokens_in_paged_kv_cache"] == b.max_tokens_in_paged_kv_cache
    assert "activation_bytes_estimate" in data["estimated_fields"]
    assert "KV per token" in b.summary()


def test_budget_caps_kv_at_what_the_engine_can_use():
    b = compute_budget(LLAMA3, "fp8", lookup_gpu("H200"), kv_cache_dtype="fp8", max_batch_size=8, max_seq_len=4096)
    assert b.max_tokens_in_paged_kv_cache == 8 * 4096 < b.kv_cache_tokens
    assert any("capped" in n for n in b.notes)


def test_budget_reports_what_does_not_fit():
    llama70 = ModelShape(num_hidden_layers=80, hidden_size=8192, num_attention_heads=64, num_key_value_heads=8,
                         head_dim=128, intermediate_size=28672, vocab_size=128256, max_position_embeddings=8192)
    assert abs(weight_bytes(llama70, "fp16") / 1e9 - 141) < 2
    b = compute_budget(llama70, "fp16", lookup_gpu("A100"))
    assert not b.fits and any("--tp-size" in n for n in b.notes)
    b4 = compute_budget(llama70, "fp16", lookup_gpu("A100"), tp_size=4)
    assert b4.fits and b4.weight_bytes_per_gpu < 40 * GIB
