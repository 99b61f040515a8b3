"""What a compiled decode step's generated C++ may assume of the CPU, and whether this one has it.

Left to itself, inductor compiles with ``-march=native`` and the widest vector extensions of the build host, so a
package built on one CPU can die of an illegal instruction on another: an image built on an AVX-512 machine, served
on an AVX2-only node. So on x86-64 a package is compiled for a named level (``x86-64-v4``: AVX-512 F/BW/CD/DQ/VL;
``x86-64-v3``: AVX2, FMA) and inductor's vector extensions for it, and it records the CPU flags (as /proc/cpuinfo
names them) that all of this needs. A process runs a package only where its CPU has every one of them, and prefers
the one that needs the most; ``PORTABLE`` (x86-64-v3, ATen's int4 kernel) is the package an image carries for nodes
unlike the machine that built it. Other machines (aarch64…) keep inductor's native target, and their packages run
only on a CPU with exactly the flags of the one that built them (an SVE package is built for one vector length).

torch's CPU capability (``ATEN_CPU_CAPABILITY`` lowers it) caps what counts as present, so that a process told to
stay off AVX-512 runs no package whose generated code uses it."""

from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass

import torch

X86 = platform.machine() in ("x86_64", "AMD64")
# The x86-64 micro-architecture levels (the psABI's), in /proc/cpuinfo's names: lzcnt is "abm" there.
_V2 = ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
LEVELS = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
# inductor's vector-extension flags whose cpuinfo name is not the flag without "-m" ("-mamx-tile" is amx_tile).
_FLAG_NAMES = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}


@dataclass(frozen=True)
class CpuTarget:
    """A compile target: ``march`` (None: inductor's own, native), inductor's vector width in bits (None: its own
    pick), and whether the int4 projections call the engine's AVX512-BF16 kernel (native.int4_dot)."""

    march: str | None
    simdlen: int | None
    int4_dot: bool

    def inductor_configs(self) -> dict:
        return {"cpp.march": self.march, "cpp.simdlen": self.simdlen}

    def requirements(self) -> tuple[str, ...]:
        """The CPU flags a package of this target needs. Asks inductor which vector extensions it would use (it
        compiles probes: call where a compiler is, at build)."""
        return _requirements(self)


@functools.cache
def _requirements(target: CpuTarget) -> tuple[str, ...]:
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if target.march is None:
        return tuple(sorted(host_flags()))
    with config.patch(target.inductor_configs()):
        isa_flags = pick_vec_isa().build_arch_flags().split()
    needed = {*LEVELS[target.march], *(_FLAG_NAMES.get(f[2:], f[2:].replace("-", "_")) for f in isa_flags)}
    if target.int4_dot:
        needed.add("avx512_bf16")
    return tuple(sorted(needed))


PORTABLE = CpuTarget("x86-64-v3", 256, int4_dot=False)


def host_target(int4_dot: bool) -> CpuTarget:
    """The target that gets the most out of this machine: its x86-64 level and vector width, from torch's
    capability."""
    if not X86:
        return CpuTarget(None, None, int4_dot)
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return CpuTarget("x86-64-v4", 512, int4_dot)
    if capability == "AVX2":
        return CpuTarget("x86-64-v3", 256, int4_dot)
    return CpuTarget("x86-64-v2", 0, int4_dot)  # simdlen 0: scalar loops


@functools.cache
def host_flags() -> frozenset[str]:
    """This CPU's flags (/proc/cpuinfo) within torch's capability. Empty where they cannot be read: then no
    package runs."""
    try:
        with open("/proc/cpuinfo") as info:
            text = info.read()
    except OSError:
        return frozenset()
    return parse_flags(text, torch.backends.cpu.get_cpu_capability(), X86)


def parse_flags(cpuinfo: str, capability: str, x86: bool) -> frozenset[str]:
    """The first processor's flags, without the vector extensions above ``capability``; elsewhere than x86 also a
    token of the whole set, so that a native package needs the very flags of the CPU that built it."""
    line = next((row for row in cpuinfo.splitlines() if row.startswith(("flags", "Features"))), "")
    flags = set(line.partition(":")[2].split())
    if not flags:
        return frozenset()
    if not x86:
        return frozenset({*flags, "exactly:" + hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]})
    if not capability.startswith("AVX512"):
        flags = {f for f in flags if not f.startswith(("avx512", "amx"))}
        if capability != "AVX2":
            flags -= {"avx", "avx2", "fma", "f16c"}
    return frozenset(flags)


def missing(requirements: tuple[str, ...] | list[str]) -> list[str]:
    """What of ``requirements`` this CPU lacks (all of them where its flags cannot be read)."""
    have = host_flags()
    return sorted(f for f in requirements if f not in have) if have else ["(no CPU flags readable)"]


def runs_here(requirements: tuple[str, ...] | list[str]) -> bool:
    return bool(requirements) and not missing(requirements)
