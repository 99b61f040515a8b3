"""Find and set up the measuring tools: perf_analyzer 2.51 and genai-perf (own venv), offline.

perf_analyzer comes with ``tritonclient==2.51.0`` (``tritonclient-2.51.0.data/data/bin/perf_analyzer``,
installed as ``<venv>/bin/perf_analyzer``). It links ``libb64.so.0d`` and ``libcudart.so.12``; both are inside
``nvidia_pytriton.libs`` under hashed names, so we symlink them under their sonames into
``build/tools/perf_analyzer/lib`` and run perf_analyzer with that on ``LD_LIBRARY_PATH`` (no apt, no CUDA).
Newer perf_analyzer wheels (2.52+) need glibc 2.38 and do not run on Debian 12.

genai-perf (0.0.16, ~1 GB with its dependencies) lives in ``build/tools/genai-perf`` so it cannot disturb the
project's pins; it finds perf_analyzer on ``PATH`` and always gets a local ``--tokenizer``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .spec import PROJECT_ROOT

TOOLS_DIR = PROJECT_ROOT / "build" / "tools"
PA_LIB_DIR = TOOLS_DIR / "perf_analyzer" / "lib"
GENAI_PERF_VENV = TOOLS_DIR / "genai-perf"
GENAI_PERF_VERSION = "0.0.16"
# soname -> glob of the copy that auditwheel put in nvidia_pytriton.libs
PA_LIBS = {"libb64.so.0d": "libb64-*.so.0d*", "libcudart.so.12": "libcudart-*.so.12*"}


class ToolError(RuntimeError):
    """A tool is missing or cannot run; the message says how to set it up."""


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    lib_dir: Path

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        parts = [str(self.lib_dir)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(parts))
        return env

    def version(self) -> str:
        out = subprocess.run([str(self.binary), "--version"], env=self.env(), capture_output=True, text=True,
                             timeout=30)
        return (out.stdout + out.stderr).strip().splitlines()[-1] if (out.stdout + out.stderr).strip() else "?"


def _site_packages() -> list[Path]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return [Path(p) for p in paths]


def find_perf_analyzer_binary() -> Path:
    candidates = [Path(sys.prefix) / "bin" / "perf_analyzer", Path(sys.executable).parent / "perf_analyzer"]
    for sp in _site_packages():  # an unpacked wheel that did not install its data scripts
        candidates += list(sp.glob("tritonclient-*.data/data/bin/perf_analyzer"))
    if found := shutil.which("perf_analyzer"):
        candidates.append(Path(found))
    for c in candidates:
        if c.exists() and os.access(c, os.X_OK):
            return c
    raise ToolError("perf_analyzer not found: it comes with tritonclient==2.51.0 (pip install -e .); "
                    "then run `python -m loadtest setup`")


def _pytriton_libs() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    libs = Path(next(iter(spec.submodule_search_locations))).parent / "nvidia_pytriton.libs"
    return libs if libs.is_dir() else None


def setup_perf_analyzer(lib_dir: Path = PA_LIB_DIR) -> PerfAnalyzer:
    """Symlink perf_analyzer's two shared libraries under their sonames; idempotent and cheap."""
    binary = find_perf_analyzer_binary()
    lib_dir.mkdir(parents=True, exist_ok=True)
    libs = _pytriton_libs()
    for soname, pattern in PA_LIBS.items():
        link = lib_dir / soname
        if link.exists():
            continue
        source = next(iter(sorted(libs.glob(pattern))), None) if libs else None
        system = next((p for p in (Path("/usr/lib/x86_64-linux-gnu") / soname,) if p.exists()), None)
        source = source or system
        if source is None:
            raise ToolError(f"{soname} not found (looked in nvidia_pytriton.libs and the system): install "
                            "nvidia-pytriton==0.7.0 (pip install -e .) or Debian's libb64-0d / "
                            "pip nvidia-cuda-runtime-cu12")
        if link.is_symlink():
            link.unlink()  # dangling: the venv moved
        tmp = lib_dir / f".{soname}.{os.getpid()}"
        tmp.symlink_to(source)
        os.replace(tmp, link)
    pa = PerfAnalyzer(binary, lib_dir)
    check = subprocess.run([str(binary), "--version"], env=pa.env(), capture_output=True, text=True, timeout=30)
    if check.returncode != 0:
        raise ToolError(f"perf_analyzer does not run: {(check.stderr or check.stdout).strip()[:400]}")
    return pa


def perf_analyzer() -> PerfAnalyzer:
    return setup_perf_analyzer()


# ---------------------------------------------------------------------------------------------- genai-perf


def genai_perf_binary(venv: Path = GENAI_PERF_VENV) -> Path | None:
    binary = venv / "bin" / "genai-perf"
    return binary if binary.exists() else None


def setup_genai_perf(venv: Path = GENAI_PERF_VENV, python: str | None = None) -> Path:
    """Create the genai-perf venv (once; about 1 GB) and return the ``genai-perf`` executable."""
    if (binary := genai_perf_binary(venv)) is not None:
        return binary
    python = python or shutil.which("python3") or sys.executable
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run(pip + [f"genai-perf=={GENAI_PERF_VERSION}"], check=True)
    binary = genai_perf_binary(venv)
    if binary is None:
        raise ToolError(f"genai-perf was installed into {venv} but has no executable")
    return binary


def genai_perf_env(pa: PerfAnalyzer) -> dict[str, str]:
    """genai-perf runs perf_analyzer from PATH; it must never reach for a hub (offline machines)."""
    env = pa.env()
    env["PATH"] = os.pathsep.join([str(pa.binary.parent), env.get("PATH", "")])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env
