"""What ran the benchmark: CPU, its vector extensions, memory, OS, the versions that matter and the git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from bench.engine_bench.options import PROJECT_ROOT


def machine_info(threads: int) -> dict:
    import torch
    import transformers

    cpu = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if ":" in line:
            k, v = (s.strip() for s in line.split(":", 1))
            cpu.setdefault(k, v)
    flags = set(cpu.get("flags", "").split())
    mem_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                      if ln.startswith("MemTotal")))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT_ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = "?", False
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    for mod in ("tritonclient", "gguf"):
        try:
            from importlib.metadata import version

            versions[mod] = version(mod if mod != "tritonclient" else "tritonclient")
        except Exception:  # noqa: BLE001
            pass
    try:
        from importlib.metadata import version

        versions["nvidia-pytriton (tritonserver 2.51)"] = version("nvidia-pytriton")
    except Exception:  # noqa: BLE001
        pass
    return {
        "cpu": cpu.get("model name", platform.processor()), "cores": os.cpu_count(),
        "isa": sorted(f for f in flags if f in {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16",
                                                "amx_int8", "avx_vnni"}),
        "memory_gb": round(mem_kb / 2**20, 1), "os": platform.platform(), "threads": threads,
        "torch_threads": torch.get_num_threads(), "git": commit + ("+dirty" if dirty else ""),
        "versions": versions,
    }


# ------------------------------------------------------------------------------------------------- main
