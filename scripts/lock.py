"""The hash-pinned locks (README: "Dependencies and the lock"): make them, refuse stale ones, sync a venv to them.

    python3 scripts/lock.py write [--upgrade] [--upgrade-package P ...] [--torch-wheels DIR]   (`make lock`)
    python3 scripts/lock.py check                      (`make venv`, first: refuse locks made from other inputs)
    .venv/bin/python scripts/lock.py sync              (`make venv`, last: uninstall what the locks do not list)

requirements.lock         every package the environment installs, transitive ones included: pyproject.toml's
                          dependencies + dev extra, build-system.requires (setuptools) and pip, resolved together
requirements-server.lock  nvidia-pytriton (requirements-server.txt), locked and installed WITHOUT its dependencies:
                          its tritonclient[http] requirement pins geventhttpclient<=2.0.2, which conflicts with locust
requirements-gpu.lock     the GPU image's tool venv (Dockerfile): GPU_LOCK_PACKAGES at requirements.lock's versions,
                          resolved for the image's CPython 3.12

`write` resolves with uv (UV_VERSION, installed once into build/tools) and keeps the existing pins that still fit, so
editing one pin in pyproject.toml moves only what that needs. Each lock's header records a digest of the inputs
(`# inputs-sha256:`), which is how `check` tells a lock made from other inputs: file times cannot, since a git
checkout gives every file the time of the checkout.

Standard library only: `write` and `check` run with the system python3, before any venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ("requirements.lock", "requirements-server.lock", "requirements-gpu.lock")
ENV_LOCKS = LOCKS[:2]  # what the project's venv installs; the GPU lock is the image's
LOCK_TOOLS = ("pip",)  # locked with the project's requirements (build-system.requires come from pyproject.toml)
# Left out of the resolution itself: xgrammar (guided decoding) requires OpenAI's triton compiler on Linux x86_64, but
# only for its CUDA bitmask kernel (imported lazily, never on CPU); triton is a 200+ MB CUDA-stack wheel.
EXCLUDED = ("triton",)
GPU_LOCK_PACKAGES = ("pip", "tritonclient[grpc]", "protobuf", "pydantic", "pyyaml", "fastapi", "uvicorn", "httptools",
                     "prometheus-client")
UV_VERSION = "0.13.9"
UV_VENV = Path("build/tools") / f"uv-{UV_VERSION}"
WORK = Path("build/lock")  # where uv resolves, reading the committed locks there as its preferences
CPU_TARGET = ("--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36")
GPU_TARGET = ("--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_39")
# How every lock is installed (Makefile, Dockerfiles): each file's sha256 checked, nothing resolved, no source builds.
PIP_LOCKED = "--require-hashes --no-deps --only-binary :all:"
DIGEST_PREFIX = "# inputs-sha256: "

HEADERS = {
    "requirements.lock": """\
# requirements.lock: every package the project's environment installs, transitive ones included, pinned with sha256
# hashes. Made by `make lock` (uv {uv} pip compile) from pyproject.toml: its dependencies, the dev extra and
# build-system.requires (setuptools builds the editable install, without build isolation), plus pip itself.
# Do not edit: change a pin in pyproject.toml, run `make lock`, commit both (README: "Dependencies and the lock").
#
# Installed only hash-checked, resolving nothing (Makefile, Dockerfile.cpu):
#   pip install {pip_locked} -r requirements.lock -r requirements-server.lock
#   pip install --no-deps --no-build-isolation -e . --config-settings editable_mode=compat
#
# torch is PyTorch's CPU build (version +cpu). PyPI's torch for Linux is the multi-GB CUDA build with nvidia-*
# packages and must never enter this file (tests/test_lock.py checks). On our machines pip finds the CPU wheel in
# /opt/wheels (pip's find-links) and `make lock` recorded that file's hash. A machine without /opt/wheels gets the
# same file from PyTorch's CPU index, and the hash check proves it is the same bytes (pip refuses any other file):
#   export PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu   (then the same pip install)
# triton (OpenAI's GPU compiler, which xgrammar requires on Linux only for its CUDA kernel) is excluded from the
# resolution (scripts/lock.py EXCLUDED), so `pip check` reports "xgrammar ... requires triton, which is not installed".
# Resolved for CPython 3.11 on Linux x86_64, glibc 2.36 (Debian 12: our machines and the CPU image); each pin lists
# the hashes of all its published files, and pip installs only one whose hash is listed.
""",
    "requirements-server.lock": """\
