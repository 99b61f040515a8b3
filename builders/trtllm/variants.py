"""The engine variants: how each is produced and what it writes into the checkpoint's ``quantization``.

``quant_algo`` strings are TensorRT-LLM's ``QuantAlgo`` names as written by ModelOpt's ``quantize.py`` and
by ``convert_checkpoint.py`` (fp8 → FP8, int8_sq → W8A8_SQ_PER_CHANNEL, int8_wo → W8A16, int4_awq → W4A16_AWQ).
Which GPUs take which variant and KV cache is TensorRT-LLM's rule, kept in ``rules.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Dtype = Literal["float16", "bfloat16"]


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    dtype: Dtype  # activations / unquantized weights
    tool: Literal["convert", "quantize"]  # convert_checkpoint.py or ModelOpt quantize.py
    quant_algo: str | None
    calibrated: bool  # needs calibration text
    qformat: str | None = None  # quantize.py --qformat
    weight_bits: float = 16.0  # bits per weight of the quantized linear layers (before scales)
    group_size: int | None = None  # per-group scales (AWQ)


VARIANTS: dict[str, Variant] = {
    "fp16": Variant("fp16", "FP16", "float16", "convert", None, False),
    "bf16": Variant("bf16", "BF16", "bfloat16", "convert", None, False),
    "fp8": Variant("fp8", "FP8", "float16", "quantize", "FP8", True, "fp8", 8.0),
    "int8_sq": Variant("int8_sq", "INT8 SmoothQuant", "float16", "quantize", "W8A8_SQ_PER_CHANNEL", True, "int8_sq",
                       8.0),
    "int8_wo": Variant("int8_wo", "INT8 weight-only", "float16", "convert", "W8A16", False, None, 8.0),
    "int4_awq": Variant("int4_awq", "INT4 AWQ", "float16", "quantize", "W4A16_AWQ", True, "int4_awq", 4.0, 128),
}

#: --kv-cache-dtype → kv_cache_quant_algo. ``None`` (the default) keeps the model dtype.
KV_CACHE_QUANT_ALGO = {"fp8": "FP8", "int8": "INT8", None: None}


def kv_bytes_per_element(variant: Variant, kv_cache_dtype: str | None) -> int:
    return 1 if kv_cache_dtype in ("fp8", "int8") else 2
