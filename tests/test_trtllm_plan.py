"""TensorRT-LLM build plan on CPU: every variant × GPU either plans with the documented flags or is refused
with an actionable message. Nothing of TensorRT-LLM is installed or imported."""

from __future__ import annotations

import io
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from builders.trtllm.build import engine_main
from builders.trtllm.gpus import UnsupportedOnGpu, check_variant, lookup_gpu, parse_nvidia_smi
from builders.trtllm.plan import BuildLimits, make_plan, plan_commands, predict_engine_config
from builders.trtllm.variants import VARIANTS

FIXTURES = Path(__file__).parent / "fixtures" / "trtllm"
LLAMA2 = FIXTURES / "hf" / "llama-2-7b"
LLAMA3 = FIXTURES / "hf" / "llama-3-8b"
GPUS = {"A10": (8, 6), "L4": (8, 9), "A100": (8, 0), "H100": (9, 0)}

# The flags each tool accepts in TensorRT-LLM 1.2 (argparse of convert_checkpoint.py / quantize.py /
# tensorrt_llm/commands/build.py + plugin arguments; sources in docs/gpu.md). Whatever we emit must be here.
CONVERT_FLAGS = {"--model_dir", "--output_dir", "--dtype", "--tp_size", "--pp_size", "--workers",
                 "--use_weight_only", "--weight_only_precision", "--int8_kv_cache", "--fp8_kv_cache",
                 "--calib_dataset", "--smoothquant", "--per_channel", "--per_token"}
QUANTIZE_FLAGS = {"--model_dir", "--output_dir", "--dtype", "--qformat", "--kv_cache_dtype", "--calib_dataset",
                  "--calib_size", "--calib_max_seq_length", "--batch_size", "--tp_size", "--pp_size", "--seed",
                  "--awq_block_size", "--device"}
BUILD_FLAGS = {"--checkpoint_dir", "--output_dir", "--max_batch_size", "--max_input_len", "--max_seq_len",
               "--max_num_tokens", "--max_beam_width", "--workers", "--gemm_plugin", "--gpt_attention_plugin",
               "--kv_cache_type", "--tokens_per_block", "--remove_input_padding", "--context_fmha",
               "--use_paged_context_fmha", "--use_fp8_context_fmha", "--multiple_profiles"}
QFORMATS = {"nvfp4", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "full_prec"}


def flags(argv) -> dict[str, str | None]:
    out, i = {}, 0
    argv = list(argv)
    while i < len(argv):
        if argv[i].startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            out[argv[i]] = nxt
            i += 2 if nxt is not None else 1
        else:
            i += 1
    return out


def supported(variant: str, gpu: str) -> bool:
    return not (variant == "fp8" and GPUS[gpu] < (8, 9))  # FP8 needs Ada (8.9); the rest runs on Ampere and up


