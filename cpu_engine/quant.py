"""Weight layouts and quantised variants as module swaps (gpt-fast style): same ``Transformer``, other linears.

| variant  | quant_algo (TensorRT-LLM name) | stored                               | computed with                          |
| -------- | ------------------------------ | ------------------------------------ | -------------------------------------- |
| fp32     | —                              | fp32 weights                         | ``torch.bmm`` over column blocks        |
| int8_wo  | W8A16                          | int8 weights + per-channel scales    | ``torch._weight_int8pack_mm`` (bf16)¹   |
| int8_sq  | W8A8_SQ_PER_CHANNEL            | int8 (smoothed) weights, scales      | ``torch._int_mm`` on int8 activations²  |
| int4_awq | W4A16_AWQ                      | uint4 pairs + group scales and zeros | ``torch._weight_int4pack_mm_for_cpu``³  |
| fp8      | FP8                            | float8_e4m3fn + per-channel scale    | dequantised to bf16 at load             |

¹ Prompt chunks of ≥ ``INT8_DEQUANT_ROWS`` rows: the weight dequantised to bf16 for one GEMM. Fewer rows, where
  the engine's C++ kernels are loaded on an AVX-512 CPU: their tiled layout (``cpu_engine/kernels/int8_wo_linear.cpp``),
  the same numbers bit for bit, 2-3x faster on one row (also the int8 head's).
² Quantisation, GEMM and rescale in one C++ kernel (``cpu_engine/kernels/int8_linear.cpp``) where it is built.
³ Where the engine's C++ kernels are built and the CPU has AVX512-BF16, both steps on them, from one layout
  (``cpu_engine/kernels/int4_linear.cpp``): decode steps on exact products of bf16 activations and q - 8, scale and
  zero applied per group, 2x ATen's float32 kernel at 16 rows; prompt steps on ATen's float32 numbers, bit for bit.

The engine file keeps Hugging Face's per-projection tensors; at load q/k/v and gate/up are concatenated into one
projection each (``fuse_projections``: 4 kernel calls per layer instead of 7), and the quantised variants also
quantise ``lm_head`` to int8 (the tied 49k-row head is the largest single weight read every step; ``Int8Head``
runs bf16 over the tied embedding from 8 rows on, where int8's kernel is compute-bound).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import native
from .model import Transformer

QUANT_ALGOS = {"int8_wo": "W8A16", "int8_sq": "W8A8_SQ_PER_CHANNEL", "int4_awq": "W4A16_AWQ", "fp8": "FP8"}
# _weight_int8pack_mm's cost grows with its rows (torch 2.13: ~12 µs a row for 3,072 x 576; one call of 16-32 rows
# is as fast as 8-row pieces or faster, 23 % on the 49k-row head). From this many rows (prompt chunks) a projection
# dequantises its weight to bf16 once and runs one bf16 GEMM instead: 3,072 x 576 at 768 rows 12.5 → 3.8 ms,
# crossover ~40 rows. Not weights past ~L2 size (dequantising the 49k-row head costs 38 ms).
INT8_DEQUANT_ROWS = 40
TIED_HEAD_ROWS = 8  # Int8Head: rows from which the tied bf16 embedding's GEMM beats the int8 head
INT8_DEQUANT_MAX_ELEMENTS = 4 << 20
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
PER_INPUT_CHANNEL = {"smooth"}  # buffers indexed by input channel: shared by a fused group, not concatenated


def quantisable_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The decoder layers' projections, by parameter-name prefix."""
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear) and name.startswith("layers.")}


