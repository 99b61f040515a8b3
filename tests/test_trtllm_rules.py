"""TensorRT-LLM's builder rules (builders/trtllm/rules.py) against a line-by-line transcription of the pinned
builder, and the gate, plan, predicted engine config, memory budget, rendered llm config and
calibration check that must follow them (issue 19, rows 2, 3, 4 and 8)."""

from __future__ import annotations

import argparse
import io
import itertools
import json
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from builders.profile import ServingProfile
from builders.trtllm import build as build_mod
from builders.trtllm.__main__ import main as trtllm_main
from builders.trtllm.calibration import hub_branch, write_calibration_set
from builders.trtllm.gpus import UnsupportedOnGpu, check_variant, lookup_gpu, supported_variants
from builders.trtllm.layout import model_configs_trtllm
from builders.trtllm.manifest import RuntimeInfo
from builders.trtllm.memory import ModelShape, compute_budget
from builders.trtllm.options import TrtllmOptions
from builders.trtllm.pins import CONVERT_SCRIPT, TENSORRT_VERSION, TRTLLM_VERSION
from builders.trtllm.plan import BuildLimits, make_plan, plan_commands, predict_engine_config
from builders.trtllm.rules import BUILD, BUILDER_RULES, plugin_flags, refusals
from builders.trtllm.variants import VARIANTS

FIXTURES = Path(__file__).parent / "fixtures" / "trtllm"
LLAMA2 = FIXTURES / "hf" / "llama-2-7b"
ENGINES = FIXTURES / "engines"

# ------------------------------------------------------------------ the table against the builder's own code

# QuantMode bits per QuantAlgo, transcribed from tensorrt_llm/quantization/mode.py: QuantMode.from_quant_algo
MODE: dict[str | None, set[str]] = {
    None: set(), "FP8": set(), "NVFP4": set(), "W4A8_QSERVE_PER_GROUP": set(),
    "W8A16": {"int8_wo"}, "W8A16_GPTQ": {"int8_wo"},
    "W4A16": {"int4_wo"}, "W4A16_AWQ": {"int4_wo"}, "W4A8_AWQ": {"int4_wo"}, "W4A16_GPTQ": {"int4_wo"},
    "W8A8_SQ_PER_CHANNEL": {"sq", "per_channel"}, "W8A8_SQ_PER_TENSOR_PLUGIN": {"sq"},
    "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN": {"sq", "per_channel", "per_token"},
    "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN": {"sq", "per_channel"},
    "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN": {"sq", "per_token"},
    "FP8_PER_CHANNEL_PER_TOKEN": {"per_channel", "per_token"},
}
KV_ALGOS = (None, "FP8", "INT8")
CCS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]
REQUESTS = [{"use_paged_context_fmha": p, "use_fp8_context_fmha": f} for p in (True, False) for f in (True, False)]


def reference_build(quant_algo, kv, cc, paged, fp8_ctx):
    """tensorrt_llm/builder.py: build(), transcribed with context FMHA on: the flags it ends with, or the message
    of the RuntimeError it raises."""
    sm = cc[0] * 10 + cc[1]
    mode, fp8_kv, int8_kv = MODE[quant_algo], kv == "FP8", kv == "INT8"
    if quant_algo not in ("FP8", "W4A8_AWQ", "NVFP4"):
        if fp8_ctx:
            fp8_ctx = False
        if paged and fp8_kv:
            paged = False
    elif sm < 89:
        fp8_ctx = False
        if paged and fp8_kv:
            paged = False
    elif paged:
        if not fp8_kv and fp8_ctx:
            fp8_ctx = False
        elif fp8_kv and not fp8_ctx:
            fp8_ctx = True
    if paged and int8_kv:
        paged = False
    if 100 <= sm < 120:
        if mode & {"int8_wo", "int4_wo"} or int8_kv:
            return "INT8/INT4 quantization is not supported on SM>=100."
        if "sq" in mode:
            return "SmoothQuant is not supported on SM>=100."
        if mode & {"per_channel", "per_token"}:
            return "Per-channel or per-token scaling is not supported on SM>=100."
    return {"use_paged_context_fmha": paged, "use_fp8_context_fmha": fp8_ctx}


GRID = list(itertools.product(MODE, KV_ALGOS, CCS))


