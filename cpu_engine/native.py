"""The engine's own C++ kernels (``cpu_engine/kernels/*.cpp``): int8_sq's W8A8 projection, the weight-only int8
projection and head on a tiled layout, int4_awq's decode-step projection on bf16 dot products, a decode step's
attention read in place from the paged cache, and the runner of the compiled decode step (without the GIL). Compiled
ahead of time with every engine, cached next to it, and loaded with it; eager PyTorch is the fallback wherever no
library can be found or built (no compiler, another torch, ``LLM_CPU_KERNELS=eager``): bit for bit the projection's
numbers, int4's within float32 rounding order (ATen's int4 kernel, also where the CPU lacks AVX512-BF16), the
attention's within bf16 rounding (ATen's matmuls round the scores to bf16, the kernel keeps float32).

A library is keyed by its sources, torch's version and the Python ABI, so an engine directory carried to a
machine with another torch builds (or falls back) instead of loading a library built against other headers."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import torch

SOURCES = tuple(Path(__file__).parent / "kernels" / name
                for name in ("int8_linear.cpp", "int8_wo_linear.cpp", "int4_linear.cpp", "decode_attention.cpp",
                             "compiled_runner.cpp"))
HEADERS = (Path(__file__).parent / "kernels" / "lanes.h",)  # included by the sources: part of the key
LIBRARY = "llm_cpu_kernels"
# -fopenmp: at::parallel_for is a header template that runs its loop on one thread unless _OPENMP is defined. The
# library then needs libgomp.so.1, which resolves to the copy torch loaded (the same soname).
FLAGS = ("-O3", "-fopenmp")
EAGER_ENV = "LLM_CPU_KERNELS"  # "eager": never load or build the library (A/B runs, fallback tests)
_lock = threading.Lock()
_loaded: Path | None = None
_failed: str | None = None  # why not, once: a process either has the library or runs eager throughout


@functools.cache  # the sources do not change under a running process: hash them once
def build_key() -> str:
    digest = hashlib.sha256()
    for source in (*SOURCES, *HEADERS):
        digest.update(source.read_bytes())
    digest.update(f"{torch.__version__}|{sys.implementation.cache_tag}|{platform.machine()}|{FLAGS}".encode())
    return digest.hexdigest()[:16]


def library_path(root: str | Path) -> Path:
    """Where the library for these sources lives under ``root`` (an engine directory or the user cache)."""
    return Path(root) / "kernels" / build_key() / f"{LIBRARY}.so"


def user_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "triton-llm-stack"


def build(root: str | Path) -> Path:
    """Compile the kernels into ``root`` (torch's extension builder: g++ and ninja, ~8 s), in a child process so
    that this one loads the library once, from where it is kept; the file is moved into place only when complete,
    so concurrent builders and readers never see half a library."""
    target = library_path(root)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="llm-kernels-") as scratch:
        compile_ = ("import sys; from torch.utils import cpp_extension; "
                    f"cpp_extension.load(name=sys.argv[1], sources=sys.argv[3:], build_directory=sys.argv[2], "
                    f"extra_cflags={list(FLAGS)}, extra_ldflags=['-fopenmp'], is_python_module=False)")
        done = subprocess.run([sys.executable, "-c", compile_, LIBRARY, scratch, *map(str, SOURCES)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            output = (done.stderr or done.stdout).strip()
            raise RuntimeError(output.splitlines()[-1] if output else f"compiler exited {done.returncode}")
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        shutil.copyfile(Path(scratch) / f"{LIBRARY}.so", partial)
        os.replace(partial, target)
    for stale in target.parent.parent.iterdir():  # libraries of older sources: one library per directory
        if stale != target.parent:
            shutil.rmtree(stale, ignore_errors=True)
    return target


def load(engine_dir: str | Path | None) -> str | None:
    """Make ``torch.ops.llm_cpu`` available in this process. Returns None when it is, else why not (the callers
    then run their eager path). Looks next to the engine, then in the user cache; builds into the first of the
    two that is writable when neither holds the library."""
    global _loaded, _failed
    if os.environ.get(EAGER_ENV, "").lower() == "eager":
        return f"{EAGER_ENV}=eager"
    with _lock:
        if _loaded is not None or _failed is not None:
            return _failed
        roots = ([Path(engine_dir)] if engine_dir is not None else []) + [user_cache()]
        found = next((library_path(r) for r in roots if library_path(r).is_file()), None)
        errors = []
        if found is None:
            for root in roots:
                try:
                    found = build(root)
                    break
                except (OSError, RuntimeError) as exc:  # no compiler or headers, a read-only directory: next root
                    errors.append(f"{root}: {exc}")
        if found is None:
            _failed = "could not build the C++ kernels (" + "; ".join(errors) + ")"
            return _failed
        try:
            torch.ops.load_library(str(found))
        except (OSError, RuntimeError) as exc:
            _failed = f"could not load {found}: {exc}"
            return _failed
        _register_fakes()
        _loaded = found
        return None


def _register_fakes() -> None:
    """Output shapes for torch.export, which traces the compiled decode step through these ops."""
    torch.library.register_fake("llm_cpu::decode_attention")(lambda q, k_cache, v_cache, reads, positions:
                                                             torch.empty_like(q))
    torch.library.register_fake("llm_cpu::int4_linear")(
        lambda x, packed, scales_zeros, group, out_features: x.new_empty((*x.shape[:-1], out_features),
                                                                         dtype=torch.bfloat16))
    torch.library.register_fake("llm_cpu::int8_wo_linear")(
        lambda x, packed, scales: x.new_empty((*x.shape[:-1], scales.numel()), dtype=torch.bfloat16))


def available() -> bool:
    """Whether this process has loaded the kernels (``torch.ops.llm_cpu``)."""
    return _loaded is not None


def _kernel_runs(supported: str) -> bool:
    """The library is loaded, its ``supported`` op says this CPU runs the kernel, and torch's capability (which
    ``ATEN_CPU_CAPABILITY`` lowers) is AVX-512: the ATen kernels whose numbers ours reproduce are its AVX-512 ones."""
    return (_loaded is not None and bool(getattr(torch.ops.llm_cpu, supported)())
            and torch.backends.cpu.get_cpu_capability().startswith("AVX512"))


def int4_dot() -> bool:
    """Whether int4 projections run the library's bf16 dot-product kernel (AVX512-BF16) rather than ATen's."""
    return _kernel_runs("int4_supported")


def int8_wo_tiles() -> bool:
    """Whether weight-only int8 projections and heads run the library's kernel on its tiled layout (AVX-512)
    rather than ATen's ``_weight_int8pack_mm``."""
    return _kernel_runs("int8_wo_supported")


def describe() -> str:
    """Which kernels this process runs, for logs and the benchmark's table."""
    if _loaded is None:
        return "eager"
    int4 = "; int4 decode on bf16 dot products" if int4_dot() else ""
    int8_wo = "; int8 weight-only in tiles" if int8_wo_tiles() else ""
    return f"C++ ({torch.ops.llm_cpu.int8_linear_isa()}{int4}{int8_wo}) from {_loaded}"
