"""GPUs: a table of the common data-center parts, detection through ``nvidia-smi``, and the
compute-capability gate that runs before any build work.

Compute capabilities: NVIDIA's CUDA GPU list. What each compute capability takes (support matrix, and the
builder's own refusals such as INT8/INT4 and SmoothQuant on SM 10.x): ``rules.BUILDER_RULES``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from .rules import BuilderRule, plugin_flags, refusals
from .variants import KV_CACHE_QUANT_ALGO, VARIANTS

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model. ``memory_bytes`` is what ``nvidia-smi`` reports as total (a little under the label)."""

    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"

    @property
    def short_name(self) -> str:
        """ "NVIDIA A100-SXM4-80GB" → "A100", "NVIDIA H100 80GB HBM3" → "H100", "… GeForce RTX 4090" → "RTX 4090"."""
        name = self.name.removeprefix("NVIDIA ").removeprefix("GeForce ")
        if name.startswith("RTX "):
            return " ".join(name.split(" ")[:2])
        return re.split(r"[ -]", name)[0]

    def describe(self) -> str:
        return f"{self.name} (compute capability {self.cc}, {self.memory_bytes / GIB:.0f} GiB)"


def _g(name, major, minor, gib):
    return GpuSpec(name, (major, minor), int(gib * GIB))


#: Keys are what ``--gpu`` accepts (case-insensitive). Memory: the part's usable total.
KNOWN_GPUS: dict[str, GpuSpec] = {
    "T4": _g("NVIDIA T4", 7, 5, 15),
    "A10": _g("NVIDIA A10", 8, 6, 22.5),
    "A10G": _g("NVIDIA A10G", 8, 6, 22),
    "A30": _g("NVIDIA A30", 8, 0, 24),
    "A100-40GB": _g("NVIDIA A100-SXM4-40GB", 8, 0, 39.5),
    "A100": _g("NVIDIA A100-SXM4-80GB", 8, 0, 79.3),
    "A100-80GB": _g("NVIDIA A100-SXM4-80GB", 8, 0, 79.3),
    "L4": _g("NVIDIA L4", 8, 9, 22.5),
    "L40": _g("NVIDIA L40", 8, 9, 45),
    "L40S": _g("NVIDIA L40S", 8, 9, 45),
    "RTX4090": _g("NVIDIA GeForce RTX 4090", 8, 9, 23.6),
    "H100": _g("NVIDIA H100 80GB HBM3", 9, 0, 79.6),
    "H100-PCIE": _g("NVIDIA H100 PCIe", 9, 0, 79.6),
    "H200": _g("NVIDIA H200", 9, 0, 139.8),
    "GH200": _g("NVIDIA GH200 480GB", 9, 0, 94.5),
    "B200": _g("NVIDIA B200", 10, 0, 178),
}


def lookup_gpu(key: str) -> GpuSpec:
    """``--gpu`` value → spec. Also accepts ``NAME:CC:GIB`` for a part not in the table (e.g. ``X:8.9:48``)."""
    if key.count(":") == 2:
        name, cc, gib = key.split(":")
        major, minor = (int(x) for x in cc.split("."))
        return _g(name, major, minor, float(gib))
    spec = KNOWN_GPUS.get(key.upper().replace(" ", ""))
    if spec is None:
        raise ValueError(f"unknown GPU {key!r}: use one of {', '.join(KNOWN_GPUS)} or NAME:CC:GIB "
                         "(for example 'RTX6000ADA:8.9:48')")
    return spec


