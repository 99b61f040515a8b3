"""The int8 weight-only projection against its own formula (x @ (q * scale)ᵀ in fp32), for every row count the
engine sends it: decode rows and short chunks (the int8 kernel), and prompt chunks (dequantised bf16 GEMM)."""

from __future__ import annotations

import pytest
import torch

from cpu_engine.quant import INT8_DEQUANT_MAX_ELEMENTS, INT8_DEQUANT_ROWS, WeightOnlyInt8Linear


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
