"""Engine manifest: written beside the engine; an engine whose manifest does not match the runtime is
refused with a message that says what differs and what to do."""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from builders.profile import ServingProfile
from builders.trtllm.gpus import lookup_gpu
from builders.repository import render_repository
from builders.trtllm.manifest import (
    MANIFEST_FILE,
    SKIP_CHECK_ENV,
    EngineManifest,
    EngineMismatch,
    RuntimeInfo,
    check_engine,
    check_repository,
    engine_problems,
    hash_checkpoint,
    manifest_from_engine,
    trtllm_engine_dirs,
)
from builders.trtllm.pins import TENSORRT_VERSION, TRTLLM_VERSION

FIX = Path(__file__).parent / "fixtures" / "trtllm"
H100 = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("H100"),))


@pytest.fixture
def engine(tmp_path) -> Path:
    d = tmp_path / "engine"
    shutil.copytree(FIX / "engines" / "llama3-8b-fp8-kvfp8", d)
    (d / "rank0.engine").write_bytes(b"\0" * 1024)
    m = manifest_from_engine(d, checkpoint_dir=FIX / "hf" / "llama-3-8b", runtime=H100, variant="fp8",
                             commands=["trtllm-build ..."])
    m.write(d)
    return d


def test_manifest_contents(engine):
    m = EngineManifest.read(engine)
    assert (m.trtllm_version, m.tensorrt_version) == (TRTLLM_VERSION, TENSORRT_VERSION)
    assert m.gpu_name == "NVIDIA H100 80GB HBM3" and m.compute_capability == "9.0"
    assert (m.quant_algo, m.kv_cache_quant_algo) == ("FP8", "FP8")
    assert m.limits == {"max_batch_size": 256, "max_input_len": 3072, "max_seq_len": 4096, "max_num_tokens": 8192,
                        "max_beam_width": 1}
    assert m.checkpoint_sha256 == hash_checkpoint(FIX / "hf" / "llama-3-8b") and len(m.checkpoint_sha256) == 64
    assert m.engine_files == {"rank0.engine": 1024} and m.tp_size == 1 and m.variant == "fp8"
    assert json.loads((engine / MANIFEST_FILE).read_text())["schema"] == 1


def test_matching_runtime_is_accepted(engine):
    assert check_engine(engine, H100).variant == "fp8"
    h200 = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("H200"),))
    assert engine_problems(engine, h200) == []  # same architecture, other part: servable


@pytest.mark.parametrize("runtime,needle", [
    (RuntimeInfo("1.1.0", TENSORRT_VERSION, (lookup_gpu("H100"),)),
     f"built with TensorRT-LLM {TRTLLM_VERSION}; this runtime has TensorRT-LLM 1.1.0"),
    (RuntimeInfo(TRTLLM_VERSION, "10.13.3.9", (lookup_gpu("H100"),)),
     f"built with TensorRT {TENSORRT_VERSION}; this runtime has TensorRT 10.13.3.9"),
    (RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("A100"),)),
     "built for compute capability 9.0 (NVIDIA H100 80GB HBM3); this machine's GPU is 8.0"),
    (RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, ()), "no NVIDIA GPU is visible"),
    (RuntimeInfo(None, None, (lookup_gpu("H100"),)), "TensorRT-LLM is not installed here"),
])
def test_mismatch_is_refused_with_a_clear_message(engine, runtime, needle):
    with pytest.raises(EngineMismatch) as err:
        check_engine(engine, runtime)
    msg = str(err.value)
    assert msg.startswith("refusing to serve a TensorRT-LLM engine")
    assert needle in msg
    assert "Rebuild the engine" in msg and "python -m builders engine --target trtllm --variant fp8" in msg


def test_missing_or_stale_manifest(engine, tmp_path, monkeypatch):
    cfg = json.loads((engine / "config.json").read_text())
    cfg["build_config"]["max_batch_size"] = 512
    (engine / "config.json").write_text(json.dumps(cfg))
    assert any("changed after the engine was built" in p for p in engine_problems(engine, H100))
    (engine / MANIFEST_FILE).unlink()
    with pytest.raises(EngineMismatch, match=f"has no {MANIFEST_FILE}.*{SKIP_CHECK_ENV}=1"):
        check_engine(engine, H100)
    monkeypatch.setenv(SKIP_CHECK_ENV, "1")
    assert check_engine(engine, H100) is None


def test_tp2_engine_needs_two_gpus(tmp_path):
    d = tmp_path / "tp2"
    shutil.copytree(FIX / "engines" / "llama3-8b-fp16-tp2", d)
    manifest_from_engine(d, checkpoint_dir=None, runtime=H100, variant="fp16").write(d)
    assert any("needs 2 GPUs (TP=2 × PP=1); 1 visible" in p for p in engine_problems(d, H100))
    two = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("H100"),) * 2)
    assert engine_problems(d, two) == []


def test_repository_check_is_what_the_launcher_calls(engine, tmp_path, monkeypatch):
    profile = ServingProfile(name="g", target="trtllm", engine_dir=engine, tokenizer_dir=tmp_path)
    repo = render_repository(profile, tmp_path / "repo")
    assert trtllm_engine_dirs(repo) == {"llm": engine}
    assert [m.variant for m in check_repository(repo, H100)] == ["fp8"]
    a100 = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("A100"),))
    with pytest.raises(EngineMismatch, match="model 'llm': refusing to serve"):
        check_repository(repo, a100)
    # a repository without TensorRT-LLM models (the CPU stack) passes without looking for a GPU
    cpu_repo = tmp_path / "cpu"
    shutil.copytree(repo / "preprocessing", cpu_repo / "preprocessing")
    assert check_repository(cpu_repo, RuntimeInfo(None, None, ())) == []

    # The container entry point refuses before exec'ing tritonserver (no GPU on this machine).
    from builders.trtllm.serve import serve_main

    monkeypatch.setattr("builders.trtllm.manifest.detect_runtime", lambda: a100)
    err = io.StringIO()
    with redirect_stderr(err):
        assert serve_main(["--model-repository", str(repo)]) == 1
    assert "this machine's GPU is 8.0" in err.getvalue()


def test_serve_prints_the_exec_command(engine, tmp_path, monkeypatch):
    from contextlib import redirect_stdout

    from builders.trtllm.serve import serve_main

    profile = ServingProfile(name="g", target="trtllm", engine_dir=engine, tokenizer_dir=tmp_path)
    repo = render_repository(profile, tmp_path / "repo")
    monkeypatch.setattr("builders.trtllm.manifest.detect_runtime", lambda: H100)
    out = io.StringIO()
    with redirect_stdout(out):
        assert serve_main(["--model-repository", str(repo), "--print-only", "--", "--log-verbose=1"]) == 0
    cmd = out.getvalue().split()
    assert cmd[0] == "/opt/tritonserver/bin/tritonserver"
    assert f"--model-repository={repo.resolve()}" in cmd and "--log-verbose=1" in cmd
    assert "--disable-auto-complete-config" in cmd and "--strict-readiness=true" in cmd
    assert any(a.endswith("admin-key=***") for a in cmd)  # the generated admin key is never printed