def test_table_matches_the_builder():
    for (quant_algo, kv, cc), requested in itertools.product(GRID, REQUESTS):
        case = (quant_algo, kv, cc, requested)
        builder_refusals = [r for r in refusals(quant_algo, kv, cc) if r.source == BUILD]
        expected = reference_build(quant_algo, kv, cc, requested["use_paged_context_fmha"],
                                   requested["use_fp8_context_fmha"])
        if isinstance(expected, str):
            assert builder_refusals and builder_refusals[0].says == expected, case
        else:
            assert not builder_refusals, case
            assert plugin_flags(quant_algo, kv, cc, requested)[0] == expected, case


def test_every_rule_is_reached_and_names_its_source():
    reached = set()
    for quant_algo, kv, cc in GRID:
        reached.update(id(r) for r in refusals(quant_algo, kv, cc))
        for requested in REQUESTS:
            reached.update(id(r) for r in plugin_flags(quant_algo, kv, cc, requested)[1])
    assert {id(r) for r in BUILDER_RULES} == reached
    for rule in BUILDER_RULES:
        assert rule.source.startswith(("tensorrt_llm/", "TensorRT-LLM support matrix")) and rule.says


def test_what_we_pass_is_what_the_builder_keeps():
    """The plan passes the resolved flags to trtllm-build: the builder's rules must leave them as they are."""
    for quant_algo, kv, cc in GRID:
        flags, _ = plugin_flags(quant_algo, kv, cc)
        assert plugin_flags(quant_algo, kv, cc, flags) == (flags, []), (quant_algo, kv, cc)


# ----------------------------------------------------------------------------------- row 3: SM 10.x refusals


@pytest.mark.parametrize("variant,kv,says", [
    ("int8_sq", None, "SmoothQuant is not supported on SM>=100."),
    ("int8_wo", None, "INT8/INT4 quantization is not supported on SM>=100."),
    ("int4_awq", None, "INT8/INT4 quantization is not supported on SM>=100."),
    ("fp8", "int8", "INT8/INT4 quantization is not supported on SM>=100."),
])
def test_b200_refuses_what_the_builder_refuses(variant, kv, says, tmp_path):
    with pytest.raises(UnsupportedOnGpu) as err:
        make_plan(LLAMA2, tmp_path, variant, lookup_gpu("B200"), kv_cache_dtype=kv)
    msg = str(err.value)
    assert "compute capability 10.0 up to 12.0 (exclusive); this GPU is 10.0 (B200)" in msg
    assert f'"{says}" (tensorrt_llm/builder.py: build)' in msg
    assert ("use fp8" in msg) == (kv is None)
    if kv:
        assert "--kv-cache-dtype fp8 or leave the KV cache in the model dtype" in msg


def test_b200_builds_fp16_bf16_and_fp8(tmp_path):
    b200 = lookup_gpu("B200")
    assert supported_variants(b200) == ["fp16", "bf16", "fp8"]
    for variant, kv in (("fp16", None), ("bf16", None), ("fp8", None), ("fp8", "fp8")):
        make_plan(LLAMA2, tmp_path, variant, b200, kv_cache_dtype=kv)
    # the builder's range is SM 100 to 119: compute capability 12.0 takes INT8 / INT4 again
    assert supported_variants(lookup_gpu("RTX5090:12.0:32")) == list(VARIANTS)
    out = io.StringIO()
    with redirect_stdout(out):
        assert trtllm_main(["variants", "--gpu", "B200"]) == 0
    assert out.getvalue().split() == ["fp16", "bf16", "fp8"]


def test_budget_is_refused_where_the_build_is(tmp_path):
    with pytest.raises(UnsupportedOnGpu, match="SmoothQuant is not supported on SM>=100"):
        compute_budget(ModelShape.from_checkpoint(LLAMA2), "int8_sq", lookup_gpu("B200"))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        rc = trtllm_main(["budget", "--checkpoint", str(LLAMA2), "--variant", "int4_awq", "--gpu", "B200"])
    assert rc == 2 and "INT4 AWQ is not supported on compute capability 10.0" in err.getvalue()


# ---------------------------------------------------------------- row 2: quantized KV cache × paged context FMHA


