"""The int8 weight-only projection against its own formula (x @ (q * scale)ᵀ in fp32), for every row count the
engine sends it: decode rows and short chunks (the int8 kernel), and prompt chunks (dequantised bf16 GEMM); and the
int8 head, which hands rows from its threshold on to the tied bf16 embedding it shares with the model."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import torch.nn.functional as F

from builders.cpu_build import BuildLimits, build_cpu_engine
from builders.tiny_model import ModelSpec, build_random_model
from cpu_engine import load_engine
from cpu_engine.quant import (INT8_DEQUANT_MAX_ELEMENTS, INT8_DEQUANT_ROWS, TIED_HEAD_ROWS, Int8Head,
                              WeightOnlyInt8Linear)


@pytest.mark.parametrize("rows", [1, 8, 16, INT8_DEQUANT_ROWS - 1, INT8_DEQUANT_ROWS, 130])
@pytest.mark.parametrize("shape", [(384, 256), (INT8_DEQUANT_MAX_ELEMENTS // 256 + 8, 256)])
def test_int8_weight_only_matches_its_formula(rows, shape):
    torch.manual_seed(rows)
    linear = WeightOnlyInt8Linear.from_weight(torch.randn(shape))
    x = torch.randn(rows, shape[1])
    want = x @ linear.dequantised().T
    got = linear(x.to(torch.bfloat16)).float()
    assert got.shape == want.shape
    # bf16 activations and outputs: ~3 significant digits, relative to the output's scale
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


@pytest.mark.parametrize("rows", [1, TIED_HEAD_ROWS - 1, TIED_HEAD_ROWS, 17])
def test_int8_head_uses_the_tied_embedding_from_its_threshold(rows):
    torch.manual_seed(rows)
    embedding = torch.randn(1000, 64).bfloat16()
    head = Int8Head.from_weight(embedding.float())
    x = torch.randn(rows, 64).bfloat16()
    int8 = torch._weight_int8pack_mm(x, head.weight, head.scales)
    assert torch.equal(head(x), int8)  # no tied weight: always int8
    head.tied = embedding
    assert torch.equal(head(x), int8 if rows < TIED_HEAD_ROWS else F.linear(x, embedding))


def test_a_tied_weight_only_engine_shares_its_embedding_with_the_head(tmp_path):
    """The bf16 path reads the embedding's own tensor (no second copy); fp32 compute (no AVX512-BF16) keeps int8."""
    spec = dataclasses.replace(ModelSpec.tiny(), tie_word_embeddings=True)
    checkpoint = build_random_model(tmp_path / "tied", spec, tokenizer_chars=20_000)
    engine = build_cpu_engine(checkpoint, tmp_path / "int8_wo", variant="int8_wo",
                              limits=BuildLimits(max_batch_size=4, max_input_len=32, max_seq_len=64, max_num_tokens=32))
    model = load_engine(engine).model
    assert isinstance(model.lm_head, Int8Head)
    if model.embed_tokens.weight.dtype == torch.bfloat16:
        assert model.lm_head.tied.data_ptr() == model.embed_tokens.weight.data_ptr()
    else:
        assert model.lm_head.tied is None
