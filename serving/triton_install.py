"""Where tritonserver and its Python backend come from, and the environment they run in.

Two installs are supported: the NGC container (``/opt/tritonserver``) and, everywhere else, the tritonserver
2.51 that ships inside the ``nvidia-pytriton`` wheel, whose Python backend folder is prepared here (the backend
looks for its stub next to ``libtriton_python.so``). The environment makes the stub embed exactly the
interpreter that runs the launcher (serving/stub_python.py says why that needs doing).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from serving.stub_python import StubPythonError, stub_environment

PROJECT_ROOT = Path(__file__).resolve().parent.parent
NGC_ROOT = Path("/opt/tritonserver")
DEFAULT_BACKEND_WORK_DIR = PROJECT_ROOT / "build" / "triton_backends"


class ServerStartError(RuntimeError):
    """tritonserver could not start or become ready; the message says why."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path
    lib_dir: Path | None = None  # prepended to LD_LIBRARY_PATH (wheel only)


def find_tritonserver(work_dir: Path | None = None) -> TritonInstall:
    """The NGC container's server if present, else the pytriton wheel's (backend dir prepared in work_dir)."""
    if (NGC_ROOT / "bin" / "tritonserver").exists():
        return TritonInstall(NGC_ROOT / "bin" / "tritonserver", NGC_ROOT / "backends")
    spec = importlib.util.find_spec("pytriton")  # locate without importing pytriton itself
    if spec is None or not spec.submodule_search_locations:
        raise ServerStartError(
            "no tritonserver found: /opt/tritonserver/bin/tritonserver is absent and nvidia-pytriton is not "
            "installed (make venv)"
        )
    pkg = Path(next(iter(spec.submodule_search_locations)))
    wheel = pkg / "tritonserver"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = wheel / "python_backend_stubs" / py / "triton_python_backend_stub"
    if not stub.exists():
        raise ServerStartError(f"nvidia-pytriton has no Python backend stub for Python {py} ({stub})")
    backend_dir = Path(work_dir or DEFAULT_BACKEND_WORK_DIR)
    python_dir = backend_dir / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    # The python backend looks for the stub next to libtriton_python.so, so all three live in one folder.
    for src in (wheel / "backends/python/libtriton_python.so",
                wheel / "backends/python/triton_python_backend_utils.py", stub):
        _copy_if_changed(src, python_dir / src.name)
    return TritonInstall(wheel / "bin" / "tritonserver", backend_dir, pkg.parent / "nvidia_pytriton.libs")


def _copy_if_changed(src: Path, dst: Path) -> None:
    s = src.stat()
    if dst.exists() and not dst.is_symlink():
        d = dst.stat()
        if d.st_size == s.st_size and int(d.st_mtime) == int(s.st_mtime):
            return
    # Copy then rename: a concurrently starting server never sees a half-written file.
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def server_env(install: TritonInstall, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for tritonserver: its own libraries (wheel install), and for the Python stub this
    interpreter, its standard library and its site-packages, whatever PATH or venv the caller had."""
    try:
        env = stub_environment(dict(os.environ if base is None else base))
    except StubPythonError as exc:
        raise ServerStartError(str(exc)) from None
    if install.lib_dir is not None:  # after libpython's folder: the wheel's libraries never shadow it
        libs = env["LD_LIBRARY_PATH"].split(os.pathsep)
        env["LD_LIBRARY_PATH"] = os.pathsep.join([libs[0], str(install.lib_dir), *libs[1:]])
    return env


def check_project_importable(env: dict[str, str]) -> None:
    """The models import this project from site-packages (the stub ignores PYTHONPATH and the working
    folder): check, in isolated mode as the stub runs, that this interpreter imports *this* checkout."""
    probe = subprocess.run([sys.executable, "-I", "-c", "import serving; print(serving.__file__)"], env=env,
                           cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    found = Path(probe.stdout.strip()).resolve().parent.parent if probe.returncode == 0 else None
    if found != PROJECT_ROOT:
        where = f"it imports the one in {found}" if found else "it cannot import it"
        raise ServerStartError(
            f"Triton's Python models import this project ({PROJECT_ROOT}) from the environment of "
            f"{sys.executable}, but {where}: install this checkout there (make venv, or pip install --no-deps "
            "-e . --config-settings editable_mode=compat)")