_SMI_QUERY = ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> list[GpuSpec]:
    """Parse ``nvidia-smi --query-gpu=name,compute_cap,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not re.fullmatch(r"\d+\.\d+", parts[1]):
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        major, minor = (int(x) for x in parts[1].split("."))
        gpus.append(GpuSpec(parts[0], (major, minor), int(float(parts[2]) * 1024**2)))  # MiB
    return gpus


def detect_gpus() -> list[GpuSpec]:
    """The GPUs this process can see (empty list when there is no driver / no GPU)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(_SMI_QUERY, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(out)


# ------------------------------------------------------------------------------------------------ gate


class UnsupportedOnGpu(ValueError):
    """The requested variant / option cannot run on this GPU; the message says what to use instead."""


def _refusals(variant: str, kv_cache_dtype: str | None, gpu: GpuSpec) -> list[BuilderRule]:
    return refusals(VARIANTS[variant].quant_algo, KV_CACHE_QUANT_ALGO[kv_cache_dtype], gpu.compute_capability)


def usable(variant: str, kv_cache_dtype: str | None, gpu: GpuSpec) -> bool:
    """The builder takes this whole: nothing refused, and paged context FMHA (KV-cache reuse, chunked context)
    kept. Only such combinations are ever advised."""
    flags, _ = plugin_flags(VARIANTS[variant].quant_algo, KV_CACHE_QUANT_ALGO[kv_cache_dtype], gpu.compute_capability)
    return not _refusals(variant, kv_cache_dtype, gpu) and flags["use_paged_context_fmha"]


def supported_variants(gpu: GpuSpec) -> list[str]:
    return [name for name in VARIANTS if not _refusals(name, None, gpu)]


def _cc(cc: tuple[int, int] | None) -> str:
    return f"{cc[0]}.{cc[1]}" if cc else "∞"


def _reason(rule: BuilderRule, variant: str, kv_cache_dtype: str | None) -> str:
    what = VARIANTS[variant].label if rule.refuses == "weights" else f"an {str(kv_cache_dtype).upper()} KV cache"
    if rule.cc_from == (0, 0):
        return f"{what} needs compute capability ≥ {_cc(rule.cc_below)}"
    return f"{what} is not supported on compute capability {_cc(rule.cc_from)} up to {_cc(rule.cc_below)} (exclusive)"


def check_variant(variant: str, gpu: GpuSpec, kv_cache_dtype: str | None = None) -> None:
    """Refuse, before any work is done, what TensorRT-LLM refuses on this GPU (rules.BUILDER_RULES)."""
    found = _refusals(variant, kv_cache_dtype, gpu)
    if not found:
        return
    if found[0].refuses == "gpu":
        raise UnsupportedOnGpu(
            f"{gpu.describe()}: TensorRT-LLM {_trtllm()} supports compute capability ≥ {_cc(found[0].cc_below)} "
            "(Ampere, Ada, Hopper, Blackwell) only. Use an A10/A100/L4/L40S/H100-class GPU, or serve on CPU "
            "(Dockerfile.cpu)."
        )
    reasons = [_reason(r, variant, kv_cache_dtype) for r in found]
    hints = []
    if any(r.refuses == "weights" for r in found):
        names = [n for n in VARIANTS if VARIANTS[n].quant_algo and usable(n, None, gpu)] or ["fp16", "bf16"]
        hints.append(f"use {' or '.join(names)}")
    if any(r.refuses == "kv_cache" for r in found):
        # Never int8 unless the builder keeps paged context FMHA with it (it does not): usable() decides.
        kvs = [f"--kv-cache-dtype {k}" for k in ("fp8", "int8") if k != kv_cache_dtype and usable(variant, k, gpu)]
        hints.append(" or ".join([*kvs, "leave the KV cache in the model dtype (no --kv-cache-dtype)"]))
    said = "; ".join(dict.fromkeys(f'"{r.says}" ({r.source})' for r in found))
    raise UnsupportedOnGpu(f"{'; '.join(reasons)}; this GPU is {gpu.cc} ({gpu.short_name}): {'; '.join(hints)}. "
                           f"TensorRT-LLM: {said}")


def _trtllm() -> str:
    from .pins import TRTLLM_VERSION

    return TRTLLM_VERSION