def _dry_run(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert build_mod.engine_main(["--checkpoint", str(LLAMA2), "--dry-run", *argv]) == 0, err.getvalue()
    return out.getvalue()


def _param(text: str, key: str) -> str:
    after = text.split(f'key: "{key}"', 1)[1]
    return after.split('string_value: "', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("variant,kv,gpu", [("int8_sq", "int8", "A100"), ("int4_awq", "int8", "L4"),
                                            ("int8_sq", "fp8", "H100"), ("int4_awq", "fp8", "L4"),
                                            ("fp8", "int8", "H100")])
def test_quantized_kv_without_paged_context_fmha_is_planned_as_built(variant, kv, gpu, tmp_path):
    """int8 KV (any weights) and FP8 KV with weights outside the FP8 workflow lose paged context FMHA in the
    builder; the command, the predicted engine, the budget and the llm's executor settings all say so."""
    plan = make_plan(LLAMA2, tmp_path, variant, lookup_gpu(gpu), kv_cache_dtype=kv)
    argv = plan_commands(plan)[1].argv
    build = dict(zip(argv, argv[1:]))
    assert build["--use_paged_context_fmha"] == "disable" and build["--use_fp8_context_fmha"] == "disable"
    plugin = predict_engine_config(plan)["build_config"]["plugin_config"]
    assert plugin["use_paged_context_fmha"] is False and plugin["use_fp8_context_fmha"] is False
    assert any("no paged context FMHA" in n for n in plan.budget().notes)
    out = _dry_run("--output", str(tmp_path / "out"), "--variant", variant, "--kv-cache-dtype", kv, "--gpu", gpu,
                   "--profile", "throughput")
    assert "--use_paged_context_fmha disable" in out
    trt = out.split("## llm/config.pbtxt", 1)[1].split("## ensemble/config.pbtxt", 1)[0]
    assert _param(trt, "enable_kv_cache_reuse") == "false" and _param(trt, "enable_chunked_context") == "false"


def test_fp8_weights_with_fp8_kv_keep_reuse_and_chunked_context(tmp_path):
    out = _dry_run("--output", str(tmp_path / "out"), "--variant", "fp8", "--kv-cache-dtype", "fp8", "--gpu", "H100")
    assert "--use_paged_context_fmha enable --use_fp8_context_fmha enable" in out
    trt = out.split("## llm/config.pbtxt", 1)[1].split("## ensemble/config.pbtxt", 1)[0]
    assert _param(trt, "enable_kv_cache_reuse") == "true" and _param(trt, "enable_chunked_context") == "true"


def test_prompts_longer_than_max_num_tokens_are_refused_without_chunked_context(tmp_path):
    limits = BuildLimits(max_batch_size=16, max_input_len=3072, max_seq_len=4096, max_num_tokens=2048)
    with pytest.raises(ValueError, match=r"at most max_num_tokens \(2048\) tokens, but max_input_len is 3072: pass "
                                         r"--max-input-len 2048 or --max-num-tokens 3072"):
        make_plan(LLAMA2, tmp_path, "int8_sq", lookup_gpu("A100"), kv_cache_dtype="int8", limits=limits)
    make_plan(LLAMA2, tmp_path, "int8_sq", lookup_gpu("A100"), limits=limits)  # chunked context: fine


@pytest.mark.parametrize("variant,gpu", [("int8_sq", "A100"), ("int4_awq", "A10"), ("int8_sq", "A10")])
def test_gate_never_advises_a_kv_cache_the_builder_would_undo(variant, gpu):
    with pytest.raises(UnsupportedOnGpu) as err:
        check_variant(variant, lookup_gpu(gpu), "fp8")
    msg = str(err.value)
    assert "FP8 KV cache needs compute capability ≥ 8.9" in msg and "--kv-cache-dtype int8" not in msg
    assert "leave the KV cache in the model dtype" in msg


def test_rendered_config_follows_the_engine_not_the_options():
    cfg = json.loads((ENGINES / "llama3-8b-fp16" / "config.json").read_text())
    cfg["build_config"]["plugin_config"]["use_paged_context_fmha"] = False
    profile = ServingProfile(name="t", target="trtllm", engine_dir=Path("/e"), tokenizer_dir=Path("/t"),
                             max_batch_size=16)
    options = TrtllmOptions(enable_kv_cache_reuse=True, enable_chunked_context=True)
    trt = {n: c for n, _, c in model_configs_trtllm(profile, options, cfg)}["llm"]
    assert trt.parameters["enable_kv_cache_reuse"].string_value == "false"
    assert trt.parameters["enable_chunked_context"].string_value == "false"
    del cfg["build_config"]["plugin_config"]["use_paged_context_fmha"]
    with pytest.raises(ValueError, match="use_paged_context_fmha"):
        model_configs_trtllm(profile, options, cfg)


def test_a_build_whose_engine_disagrees_with_the_table_is_not_rendered(tmp_path, monkeypatch):
    runtime = RuntimeInfo(TRTLLM_VERSION, TENSORRT_VERSION, (lookup_gpu("L4"),))
    monkeypatch.setattr("builders.trtllm.manifest.detect_runtime", lambda: runtime)
    script = tmp_path / "src" / CONVERT_SCRIPT
    script.parent.mkdir(parents=True)
    script.write_text("# stand-in\n")
    args = build_mod.add_engine_arguments(argparse.ArgumentParser()).parse_args(
        ["--checkpoint", str(LLAMA2), "--output", str(tmp_path / "out"), "--variant", "fp16", "--gpu", "L4",
         "--trtllm-src", str(tmp_path / "src")])
    plan, profile = build_mod.plan_from_args(args)

    def fake_run(argv, env=None, check=False):
        if argv[0] == "trtllm-build":  # a builder whose rules differ from the table
            cfg = predict_engine_config(plan)
            cfg["build_config"]["plugin_config"]["use_paged_context_fmha"] = False
            plan.engine_dir.mkdir(parents=True)
            (plan.engine_dir / "config.json").write_text(json.dumps(cfg))
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(build_mod.subprocess, "run", fake_run)
    with redirect_stdout(io.StringIO()), pytest.raises(SystemExit, match="builder rules differ"):
        build_mod.run_build(plan, profile, args)
    assert not (tmp_path / "out" / "model_repository").exists()


# --------------------------------------------------------------------------------- row 4: FP8 context FMHA


@pytest.mark.parametrize("variant,kv,gpu,fp8_ctx", [
    ("fp8", "fp8", "L4", "enable"),  # the builder's bound is SM 8.9, not 9.0
    ("fp8", "fp8", "H100", "enable"),
    ("fp8", "fp8", "B200", "enable"),
    ("fp8", None, "H100", "disable"),  # FP8 paged context FMHA needs an FP8 KV cache
    ("int4_awq", "fp8", "H100", "disable"),  # not the FP8 quantization workflow
    ("int8_sq", None, "H100", "disable"),
])
def test_fp8_context_fmha_is_what_the_builder_sets(variant, kv, gpu, fp8_ctx, tmp_path):
    plan = make_plan(LLAMA2, tmp_path, variant, lookup_gpu(gpu), kv_cache_dtype=kv)
    argv = plan_commands(plan)[1].argv
    assert argv[argv.index("--use_fp8_context_fmha") + 1] == fp8_ctx
    assert predict_engine_config(plan)["build_config"]["plugin_config"]["use_fp8_context_fmha"] == (fp8_ctx == "enable")


# ------------------------------------------------------------------------------ row 8: calibration path check


@pytest.mark.parametrize("path,taken_for", [
    ("pileval", "pileval"),  # get_calib_dataloader: dataset_name_or_dir == "pileval"
    ("/data/pileval/calibration", None),
    ("/runs/pileval-like-set", None),
    ("/data/ScienceQA/calibration", "ScienceQA"),  # "scienceqa" / "science_qa" in the lowered name
    ("/data/my_science_qa", "ScienceQA"),
    ("/data/cnn_dailymail/calibration", "cnn_dailymail"),  # "cnn_dailymail" in the name, case as written
    ("/data/CNN_DailyMail/calibration", None),
    ("/engines/llama/calibration", None),
])
def test_calibration_refuses_only_what_the_dataloader_takes_for_a_hub_dataset(path, taken_for):
    assert hub_branch(path) == taken_for


def test_calibration_directory_containing_pileval_is_written(tmp_path, monkeypatch):
    out = write_calibration_set(tmp_path / "pileval" / "calibration", n_samples=4)
    assert (out / "train.jsonl").exists()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="hub dataset name pileval"):
        write_calibration_set("pileval", n_samples=4)