# requirements-server.lock: nvidia-pytriton (requirements-server.txt: the tritonserver 2.51 binary, its Python
# backend and stubs), pinned with sha256 hashes and WITHOUT its dependencies. It is installed with --no-deps like
# every lock: we run only its binaries, and its own requirement tritonclient[http] pins geventhttpclient<=2.0.2,
# which conflicts with locust 2.47 (load tests). So `pip check` reports nvidia-pytriton's uninstalled requirements
# (importlib-metadata, sh, typing-inspect, wrapt: its Python API, which we do not use), and nothing else.
# Made by `make lock` (uv {uv} pip compile --no-deps); do not edit.
#   pip install {pip_locked} -r requirements.lock -r requirements-server.lock
""",
    "requirements-gpu.lock": """\
# requirements-gpu.lock: the project tools' venv in the GPU image (Dockerfile: builders/trtllm/tool_venv.sh on the
# TensorRT-LLM Triton image, from the Python that has tensorrt_llm): {gpu_packages} and their dependencies, at
# requirements.lock's versions, resolved for the image's CPython 3.12 (Linux x86_64, glibc 2.39), sha256-pinned.
# The image's own packages (TensorRT-LLM, its torch) come with the image and are not in any lock.
# Made by `make lock` (uv {uv} pip compile); do not edit.
#   pip install {pip_locked} -r requirements-gpu.lock
""",
}

STALE = ("{locks} {were} not made from the current pyproject.toml / requirements-server.txt (pins, dev extra, "
         "build-system): run 'make lock', then commit the lock files with them. Stale pins are not installed.")


def _pyproject(root: Path) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def inputs_digest(root: Path = ROOT) -> str:
    """sha256 of everything the locks are made from: pyproject.toml's requirements, requirements-server.txt and the
    packages this script adds (order-insensitive; comments and formatting do not count)."""
    project = _pyproject(root)
    server = [line.split("#")[0].strip() for line in (root / "requirements-server.txt").read_text().splitlines()]
    inputs = {"requires-python": project["project"]["requires-python"],
              "dependencies": sorted(project["project"]["dependencies"]),
              "dev": sorted(project["project"]["optional-dependencies"]["dev"]),
              "build-system": sorted(project["build-system"]["requires"]),
              "server": sorted(filter(None, server)),
              "lock": ["main:", *LOCK_TOOLS, "gpu:", *GPU_LOCK_PACKAGES, "excluded:", *EXCLUDED]}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def header(lock: str, digest: str) -> str:
    """The comment block written above a lock's pins, ending with its inputs digest."""
    text = HEADERS[lock].format(uv=UV_VERSION, pip_locked=PIP_LOCKED, gpu_packages=" ".join(GPU_LOCK_PACKAGES))
    return f"{text}{DIGEST_PREFIX}{digest}\n"


def stale_locks(root: Path = ROOT) -> list[str]:
    """The locks (missing ones included) whose header does not record the current inputs digest."""
    want = DIGEST_PREFIX + inputs_digest(root)
    stale = []
    for name in LOCKS:
        path = root / name
        if not path.is_file() or want not in path.read_text().splitlines():
            stale.append(name)
    return stale


