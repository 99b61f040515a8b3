"""GPUs: a table of the common data-center parts, detection through ``nvidia-smi``, and the
compute-capability gate that runs before any build work.

Compute capabilities: NVIDIA's CUDA GPU list. Precision support per architecture: TensorRT-LLM support
matrix (Hopper / Ada: FP16, BF16, FP8, INT8, INT4; Ampere SM80/SM86: FP16, BF16, INT8, INT4; nothing older
is supported by TensorRT-LLM even where the container itself runs).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

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


def supported_variants(gpu: GpuSpec) -> list[str]:
    from .variants import VARIANTS

    return [name for name, v in VARIANTS.items() if gpu.compute_capability >= v.min_cc]


def check_variant(variant: str, gpu: GpuSpec, kv_cache_dtype: str | None = None) -> None:
    """Refuse a variant / KV-cache dtype this GPU cannot run, before any work is done."""
    from .variants import KV_CACHE_MIN_CC, VARIANTS

    v = VARIANTS[variant]
    if gpu.compute_capability < (8, 0):
        raise UnsupportedOnGpu(
            f"{gpu.describe()}: TensorRT-LLM {_trtllm()} supports compute capability ≥ 8.0 (Ampere, Ada, "
            "Hopper, Blackwell) only. Use an A10/A100/L4/L40S/H100-class GPU, or serve on CPU "
            "(Dockerfile.cpu)."
        )
    if gpu.compute_capability < v.min_cc:
        alternatives = [n for n in supported_variants(gpu) if n not in ("fp16", "bf16")]
        hint = f"use {' or '.join(alternatives)}" if alternatives else "use fp16 or bf16"
        raise UnsupportedOnGpu(
            f"{v.label} needs compute capability ≥ {v.min_cc[0]}.{v.min_cc[1]}; this GPU is {gpu.cc} "
            f"({gpu.short_name}): {hint}"
        )
    if kv_cache_dtype is not None:
        need = KV_CACHE_MIN_CC[kv_cache_dtype]
        if gpu.compute_capability < need:
            raise UnsupportedOnGpu(
                f"an {kv_cache_dtype.upper()} KV cache needs compute capability ≥ {need[0]}.{need[1]}; this GPU "
                f"is {gpu.cc} ({gpu.short_name}): use --kv-cache-dtype int8 (with int8_sq) or leave the KV "
                "cache in the model dtype"
            )


def _trtllm() -> str:
    from .pins import TRTLLM_VERSION

    return TRTLLM_VERSION
