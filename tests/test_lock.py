"""The environment is the lock (README: "Dependencies and the lock").

- every distribution installed in this interpreter's environment is pinned, at that version, in requirements.lock
  or requirements-server.lock, and every pin there is installed (the project itself is the one exception);
- every entry of every lock is an exact ``name==version`` pin with at least one sha256 hash, and nothing else
  (no index or find-links lines, no editable or URL requirements) — what ``pip install --require-hashes`` needs;
- no CUDA package can enter: no ``nvidia-*`` (except nvidia-pytriton, the tritonserver wheel), no ``cuda-*``, no
  OpenAI ``triton`` compiler, and torch is the ``+cpu`` build;
- the locks satisfy every pin in pyproject.toml and requirements-server.txt (a pin edited without ``make lock``
  fails here as well as in ``make venv``);
- scripts/lock.py (``make lock``, ``make venv``'s stale check and sync) agrees with the locks and the Makefile.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
ENV_LOCKS = ("requirements.lock", "requirements-server.lock")  # what `make venv` installs
ALL_LOCKS = (*ENV_LOCKS, "requirements-gpu.lock")  # + the GPU image's tool venv (Dockerfile)
PROJECT = "triton-llm-stack"  # installed editable from the checkout, not from a lock
SERVER_WHEEL = "nvidia-pytriton"  # the one nvidia-* package allowed: tritonserver 2.51 for CPU, no CUDA inside



def _load_lock_script():
    spec = importlib.util.spec_from_file_location("lock_script", ROOT / "scripts" / "lock.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOCK_PY = _load_lock_script()  # scripts/lock.py: `make lock`, and `make venv`'s check and sync
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9.+!_-]+)$")
_HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


@dataclass
class Entry:
    name: str  # PEP 503 normalised
    version: str
    hashes: list[str]
    line: int  # where the entry starts in its file (1-based)


@dataclass
class Lock:
    path: Path
    entries: dict[str, Entry] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def parse_lock(path: Path) -> Lock:
    """Read a pip requirements file the way ``pip install --require-hashes`` must find it: one exact pin per
    logical line (backslash continuations joined), each with its ``--hash=sha256:`` options; everything that is not
    such an entry is a problem."""
    lock = Lock(path)
    logical: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        logical.append((start, pending + raw))
        pending = ""
    if pending:
        logical.append((start, pending))
    for number, text in logical:
        text = re.sub(r"(^|\s)#.*$", "", text).strip()  # comments: whole lines and trailing " # ..."
        if not text:
            continue
        requirement, *options = text.split()
        where = f"{path.name}:{number}"
        pin = _PIN.match(requirement)
        if pin is None:
            lock.problems.append(f"{where}: {requirement!r} is not an exact name==version pin")
            continue
        name = canonicalize_name(pin["name"])
        hashes = [o for o in options if _HASH.match(o)]
        others = [o for o in options if not _HASH.match(o)]
        if not hashes:
            lock.problems.append(f"{where}: {requirement} has no --hash=sha256:")
        if others:
            lock.problems.append(f"{where}: {requirement} carries {' '.join(others)} (only --hash=sha256: belongs)")
        if name in lock.entries:
            lock.problems.append(f"{where}: {name} pinned twice (also line {lock.entries[name].line})")
        lock.entries[name] = Entry(name, pin["version"], hashes, number)
    return lock


def read_locks(names=ENV_LOCKS) -> dict[str, Entry]:
    pins: dict[str, Entry] = {}
    for name in names:
        for entry in parse_lock(ROOT / name).entries.values():
            assert entry.name not in pins, f"{entry.name} is pinned in two of {names}"
            pins[entry.name] = entry
    return pins


def installed_distributions() -> dict[str, set[str]]:
    """Every distribution importlib.metadata finds on this interpreter's sys.path as a fresh process has it:
    name -> versions. Not this process's: importing setuptools (AOTInductor's compile does) appends its vendored
    packages' folder to sys.path, and they are setuptools' insides, not installed distributions."""
    fresh = json.loads(subprocess.run([sys.executable, "-P", "-c", "import json, sys; print(json.dumps(sys.path))"],
                                      capture_output=True, text=True, check=True).stdout)
    found: dict[str, set[str]] = {}
    for dist in md.distributions(path=fresh):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), set()).add(dist.version)
    return found


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def environment_differences(installed: dict[str, set[str]], locked: dict[str, str],
                            allowed: frozenset[str] = frozenset({PROJECT})) -> list[str]:
    """Both directions: pinned but not installed, installed but not pinned, installed at another version."""
    installed = {canonicalize_name(k): v for k, v in installed.items()}
    locked = {canonicalize_name(k): v for k, v in locked.items()}
    out = []
    for name in sorted(locked.keys() - installed.keys()):
        out.append(f"missing    {name}=={locked[name]} is in the lock but not installed")
    for name in sorted(installed.keys() - locked.keys() - allowed):
        out.append(f"extra      {name} {', '.join(sorted(installed[name]))} is installed but not in the lock")
    for name in sorted(installed.keys() & locked.keys()):
        versions = installed[name]
        if len(versions) > 1:
            out.append(f"twice      {name} is installed at {', '.join(sorted(versions))}; the lock has {locked[name]}")
        elif not _same_version(next(iter(versions)), locked[name]):
            out.append(f"different  {name} is installed at {next(iter(versions))}; the lock has {locked[name]}")
    return out


def cuda_problems(lock: Lock) -> list[str]:
    out = []
    for entry in lock.entries.values():
        where = f"{lock.path.name}:{entry.line}: {entry.name}=={entry.version}"
        if entry.name.startswith("nvidia-") and entry.name != SERVER_WHEEL:
            out.append(f"{where} is a CUDA package")
        elif entry.name.startswith("cuda-") or entry.name == "triton":
            out.append(f"{where} belongs to the CUDA stack")
        elif entry.name == "torch" and Version(entry.version).local != "cpu":
            out.append(f"{where} is not the CPU build (+cpu): PyPI's Linux torch is the CUDA build")
    return out


# ---- the real environment and the real lock files ----

@pytest.mark.parametrize("name", ALL_LOCKS)
def test_every_lock_entry_is_an_exact_pin_with_hashes(name):
    lock = parse_lock(ROOT / name)
    assert lock.entries, f"{name} pins nothing"
    if lock.problems:
        pytest.fail(f"{name} cannot be installed with --require-hashes as it is:\n  " + "\n  ".join(lock.problems) +
                    "\nRegenerate it with `make lock`.", pytrace=False)


def test_locks_hold_no_cuda_package():
    locks = [parse_lock(ROOT / name) for name in ALL_LOCKS]
    main = locks[0]
    assert "torch" in main.entries, "requirements.lock has no torch: the +cpu check below would check nothing"
    assert len(main.entries) > 50, f"requirements.lock pins only {len(main.entries)} packages: parsed wrong?"
    assert "torch" not in locks[2].entries, "the GPU image uses its own torch: requirements-gpu.lock must not pin one"
    problems = [p for lock in locks for p in cuda_problems(lock)]
    if problems:
        pytest.fail("CUDA packages in the locks (README: Dependencies and the lock):\n  " + "\n  ".join(problems),
                    pytrace=False)


def test_environment_matches_the_lock():
    locked = {name: entry.version for name, entry in read_locks().items()}
    differences = environment_differences(installed_distributions(), locked)
    if differences:
        pytest.fail(f"The environment of {sys.executable} differs from {' + '.join(ENV_LOCKS)} "
                    f"({len(differences)} difference(s)):\n  " + "\n  ".join(differences) +
                    "\nRebuild it from the lock: rm -f .venv/.installed && make venv  (after `make lock` if a pin "
                    "changed)", pytrace=False)


def test_locks_satisfy_pyproject_and_requirements_server():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["dev"],
              *project["build-system"]["requires"]]
    wanted += [line.split("#")[0].strip() for line in (ROOT / "requirements-server.txt").read_text().splitlines()]
    pins = read_locks()
    problems = []
    for text in filter(None, wanted):
        req = Requirement(text)
        entry = pins.get(canonicalize_name(req.name))
        if entry is None:
            problems.append(f"{text}: not in the lock")
        elif not req.specifier.contains(entry.version, prereleases=True):
            problems.append(f"{text}: the lock has {entry.version}")
    if problems:
        pytest.fail("The locks are older than their inputs; run `make lock`:\n  " + "\n  ".join(problems),
                    pytrace=False)


def test_excluded_requirements_stay_out_and_count_as_an_input(monkeypatch):
    """xgrammar's triton requirement (CUDA kernels only) is left out of the resolution; changing what is left out
    makes the locks stale like a pin change."""
    for name in ALL_LOCKS:
        assert not set(map(canonicalize_name, LOCK_PY.EXCLUDED)) & parse_lock(ROOT / name).entries.keys(), name
    assert "xgrammar" in parse_lock(ROOT / "requirements.lock").entries
    digest = LOCK_PY.inputs_digest(ROOT)
    monkeypatch.setattr(LOCK_PY, "EXCLUDED", ())
    assert LOCK_PY.inputs_digest(ROOT) != digest


def test_gpu_lock_uses_the_main_lock_versions():
    main, gpu = parse_lock(ROOT / "requirements.lock").entries, parse_lock(ROOT / "requirements-gpu.lock").entries
    problems = [f"{n}: requirements-gpu.lock {e.version}, requirements.lock {main[n].version if n in main else '-'}"
                for n, e in sorted(gpu.items()) if n not in main or main[n].version != e.version]
    assert not problems, "\n".join(problems)


def _find_links() -> list[Path]:
    dirs = os.environ.get("PIP_FIND_LINKS", "").split() + ["/opt/wheels"]
    return [Path(d) for d in dict.fromkeys(dirs) if Path(d).is_dir()]


def test_torch_hash_is_the_cpu_wheel_pip_finds_here():
    torch = parse_lock(ROOT / "requirements.lock").entries["torch"]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = [w for d in _find_links() for w in d.glob(f"torch-{torch.version}-{tag}-*.whl")]
    if not wheels:
        pytest.skip(f"no torch-{torch.version}-{tag} wheel in a find-links folder here (it comes from PyTorch's "
                    "CPU index elsewhere; pip checks its hash at install)")
    for wheel in wheels:
        with wheel.open("rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        assert f"--hash=sha256:{digest}" in torch.hashes, f"{wheel} (sha256 {digest}) is not the torch in the lock"


# ---- the checks themselves can fail ----

def test_difference_report_names_every_kind():
    installed = {"Flask_Login": {"0.6.3"}, "numpy": {"2.0.0"}, "six": {"1.17.0"}, PROJECT: {"0.1.0"},
                 "zope.event": {"6.2"}, "torch": {"2.13.0+cpu", "2.13.0"}}
    locked = {"flask-login": "0.6.3", "numpy": "1.26.4", "pyyaml": "6.0.3", "zope-event": "6.2", "torch": "2.13.0+cpu"}
    report = environment_differences(installed, locked)
    assert report == ["missing    pyyaml==6.0.3 is in the lock but not installed",
                      "extra      six 1.17.0 is installed but not in the lock",
                      "different  numpy is installed at 2.0.0; the lock has 1.26.4",
                      "twice      torch is installed at 2.13.0, 2.13.0+cpu; the lock has 2.13.0+cpu"]
    assert environment_differences({"torch": {"2.13.0"}}, {"torch": "2.13.0+cpu"}) == \
        ["different  torch is installed at 2.13.0; the lock has 2.13.0+cpu"]


def test_parser_flags_what_require_hashes_would_refuse(tmp_path):
    good = "--hash=sha256:" + "a" * 64
    path = tmp_path / "bad.lock"
    path.write_text("\n".join([
        "# a comment", "--index-url https://example.invalid/simple", "six==1.17.0 \\", f"    {good}",
        "    # via something", "requests>=2", "pip==26.3", f"-e . {good}", f"six==1.17.0 {good}",
        f"zope.event==6.2 {good} --no-binary", "",
    ]))
    lock = parse_lock(path)
    assert [p.split(": ", 1)[0] for p in lock.problems] == [f"bad.lock:{n}" for n in (2, 6, 7, 8, 9, 10)]
    assert lock.entries["six"].hashes == [good] and lock.entries["zope-event"].version == "6.2"
    torch_cuda = Lock(path, {"torch": Entry("torch", "2.13.0", [good], 1),
                             "nvidia-cublas": Entry("nvidia-cublas", "13.1.0", [good], 2),
                             SERVER_WHEEL: Entry(SERVER_WHEEL, "0.7.0", [good], 3),
                             "triton": Entry("triton", "3.5.0", [good], 4)})
    assert [p.split(": ")[1] for p in cuda_problems(torch_cuda)] == \
        ["torch==2.13.0 is not the CPU build (+cpu)", "nvidia-cublas==13.1.0 is a CUDA package",
         "triton==3.5.0 belongs to the CUDA stack"]


# ---- scripts/lock.py: what `make lock` writes, `make venv` checks and syncs ----

def test_each_lock_starts_with_the_header_make_lock_writes():
    """The header text is lock.py's, and its digest is of the current inputs: `make venv` accepts the lock."""
    digest = LOCK_PY.inputs_digest(ROOT)
    wrong = [name for name in ALL_LOCKS if not (ROOT / name).read_text().startswith(LOCK_PY.header(name, digest))]
    if wrong:
        pytest.fail(f"{', '.join(wrong)}: the header is not what scripts/lock.py writes for the current "
                    "pyproject.toml / requirements-server.txt; run `make lock` and commit both", pytrace=False)