def fuse_projections(state: dict[str, torch.Tensor]) -> None:
    """q/k/v → qkv_proj and gate/up → gate_up_proj, per stored tensor (rows concatenate: every scale is per
    output row or per row and group)."""
    for name in [n for n in state if ".q_proj." in n or ".gate_proj." in n]:
        fused, parts = next((f, p) for f, p in FUSED.items() if f".{p[0]}." in name)
        tensors = [state.pop(name.replace(f".{parts[0]}.", f".{p}.")) for p in parts]
        suffix = name.rpartition(".")[2]
        if suffix in PER_INPUT_CHANNEL:
            if any(not torch.equal(tensors[0], t) for t in tensors[1:]):
                raise ValueError(f"{name}: the fused projections need one shared {suffix!r}; rebuild the engine")
            state[name.replace(f".{parts[0]}.", f".{fused}.")] = tensors[0]
        else:
            state[name.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat(tensors)


class SplitLinear(nn.Module):
    """fp32 weight stored as [blocks, in, out / blocks]: a 1-row product becomes a batched GEMM that MKL spreads
    over every core, where ``F.linear`` runs a 1-row fp32 product (sgemv) on one core (15.7 → 32 GB/s measured)."""

    BLOCKS = 4

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        out_features, in_features = weight.shape
        blocks = self.BLOCKS if out_features % self.BLOCKS == 0 else 1
        self.register_buffer("weight", weight.T.reshape(in_features, blocks, -1).transpose(0, 1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks, in_features, _ = self.weight.shape
        rows = x.reshape(1, -1, in_features).expand(blocks, -1, -1)
        out = torch.bmm(rows.to(self.weight.dtype), self.weight)  # [blocks, rows, out / blocks]
        return out.transpose(0, 1).reshape(*x.shape[:-1], -1).to(x.dtype)

    def dequantised(self) -> torch.Tensor:
        return self.weight.transpose(0, 1).reshape(self.weight.shape[1], -1).T.float()


def _per_channel_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(weight.float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class WeightOnlyInt8Linear(nn.Module):
    """W8A16: per-channel int8 weights and bf16 scales. ``tile()`` turns the weight into the C++ kernel's layout
    (kernels/int8_wo_linear.cpp: ATen's numbers bit for bit, 2-3x faster on one row), where it is loaded."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.bfloat16))
        self.tiled = False

    @staticmethod
    def quantise(weight: torch.Tensor) -> dict[str, torch.Tensor]:
        q, scales = _per_channel_int8(weight)
        return {"weight": q, "scales": scales.to(torch.bfloat16)}

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "WeightOnlyInt8Linear":
        module = cls(weight.shape[1], weight.shape[0])
        module.load_state_dict(cls.quantise(weight))
        return module

    def tile(self) -> None:
        """The kernel's layout replaces ATen's: [ceil(N / 8), K / 16, 8, 16], tiles of 8 output rows (zero rows pad
        the last) by steps of 16 inputs. Named apart, so a compiled step traced for one layout never gets the other."""
        tiles = F.pad(self.weight, (0, 0, 0, -self.out_features % 8)).view(-1, 8, self.in_features // 16, 16)
        self.register_buffer("tiled_weight", tiles.transpose(1, 2).contiguous())
        del self.weight
        self.tiled = True

    def int8_weight(self) -> torch.Tensor:
        """[N, K] int8, from whichever layout the module holds."""
        if not self.tiled:
            return self.weight
        return self.tiled_weight.transpose(1, 2).reshape(-1, self.in_features)[: self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if rows.shape[0] >= INT8_DEQUANT_ROWS and self.out_features * self.in_features <= INT8_DEQUANT_MAX_ELEMENTS:
            out = F.linear(rows, self.int8_weight().to(torch.bfloat16) * self.scales[:, None])
        elif self.tiled:
            out = torch.ops.llm_cpu.int8_wo_linear(rows, self.tiled_weight, self.scales)
        else:
            out = torch._weight_int8pack_mm(rows, self.weight, self.scales)
        return out.view(*x.shape[:-1], -1).to(x.dtype)

    def dequantised(self) -> torch.Tensor:
        return self.int8_weight().float() * self.scales.float()[:, None]


class Int8Head(WeightOnlyInt8Linear):
    """The vocabulary projection of a weight-only variant. Few rows read the weights once each: int8 halves that
    read. From ``TIED_HEAD_ROWS`` rows on, ``_weight_int8pack_mm`` is compute-bound and a bf16 GEMM over the tied
    embedding (in memory anyway: no extra bytes) is faster. 49,152 x 576, 2 threads, Zen 4: 1 row int8 1.2 ms /
    bf16 2.9 ms, 8 rows 4.3 / 3.8, 16 rows 9.0 / 4.9 (ATen's int8 kernel; the tiled one: 1 row 0.67 ms, 16 rows 6.3).
    The threshold is the same with either int8 kernel, so a step's numbers do not depend on which one is loaded."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features)
        self.tied: torch.Tensor | None = None  # the bf16 embedding weight; a plain attribute, not a second buffer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tied is None or x.numel() < TIED_HEAD_ROWS * x.shape[-1]:
            return super().forward(x)
        return F.linear(x.to(self.tied.dtype), self.tied).to(x.dtype)


class SmoothQuantLinear(nn.Module):
    """W8A8: per-channel int8 weights of ``W * s``, per-token dynamic int8 activations of ``x / s`` (as ``x *
    (1 / s)``), multiplied by ``torch._int_mm`` (oneDNN's int8 GEMM: VNNI on AVX-512 CPUs). With the engine's C++
    kernel (``cpu_engine/native.py``) one call quantises, multiplies and rescales; the eager path below computes
    the same numbers in ~12 ATen calls (4 projections × 30 layers of them cost a 16-row decode step ~5 ms)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("scales", torch.ones(out_features, dtype=torch.float32))
        self.register_buffer("smooth", torch.ones(in_features, dtype=torch.float32))
        self.register_buffer("inv_smooth", torch.ones(in_features, dtype=torch.float32), persistent=False)
        self.register_load_state_dict_post_hook(SmoothQuantLinear._invert_smooth)
        self.fused = False  # prepare_for_cpu turns it on where native.load() succeeded

    @staticmethod
    def _invert_smooth(module: "SmoothQuantLinear", _incompatible_keys) -> None:
        module.inv_smooth.copy_(1 / module.smooth)

    @staticmethod
    def quantise(weight: torch.Tensor, act_absmax: torch.Tensor, alpha: float,
                 w_absmax: torch.Tensor) -> dict[str, torch.Tensor]:
        """SmoothQuant: migrate activation outliers into the weights, s_j = max|X_j|^α / max|W_j|^(1-α);
        ``w_absmax`` is taken over every projection that reads the same input, so they share one ``s``."""
        smooth = (act_absmax.float().clamp(min=1e-5).pow(alpha) / w_absmax.clamp(min=1e-5).pow(1 - alpha))
        q, scales = _per_channel_int8(weight.float() * smooth.clamp(min=1e-5)[None, :])
        return {"weight": q, "scales": scales, "smooth": smooth.clamp(min=1e-5)}

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "SmoothQuantLinear":
        """Per-channel int8 of ``weight`` with no smoothing (s = 1): per-token int8 activations as they come."""
        module = cls(weight.shape[1], weight.shape[0])
        q, scales = _per_channel_int8(weight)
        module.load_state_dict({"weight": q, "scales": scales, "smooth": torch.ones(weight.shape[1])})
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return torch.ops.llm_cpu.int8_linear(x, self.inv_smooth, self.weight, self.scales)
        return self.eager(x)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel's arithmetic, op by op (cpu_engine/kernels/int8_linear.cpp): bit-identical results."""
        rows = x.reshape(-1, x.shape[-1]).float() * self.inv_smooth
        act_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0
        q = torch.round(rows * act_scale.reciprocal()).clamp(-127, 127).to(torch.int8)
        out = torch._int_mm(q, self.weight.T).float() * act_scale * self.scales
        return out.view(*x.shape[:-1], -1).to(x.dtype)

    def dequantised(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None] / self.smooth.float()[None, :]


def int4_group_quantise(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric uint4 per (row, group of ``group_size`` inputs): w ≈ (q - 8) * scale + zero, q in [0, 15]
    (the convention of ``_weight_int4pack_mm_for_cpu``). Returns q [N, K] uint8, scales and zeros [N, K / g]."""
    w = weight.float().reshape(weight.shape[0], -1, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scales = ((hi - lo) / 15).clamp(min=1e-8)
    q = torch.round((w - lo[..., None]) / scales[..., None]).clamp(0, 15)
    return q.reshape(weight.shape).to(torch.uint8), scales, lo + 8 * scales


def int4_group_dequantise(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    groups = q.float().reshape(q.shape[0], scales.shape[1], -1)
    return ((groups - 8) * scales.float()[..., None] + zeros.float()[..., None]).reshape(q.shape)


class Int4Linear(nn.Module):
    """W4A16: the file holds two uint4 per byte (``qweight`` [N, K / 2], low nibble first) and per-group scales and
    zeros [N, K / g]; ``pack()`` turns them into one kernel layout, once, at load.

    Where the engine's C++ kernels are loaded and the CPU has AVX512-BF16 (``dot``), the layout is theirs
    (kernels/int4_linear.cpp). Decode steps ([B, 1, K], eager or compiled) run its bf16 dot products (30 layers'
    projections at 16 rows 20.7 → 10.4 ms, 1 row 3.6 → 2.4 ms on Zen 4); prompt steps ([B, T > 1, K]; the engine
    never runs one of width 1) its float32 kernel, which gives ATen's int4 kernel's numbers bit for bit. Not the dot
    products there: their float32 rounding order changes the default model's first answer token where it is a near
    tie ("What is the capital of France?": "The" 0.125 ahead of "L'" on ATen's numbers, level on the dot products),
    and the first token comes from the prompt step. Elsewhere, ATen's layout and kernel
    (``_weight_int4pack_mm_for_cpu``) for both."""

    def __init__(self, in_features: int, out_features: int, group_size: int):
        super().__init__()
        self.group_size = group_size
        self.in_features, self.out_features = in_features, out_features
        groups = in_features // group_size
        self.register_buffer("qweight", torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.register_buffer("scales", torch.ones(out_features, groups, dtype=torch.bfloat16))
        self.register_buffer("zeros", torch.zeros(out_features, groups, dtype=torch.bfloat16))
        self.dot = False

    @staticmethod
    def quantise(weight: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
        q, scales, zeros = int4_group_quantise(weight, group_size)
        return {"qweight": q[:, 0::2] | (q[:, 1::2] << 4), "scales": scales.to(torch.bfloat16),
                "zeros": zeros.to(torch.bfloat16)}

    def _unpacked(self) -> torch.Tensor:
        return torch.stack((self.qweight & 15, self.qweight >> 4), dim=-1).reshape(self.qweight.shape[0], -1)

    def pack(self, dot: bool) -> None:
        """The kernels' layout replaces the file's. ``dot``: the engine's C++ kernels' (loaded, and the CPU has
        AVX512-BF16: native.int4_dot())."""
        q = self._unpacked()
        if dot:  # named apart from ATen's, so a package traced for one layout never runs on the other
            packed, scales_zeros = torch.ops.llm_cpu.int4_pack(q, self.scales, self.zeros, self.group_size)
            self.register_buffer("dot_packed", packed)
            self.register_buffer("dot_scales_zeros", scales_zeros)
        else:
            self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(q.int(), 1))
            self.register_buffer("scales_zeros", torch.stack((self.scales.T, self.zeros.T), dim=-1).contiguous())
        self.dot = dot
        del self.qweight, self.scales, self.zeros

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        if not self.dot:
            out = torch._weight_int4pack_mm_for_cpu(rows, self.packed, self.group_size, self.scales_zeros)
        elif x.dim() == 3 and x.shape[1] > 1:  # a prompt step: ATen's numbers
            out = torch.ops.llm_cpu.int4_linear_f32(rows, self.dot_packed, self.dot_scales_zeros, self.group_size,
                                                    self.out_features)
        else:
            out = torch.ops.llm_cpu.int4_linear(rows, self.dot_packed, self.dot_scales_zeros, self.group_size,
                                                self.out_features)
        return out.view(*x.shape[:-1], -1).to(x.dtype)

    def dequantised(self) -> torch.Tensor:
        """Through a prompt step's kernel: the identity times Wᵀ."""
        return self(torch.eye(self.in_features, dtype=torch.bfloat16)[None])[0].T.float()


def fp8_quantise(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    scales = weight.float().abs().amax(dim=1).clamp(min=1e-8) / FP8_MAX
    return {"weight": (weight.float() / scales[:, None]).to(torch.float8_e4m3fn), "scales": scales}


def fp8_dequantise(state: dict[str, torch.Tensor], prefix: str, dtype: torch.dtype) -> None:
    """Per-call fp8 upcasts are very slow on CPU, so FP8 weights become plain ``dtype`` weights at load."""
    weight = state[f"{prefix}.weight"].float() * state.pop(f"{prefix}.scales")[:, None]
    state[f"{prefix}.weight"] = weight.to(dtype)


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def swap_linears(model: Transformer, variant: str, group_size: int | None = None) -> None:
    """Replace the decoder projections by the variant's module before loading its state dict."""
    make = {"int8_wo": WeightOnlyInt8Linear, "int8_sq": SmoothQuantLinear,
            "int4_awq": lambda i, o: Int4Linear(i, o, group_size)}.get(variant)
    if make is None:
        return
    for name, linear in quantisable_linears(model).items():
        _replace(model, name, make(linear.in_features, linear.out_features))


def prepare_for_cpu(model: Transformer, variant: str | None, dtype: torch.dtype, native_kernels: bool = False,
                    int4_dot: bool = True) -> None:
    """After loading: the layouts the CPU kernels want. A weight-quantised variant's ``lm_head`` becomes int8
    (113 MB fp32 / 56 MB bf16 → 28 MB read per step), int8_sq's as W8A8 without smoothing; fp32 linears become
    ``SplitLinear``; int4 weights are packed; W8A8 linears use the C++ kernel when ``native_kernels``
    (cpu_engine/native.py loaded it), and so do int4 linears where the CPU has AVX512-BF16, unless not ``int4_dot``."""
    if variant in ("int8_wo", "int4_awq"):
        tied = model.lm_head.weight is model.embed_tokens.weight and model.lm_head.weight.dtype == torch.bfloat16
        model.lm_head = Int8Head.from_weight(model.lm_head.weight.detach())
        model.lm_head.tied = model.embed_tokens.weight.detach() if tied else None
    elif variant == "int8_sq":  # W8A8 like its projections: 16 rows 9.5 → 3.2 ms, 1 row 0.8 → 0.4 ms
        model.lm_head = SmoothQuantLinear.from_weight(model.lm_head.weight.detach())
    int4_dot = int4_dot and native_kernels and native.int4_dot()
    int8_tiles = native_kernels and native.int8_wo_tiles()
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.Linear) and dtype == torch.float32:
            _replace(model, name, SplitLinear(m.weight.detach()))
        elif isinstance(m, WeightOnlyInt8Linear) and int8_tiles and m.in_features % 16 == 0:
            m.tile()
        elif isinstance(m, Int4Linear):
            m.pack(int4_dot and m.out_features % 16 == 0)  # the kernel's blocks are 16 outputs, as ATen's
        elif isinstance(m, SmoothQuantLinear):
            m.fused = native_kernels


def observe_inputs(model: nn.Module, batches, wanted: Callable[[str], bool],
                   record: Callable[[str, torch.Tensor], None]) -> None:
    """Run a Hugging Face causal LM (token ids [B, T]) over ``batches`` and hand ``record`` the input rows
    [N, in_features] (fp32) of every linear whose name, mapped to ours, is ``wanted``."""
    def hook(name: str):
        def call(_module, inputs, _output):
            record(name, inputs[0].detach().reshape(-1, inputs[0].shape[-1]).float())
        return call

    handles = [m.register_forward_hook(hook(name.removeprefix("model.")))
               for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and wanted(name.removeprefix("model."))]
    try:
        with torch.inference_mode():
            for batch in batches:
                model(batch)
    finally:
        for h in handles:
            h.remove()


def collect_activation_absmax(model: nn.Module, batches) -> dict[str, torch.Tensor]:
    """Per-input-channel max |activation| of every quantisable linear over calibration batches."""
    store: dict[str, torch.Tensor] = {}

    def record(name: str, rows: torch.Tensor) -> None:
        amax = rows.abs().amax(dim=0)
        store[name] = torch.maximum(store[name], amax) if name in store else amax

    observe_inputs(model, batches, lambda name: name.startswith("layers."), record)
    return store


def _siblings(name: str) -> list[str]:
    """The stored projections that read the same input as ``name`` (one fused group), ``name`` included."""
    for parts in FUSED.values():
        for p in parts:
            if f".{p}." in name:
                return [name.replace(f".{p}.", f".{q}.") for q in parts]
    return [name]


def quantise_state_dict(weights: dict[str, torch.Tensor], variant: str, act_absmax: dict | None = None,
                        alpha: float = 0.5, group_size: int | None = None) -> dict[str, torch.Tensor]:
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
            w_absmax = torch.stack([weights[s].float().abs().amax(dim=0) for s in _siblings(name)]).amax(dim=0)
            parts = SmoothQuantLinear.quantise(tensor, act_absmax[prefix], alpha, w_absmax)
        elif variant == "int4_awq":
            parts = Int4Linear.quantise(tensor, group_size)
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
