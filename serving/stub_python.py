"""The Python inside Triton's Python-backend stub is the launcher's own interpreter, or the model refuses to load.

The stub (``triton_python_backend_stub``) embeds Python through ``libpython3.X.so.1.0`` with an *isolated*
configuration: it ignores PYTHONPATH and PYTHONHOME, and finds its prefix (standard library, C extension
modules, site-packages) by looking up ``python3`` on PATH, a venv's ``pyvenv.cfg`` included. The dynamic
loader picks the library itself by LD_LIBRARY_PATH, then ld.so.cache. Left to themselves the two need not
agree: with a pyenv 3.11.7 venv activated, the stub loaded Debian's libpython 3.11.2 and 3.11.7's standard
library, and ``import ssl`` died on ``undefined symbol: _PyModule_Add``.

So the launcher decides both from the interpreter it runs in (:func:`stub_environment`): this environment's
``bin`` first on PATH (the stub then takes this venv's prefix and site-packages, and with them the project's
editable install: no ``sys.path`` edits in model files) and this interpreter's own shared library first on
LD_LIBRARY_PATH. Each model then checks at start-up that it got exactly that (:func:`check_stub`).

Standard library only: the check must import before anything that loads a C extension.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path

#: The launcher's interpreter, as the models must see it (JSON of :class:`PythonIdentity`).
EXPECTED_ENV = "TRITON_LLM_STUB_PYTHON"


class StubPythonError(RuntimeError):
    """This interpreter cannot be the stub's, or the stub runs another one; the message says what to do."""


@dataclass(frozen=True)
class PythonIdentity:
    version: str
    prefix: str
    libpython: str | None  # resolved path of the loaded (or to-be-loaded) libpython

    def describe(self) -> str:
        return f"Python {self.version} (prefix {self.prefix}, {self.libpython or 'no shared libpython'})"


def _loaded_libpython() -> str | None:
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libpython" in line}
    except OSError:
        return None
    return os.path.realpath(sorted(paths)[0]) if paths else None


def running() -> PythonIdentity:
    """The interpreter of this process (inside the stub: the one it embedded)."""
    return PythonIdentity(platform.python_version(), os.path.realpath(sys.prefix), _loaded_libpython())


def shared_library() -> Path:
    """The shared libpython of this interpreter, which the stub must load for its stdlib to match."""
    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    lib = Path(libdir or "") / (soname or "")
    if not libdir or not soname or not soname.startswith("libpython") or not lib.is_file():
        raise StubPythonError(
            f"Python {platform.python_version()} at {sys.base_prefix} has no shared library {soname or 'libpython'} "
            f"in {libdir}: Triton's Python backend embeds Python through it. Use a Python built with "
            "--enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.11; Debian: "
            "apt-get install libpython3.11) and recreate the venv (rm -rf .venv && make venv)")
    return lib


def expected() -> PythonIdentity:
    """What the stub runs once it gets :func:`stub_environment`: this interpreter with its own libpython."""
    return PythonIdentity(platform.python_version(), os.path.realpath(sys.prefix),
                          os.path.realpath(shared_library()))


def _bin_dir() -> Path:
    """The folder whose ``python3`` is this interpreter (a venv's ``bin``): the stub looks python3 up on PATH."""
    exe = Path(sys.executable)
    candidate = exe.parent / "python3"
    if not (candidate.exists() and os.path.samefile(candidate, exe)):
        raise StubPythonError(
            f"{exe.parent} has no python3 that is {exe}: Triton's Python stub finds its environment through "
            "'python3' on PATH; run the launcher from a venv (make serve does) or with a python3 executable")
    return exe.parent


def _prepend(value: str | None, first: str) -> str:
    rest = [p for p in (value or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join([first, *rest])


def stub_environment(env: dict[str, str]) -> dict[str, str]:
    """``env`` changed so that the stub embeds exactly this interpreter (see the module docstring)."""
    out = dict(env)
    out["PATH"] = _prepend(out.get("PATH"), str(_bin_dir()))
    out["LD_LIBRARY_PATH"] = _prepend(out.get("LD_LIBRARY_PATH"), str(shared_library().parent))
    for ignored in ("PYTHONHOME", "PYTHONPATH"):  # the isolated stub ignores them: do not suggest otherwise
        out.pop(ignored, None)
    out[EXPECTED_ENV] = json.dumps(asdict(expected()))
    return out


def check_stub(model_name: str) -> str:
    """Raise :class:`StubPythonError` unless this stub runs the launcher's interpreter; else a line to log.

    Without the launcher (tritonserver started by hand, the GPU image) nothing is expected: only reported.
    """
    have = running()
    raw = os.environ.get(EXPECTED_ENV)
    if not raw:
        return f"model '{model_name}' runs {have.describe()}"
    want = PythonIdentity(**json.loads(raw))
    if have != want:
        raise StubPythonError(
            f"model '{model_name}' runs {have.describe()}, but the server was started from {want.describe()}: "
            "start it with `make serve` or `python -m serving serve` from the project's environment, so that "
            "Triton's Python stub loads that interpreter (README: supported ways to start)")
    return f"model '{model_name}' runs {have.describe()}, the launcher's interpreter"