@pytest.mark.parametrize("gpu", sorted(GPUS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_plan_per_variant_and_gpu(variant, gpu, tmp_path):
    spec = lookup_gpu(gpu)
    assert spec.compute_capability == GPUS[gpu]
    if not supported(variant, gpu):
        with pytest.raises(UnsupportedOnGpu) as err:
            make_plan(LLAMA2, tmp_path, variant, spec)
        msg = str(err.value)
        assert f"needs compute capability ≥ 8.9; this GPU is {spec.cc} ({gpu}): use int8_sq or int8_wo" in msg
        return
    plan = make_plan(LLAMA2, tmp_path, variant, spec, tp_size=2, workers=2)
    convert, build = plan_commands(plan)
    v = VARIANTS[variant]
    cf = flags(convert.argv)
    assert convert.env["HF_HUB_OFFLINE"] == "1" and convert.env["HF_DATASETS_OFFLINE"] == "1"
    if v.tool == "convert":
        assert convert.argv[1].endswith("examples/models/core/llama/convert_checkpoint.py")
        assert set(cf) <= CONVERT_FLAGS
        assert ("--use_weight_only" in cf) == (variant == "int8_wo")
        if variant == "int8_wo":
            assert cf["--weight_only_precision"] == "int8"
    else:
        assert convert.argv[1].endswith("examples/quantization/quantize.py")
        assert set(cf) <= QUANTIZE_FLAGS
        assert cf["--qformat"] == v.qformat and v.qformat in QFORMATS
        assert cf["--calib_dataset"] == str(plan.calib_dir)  # a local directory, never a hub name
        assert cf["--calib_size"] == "512"
    # TP/PP are fixed at conversion time, not at build time
    assert cf["--tp_size"] == "2" and cf["--pp_size"] == "1"
    assert cf["--dtype"] == ("bfloat16" if variant == "bf16" else "float16")

    bf = flags(build.argv)
    assert build.argv[0] == "trtllm-build"
    assert set(bf) <= BUILD_FLAGS
    for required in ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens", "--gemm_plugin",
                     "--use_paged_context_fmha", "--use_fp8_context_fmha", "--multiple_profiles", "--workers"):
        assert required in bf, required
    assert "--tp_size" not in bf
    assert bf["--gemm_plugin"] == ("disable" if variant == "fp8" else cf["--dtype"])
    assert bf["--use_paged_context_fmha"] == "enable"
    # Without an FP8 KV cache the builder turns FP8 context FMHA off (builder.py: build), on H100 too.
    assert bf["--use_fp8_context_fmha"] == "disable"
    assert bf["--multiple_profiles"] == "enable"
    assert bf["--workers"] == "2"
    assert bf["--kv_cache_type"] == "paged"
    lim = BuildLimits()
    assert (bf["--max_batch_size"], bf["--max_input_len"], bf["--max_seq_len"], bf["--max_num_tokens"]) == tuple(
        str(x) for x in (lim.max_batch_size, lim.max_input_len, lim.max_seq_len, lim.max_num_tokens))

    cfg = predict_engine_config(plan)
    assert cfg["pretrained_config"]["quantization"]["quant_algo"] == v.quant_algo
    assert cfg["pretrained_config"]["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1, "cp_size": 1,
                                                   "gpus_per_node": 8}


@pytest.mark.parametrize("gpu,kv,ok", [("A100", "fp8", False), ("A10", "fp8", False), ("L4", "fp8", True),
                                       ("H100", "fp8", True), ("A100", "int8", True)])
def test_kv_cache_dtype_gate(gpu, kv, ok, tmp_path):
    spec = lookup_gpu(gpu)
    if ok:
        plan = make_plan(LLAMA2, tmp_path, "int4_awq", spec, kv_cache_dtype=kv)
        q = flags(plan_commands(plan)[0].argv)
        assert q["--kv_cache_dtype"] == kv
        assert predict_engine_config(plan)["pretrained_config"]["quantization"]["kv_cache_quant_algo"] == kv.upper()
        # W4A16_AWQ is not the builder's FP8 workflow: no FP8 context FMHA, and with a quantized KV cache (FP8
        # or INT8) no paged context FMHA either (builder.py: build)
        bf = flags(plan_commands(plan)[1].argv)
        assert bf["--use_fp8_context_fmha"] == "disable" and bf["--use_paged_context_fmha"] == "disable"
    else:
        with pytest.raises(UnsupportedOnGpu, match=rf"FP8 KV cache needs compute capability ≥ 8.9; this GPU is "
                                                  rf"{spec.cc} \({gpu}\)"):
            check_variant("int4_awq", spec, kv)


def test_unsupported_combinations_are_refused(tmp_path):
    with pytest.raises(UnsupportedOnGpu, match="supports compute capability ≥ 8.0"):
        make_plan(LLAMA2, tmp_path, "fp16", lookup_gpu("T4"))
    with pytest.raises(ValueError, match="needs calibration"):
        make_plan(LLAMA2, tmp_path, "int8_wo", lookup_gpu("H100"), kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="must divide num_attention_heads"):
        make_plan(LLAMA2, tmp_path, "fp16", lookup_gpu("H100"), tp_size=3)
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        make_plan(LLAMA2, tmp_path, "fp16", lookup_gpu("H100"), limits=BuildLimits(max_seq_len=8192))
    with pytest.raises(ValueError, match="max_num_tokens"):
        make_plan(LLAMA2, tmp_path, "fp16", lookup_gpu("H100"),
                  limits=BuildLimits(max_batch_size=64, max_num_tokens=32))
    with pytest.raises(ValueError, match="unknown GPU"):
        lookup_gpu("Z9000")
    assert lookup_gpu("X:8.9:48").compute_capability == (8, 9)


def test_nvidia_smi_parsing():
    gpus = parse_nvidia_smi("NVIDIA H100 80GB HBM3, 9.0, 81559\nNVIDIA H100 80GB HBM3, 9.0, 81559\n")
    assert len(gpus) == 2 and gpus[0].cc == "9.0" and gpus[0].short_name == "H100"
    assert gpus[0].memory_bytes == 81559 * 1024**2


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = engine_main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_dry_run_prints_commands_and_repository(tmp_path):
    budget = tmp_path / "budget.json"
    rc, out, err = _run(["--target", "trtllm", "--checkpoint", str(LLAMA3), "--output", str(tmp_path / "out"),
                         "--variant", "fp8", "--kv-cache-dtype", "fp8", "--gpu", "H100", "--profile", "throughput",
                         "--server-root", "/engines/llama", "--budget-json", str(budget), "--dry-run"])
    assert rc == 0, err
    assert "python -m builders.trtllm calibration" in out
    assert "examples/quantization/quantize.py" in out and "--qformat fp8" in out and "--kv_cache_dtype fp8" in out
    assert "trtllm-build --checkpoint_dir" in out and "--use_fp8_context_fmha enable" in out
    assert "--max_batch_size 256" in out  # the throughput profile's limits
    for model in ("preprocessing", "llm", "ensemble"):
        assert f"## {model}/config.pbtxt" in out
    assert 'string_value: "/engines/llama/engine"' in out
    assert "KV per token" in out and budget.exists()
    assert not (tmp_path / "out").exists(), "a dry run must not write the build output"


def test_dry_run_refusal_is_actionable(tmp_path):
    rc, out, err = _run(["--checkpoint", str(LLAMA2), "--output", str(tmp_path), "--variant", "fp8", "--gpu", "A100",
                         "--dry-run"])
    assert rc == 2
    assert "FP8 needs compute capability ≥ 8.9; this GPU is 8.0 (A100): use int8_sq or int8_wo" in err


def test_no_tensorrt_llm_import():
    assert "tensorrt_llm" not in sys.modules and "tensorrt" not in sys.modules


def test_build_path_with_stand_in_tools(tmp_path, monkeypatch):
    """The non-dry-run path end to end, with TensorRT-LLM's tools replaced by stand-ins that write what
    they would (this is as far as a machine without a GPU can go)."""
    import subprocess

    from builders.trtllm import build as build_mod
    from builders.trtllm.gpus import lookup_gpu
    from builders.trtllm.layout import OPTIONS_FILE
    from builders.trtllm.manifest import EngineManifest, RuntimeInfo, check_repository
    from builders.trtllm.pins import TENSORRT_VERSION, TRTLLM_VERSION

    runtime = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("L4"),))
    monkeypatch.setattr("builders.trtllm.manifest.detect_runtime", lambda: runtime)
    ran = []

    def fake_run(argv, env=None, check=False):
        ran.append(argv)
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"
        f = flags(argv)
        if argv[0] == "trtllm-build":
            import json as _json

            plan = build_mod.plan_from_args(args)[0]
            engine = Path(f["--output_dir"])
            engine.mkdir(parents=True)
            (engine / "config.json").write_text(_json.dumps(predict_engine_config(plan)))
            (engine / "rank0.engine").write_bytes(b"engine")
        else:
            assert (Path(f["--calib_dataset"]) / "train.jsonl").exists()  # calibration written first
            Path(f["--output_dir"]).mkdir(parents=True)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(build_mod.subprocess, "run", fake_run)
    src = tmp_path / "trtllm_src"
    (src / "examples" / "quantization").mkdir(parents=True)
    (src / "examples" / "quantization" / "quantize.py").write_text("# stand-in\n")
    out = tmp_path / "out"
    parser = build_mod.add_engine_arguments(__import__("argparse").ArgumentParser())
    args = parser.parse_args(["--checkpoint", str(LLAMA3), "--output", str(out), "--variant", "fp8", "--gpu", "L4",
                              "--trtllm-src", str(src), "--calib-size", "8", "--max-seq-len", "2048",
                              "--max-input-len", "1024"])
    out_buf = io.StringIO()
    with redirect_stdout(out_buf):
        plan, profile = build_mod.plan_from_args(args)
        build_mod.run_build(plan, profile, args)
    assert [a[0] for a in ran] == ["python3", "trtllm-build"]
    m = EngineManifest.read(out / "engine")
    assert (m.variant, m.quant_algo, m.gpu_name, m.compute_capability) == ("fp8", "FP8", "NVIDIA L4", "8.9")
    assert m.commands[1].startswith("HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 trtllm-build")
    assert (out / "tokenizer" / "config.json").exists() and (out / OPTIONS_FILE).exists()
    budget = __import__("json").loads((out / "memory_budget.json").read_text())
    repo = out / "model_repository"
    text = (repo / "llm" / "config.pbtxt").read_text()
    assert f'string_value: "{budget["max_tokens_in_paged_kv_cache"]}"' in text
    assert [x.variant for x in check_repository(repo, runtime)] == ["fp8"]
