"""Quantised variants as module swaps (gpt-fast style): same ``Transformer``, different ``nn.Linear``s.

| variant | quant_algo (TensorRT-LLM name) | stored                            | computed with                       |
| ------- | ------------------------------ | --------------------------------- | ----------------------------------- |
| int8_wo | W8A16                          | int8 weights + per-channel scales | ``torch._weight_int8pack_mm`` (bf16) |
| int8_sq | W8A8_SQ_PER_CHANNEL            | int8 (smoothed) weights, scales   | ``torch._int_mm`` on int8 activations |
| fp8     | FP8                            | float8_e4m3fn + per-channel scale | dequantised to bf16 at load          |

Only the decoder layers' projections are quantised; embeddings, norms and ``lm_head`` keep the compute
dtype, as TensorRT-LLM does by default.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .model import Transformer

QUANT_ALGOS = {"int8_wo": "W8A16", "int8_sq": "W8A8_SQ_PER_CHANNEL", "fp8": "FP8"}
INT8_PACK_ROWS = 8  # _weight_int8pack_mm is fast for few rows; larger blocks are split (measured on AVX-512)
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantisable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The decoder layers' projections, by parameter-name prefix."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name.startswith("layers.")}


def _per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class WeightOnlyInt8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.bfloat16))

    @staticmethod
    def quantise(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scales = _per_channel_int8(weight)
        return {"weight": q, "scales": scales.to(torch.bfloat16)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        blocks = [torch._weight_int8pack_mm(rows[i:i + INT8_PACK_ROWS], self.weight, self.scales)
                  for i in range(0, rows.shape[0], INT8_PACK_ROWS)]
        out = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
        return out.view(*x.shape[:-1], -1).to(x.dtype)


class SmoothQuantLinear(nn.Module):
    """W8A8: per-channel int8 weights of ``W * s``, per-token dynamic int8 activations of ``x / s``."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.float32))
        self.register_buffer("smooth", torch.ones(in_features, dtype=torch.float32))

    @staticmethod
    def quantise(weight: torch.Tensor, act_absmax: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
        """SmoothQuant: migrate activation outliers into the weights, s_j = max|X_j|^α / max|W_j|^(1-α)."""
        w_absmax = weight.float().abs().amax(dim=0).clamp(min=1e-5)
        smooth = (act_absmax.float().clamp(min=1e-5).pow(alpha) / w_absmax.pow(1 - alpha)).clamp(min=1e-5)
        q, scales = _per_channel_int8(weight.float() * smooth[None, :])
        return {"weight": q, "scales": scales, "smooth": smooth}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float() / self.smooth
        act_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(rows / act_scale).clamp(-127, 127).to(torch.int8)
        out = torch._int_mm(q, self.weight.T).float() * act_scale * self.scales
        return out.view(*x.shape[:-1], -1).to(x.dtype)


def fp8_quantise(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-8) / FP8_MAX
    return {"weight": (weight.float() / scales[:, None]).to(torch.float8_e4m3fn), "scales": scales}


def fp8_dequantise(state: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> None:
    """Per-call fp8 upcasts are very slow on CPU, so FP8 weights become plain ``dtype`` weights at load."""
    weight = state[f"{prefix}.weight"].float() * state.pop(f"{prefix}.scales")[:, None]
    state[f"{prefix}.weight"] = weight.to(dtype)


def swap_linears(model: Transformer, variant: str) -> None:
    """Replace the decoder projections by the variant's module before loading its state dict."""
    cls = {"int8_wo": WeightOnlyInt8Linear, "int8_sq": SmoothQuantLinear}.get(variant)
    if cls is None:
        return
    for name, linear in quantisable_linears(model).items():
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, cls(linear.in_features, linear.out_features))


def _abs_max_hook(store: dict, name: str):
    def hook(_module, inputs, _output):
        amax = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0).float()
        store[name] = torch.maximum(store[name], amax) if name in store else amax
    return hook


def collect_activation_absmax(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """Per-input-channel max |activation| of every quantisable linear over calibration batches.

    ``model`` takes token ids [B, T] (a Hugging Face causal LM); its module names are mapped to ours.
    """
    store: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(_abs_max_hook(store, name.removeprefix("model.")))
               for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and name.removeprefix("model.").startswith("layers.")]
    try:
        with torch.inference_mode():
            for batch in batches:
                model(batch)
    finally:
        for h in handles:
            h.remove()
    return store


def quantise_state_dict(weights: dict[str, torch.Tensor], variant: str, act_absmax: dict | None = None,
                        alpha: float = 0.5) -> dict[str, torch.Tensor]:
    """Full-precision weights (our names) → the variant's stored tensors."""
    out = {}
    for name, tensor in weights.items():
        prefix = name.removesuffix(".weight")
        if not (name.startswith("layers.") and name.endswith("_proj.weight")):
            out[name] = tensor
            continue
        if variant == "int8_wo":
            parts = WeightOnlyInt8Linear.quantise(tensor)
        elif variant == "int8_sq":
            parts = SmoothQuantLinear.quantise(tensor, act_absmax[prefix], alpha)
        elif variant == "fp8":
            parts = fp8_quantise(tensor)
        else:
            raise ValueError(f"unknown quantisation variant {variant!r}")
        out.update({f"{prefix}.{k}": v.contiguous() for k, v in parts.items()})
    return out


def bf16_supported() -> bool:
    """bf16 matmuls are fast only with AVX512-BF16 or AMX; elsewhere fp32 is the better compute dtype."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