def test_stale_check_refuses_a_lock_made_from_other_inputs(tmp_path, capsys):
    for name in (*ALL_LOCKS, "pyproject.toml", "requirements-server.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "# a comment changes no input\n")
    assert LOCK_PY.stale_locks(tmp_path) == [] and LOCK_PY.check(tmp_path) == 0
    pyproject.write_text(pyproject.read_text().replace("dependencies = [", 'dependencies = [\n  "six==1.17.0",', 1))
    assert LOCK_PY.stale_locks(tmp_path) == list(ALL_LOCKS)
    assert LOCK_PY.check(tmp_path) == 1 and "run 'make lock'" in capsys.readouterr().err
    shutil.copy(ROOT / "pyproject.toml", pyproject)
    (tmp_path / "requirements-gpu.lock").unlink()
    assert LOCK_PY.stale_locks(tmp_path) == ["requirements-gpu.lock"]


def test_sync_reads_the_same_names_as_this_parser():
    for name in ALL_LOCKS:
        assert LOCK_PY.pinned_names((ROOT / name).read_text()) == set(parse_lock(ROOT / name).entries), name
    assert LOCK_PY.pinned_names("# c\nZope.Event==6.2 \\\n    # via x\nflask_login==0.6.3\n  six==1\n") == \
        {"zope-event", "flask-login"}


def test_makefile_installs_the_way_the_lock_headers_say():
    makefile = " ".join((ROOT / "Makefile").read_text().replace("\\\n", " ").split())
    command = f"-m pip install --quiet {LOCK_PY.PIP_LOCKED} -r requirements.lock -r requirements-server.lock"
    assert command in makefile, "the Makefile's pip flags and scripts/lock.py's PIP_LOCKED (lock headers) differ"


def test_torch_comes_from_a_cpu_wheel_folder_or_the_cpu_index(tmp_path):
    assert LOCK_PY.torch_source(str(tmp_path)) == LOCK_PY.torch_source("") == ["--torch-backend", "cpu"]
    (tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").touch()
    assert LOCK_PY.torch_source(str(tmp_path)) == ["--find-links", str(tmp_path)]