def pinned_names(text: str) -> set[str]:
    """The PEP 503 names a lock pins (``name==version`` at the start of a line)."""
    return {_normalise(name) for name in re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==", text)}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pin_count(text: str) -> int:
    return len(re.findall(r"(?m)^[A-Za-z0-9].*==", text))


def ensure_uv(root: Path = ROOT) -> Path:
    """uv UV_VERSION in its own venv under build/tools (created once, with this interpreter's venv and pip)."""
    venv = root / UV_VENV
    uv = venv / "bin" / "uv"
    if uv.exists():
        return uv
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"], check=True)
    return uv


def torch_source(torch_wheels: str) -> list[str]:
    """Where torch's CPU build comes from: a folder holding its wheel (pip's find-links), else PyTorch's CPU index.
    PyPI's torch for Linux is the CUDA build: it must never be locked."""
    if torch_wheels and any(Path(torch_wheels).glob("torch-*+cpu-*.whl")):
        return ["--find-links", torch_wheels]
    return ["--torch-backend", "cpu"]


def write(upgrade: bool, upgrade_packages: Sequence[str], torch_wheels: str, root: Path = ROOT) -> None:
    """Resolve all three locks into build/lock, then write them with their headers over the committed ones."""
    uv = ensure_uv(root)
    work = root / WORK
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in LOCKS:  # the committed pins are uv's preferences: only what the inputs need moves
        if (root / name).is_file():
            shutil.copy(root / name, work / name)
    digest = inputs_digest(root)
    torch = torch_source(torch_wheels)
    print("lock: torch from", *torch)

    compile_ = [str(uv), "pip", "compile", "--quiet", "--generate-hashes", "--only-binary", ":all:", "--no-header",
                "--native-tls"]
    if upgrade:
        compile_.append("--upgrade")
    for package in upgrade_packages:
        compile_ += ["--upgrade-package", package]

    def run(args: Sequence[str], stdin: Sequence[str] = (), cwd: Path = root) -> None:
        subprocess.run([*compile_, *args], input="".join(f"{line}\n" for line in stdin), text=True, cwd=cwd,
                       check=True)

    main_extra = [*_pyproject(root)["build-system"]["requires"], *LOCK_TOOLS]  # "-": read from stdin
    excludes = work / "excludes.txt"
    excludes.write_text("".join(f"{name}\n" for name in EXCLUDED))
    run([*CPU_TARGET, *torch, "pyproject.toml", "--extra", "dev", "--excludes", f"{WORK}/excludes.txt", "-", "-o",
         f"{WORK}/requirements.lock"], main_extra)
    run([*CPU_TARGET, "--no-deps", "requirements-server.txt", "-o", f"{WORK}/requirements-server.lock"])
    # The GPU lock takes requirements.lock's versions (-c), resolved in build/lock so the annotations read the same.
    run([*GPU_TARGET, "-", "-c", "requirements.lock", "-o", "requirements-gpu.lock"], GPU_LOCK_PACKAGES, cwd=work)

    for name in LOCKS:
        (root / name).write_bytes(header(name, digest).encode() + (work / name).read_bytes())
    for name in LOCKS:
        print(f"{name}: {_pin_count((root / name).read_text())} pinned")


def check(root: Path = ROOT) -> int:
    """0 when every lock was made from the current inputs; else says which are stale and returns 1."""
    stale = stale_locks(root)
    if stale:
        print("error:", STALE.format(locks=", ".join(stale), were="was" if len(stale) == 1 else "were"),
              file=sys.stderr)
        return 1
    return 0


def sync(root: Path = ROOT) -> None:
    """Uninstall from this interpreter's environment what the venv's locks do not list (left over from an older
    lock), the project itself excepted, so the venv is the lock."""
    locked = set().union(*(pinned_names((root / name).read_text()) for name in ENV_LOCKS))
    locked.add(_normalise(_pyproject(root)["project"]["name"]))
    installed = {_normalise(d.metadata["Name"]) for d in md.distributions() if d.metadata["Name"]}
    extra = sorted(installed - locked)
    if extra:
        print("uninstalling what the lock does not list:", *extra)
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "--yes", *extra], check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write_ = commands.add_parser("write", help="resolve and write the three locks (make lock)")
    write_.add_argument("--upgrade", action="store_true", help="re-resolve everything, ignoring the existing pins")
    write_.add_argument("--upgrade-package", action="append", default=[], metavar="P",
                        help="re-resolve only P (repeatable)")
    write_.add_argument("--torch-wheels", default="/opt/wheels", metavar="DIR",
                        help="a folder holding torch's +cpu wheel (default %(default)s; '' or no wheel there: "
                             "PyTorch's CPU index)")
    commands.add_parser("check", help="fail unless every lock was made from the current inputs")
    commands.add_parser("sync", help="uninstall what the locks do not list from this interpreter's environment")
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            write(args.upgrade, args.upgrade_package, args.torch_wheels)
        elif args.command == "check":
            return check()
        else:
            sync()
    except subprocess.CalledProcessError as error:
        print(f"error: {' '.join(map(str, error.cmd))} exited with {error.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
