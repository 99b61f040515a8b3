"""GPU repository rendered from fixture engine ``config.json`` files (TensorRT-LLM's schema, one per
quant_algo): every config parses with Triton's model-config protobuf and carries the engine's limits."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builders import triton_config as tc
from builders.profile import ServingProfile
from builders.repository import render_repository
from builders.trtllm.layout import (
    BUDGET_FILE,
    TRTLLM_INPUTS,
    engine_limits,
    model_configs_trtllm,
)
from builders.trtllm.options import GpuProfile, TrtllmOptions
from builders.trtllm.pins import BACKEND_REQUIRED_PARAMETERS
from builders.trtllm.serve import server_command

ENGINES = Path(__file__).parent / "fixtures" / "trtllm" / "engines"
FIXTURES = sorted(p.name for p in ENGINES.iterdir())
EXPECTED_QUANT = {
    "llama3-8b-fp16": (None, None), "llama3-8b-bf16": (None, None), "llama3-8b-fp16-tp2": (None, None),
    "llama3-8b-fp8-kvfp8": ("FP8", "FP8"), "llama2-7b-int8sq-kvint8": ("W8A8_SQ_PER_CHANNEL", "INT8"),
    "llama2-7b-int8wo": ("W8A16", None), "llama2-7b-int4awq": ("W4A16_AWQ", None),
}


def profile_for(engine_dir: Path, tokenizer_dir: Path = Path("/engines/x/tokenizer")) -> ServingProfile:
    return ServingProfile(name="gpu-test", target="trtllm", engine_dir=engine_dir, tokenizer_dir=tokenizer_dir,
                          max_batch_size=16)


def test_fixtures_cover_every_quant_algo():
    seen = {tuple(json.loads((ENGINES / f / "config.json").read_text())["pretrained_config"]["quantization"][k]
                  for k in ("quant_algo", "kv_cache_quant_algo")) for f in FIXTURES}
    assert {q for q, _ in seen} == {None, "FP8", "W8A8_SQ_PER_CHANNEL", "W8A16", "W4A16_AWQ"}
    assert set(FIXTURES) == set(EXPECTED_QUANT)


@pytest.mark.parametrize("fixture", FIXTURES)
def test_rendered_configs_parse_and_carry_limits(fixture):
    engine_dir = ENGINES / fixture
    cfg = json.loads((engine_dir / "config.json").read_text())
    q = cfg["pretrained_config"]["quantization"]
    assert (q["quant_algo"], q["kv_cache_quant_algo"]) == EXPECTED_QUANT[fixture]
    build = cfg["build_config"]
    options = TrtllmOptions(kv_cache_free_gpu_mem_fraction=0.8, max_tokens_in_paged_kv_cache="unset")
    rendered = model_configs_trtllm(profile_for(engine_dir), options)
    configs = {name: (source, config) for name, source, config in rendered}
    assert list(configs) == ["preprocessing", "llm", "tensorrt_llm", "ensemble"]
    for name, (_, config) in configs.items():
        text = tc.to_pbtxt(config)
        parsed = text_format.Parse(text, mc.ModelConfig())
        assert parsed == config and parsed.name == name

    trt = configs["tensorrt_llm"][1]
    params = {k: v.string_value for k, v in trt.parameters.items()}
    assert trt.backend == "tensorrtllm" and configs["tensorrt_llm"][0] is None
    assert trt.max_batch_size == build["max_batch_size"]
    assert trt.model_transaction_policy.decoupled
    assert list(trt.dynamic_batching.preferred_batch_size) == [build["max_batch_size"]]
    assert trt.dynamic_batching.default_queue_policy.max_queue_size == options.max_queue_size
    assert params["gpt_model_path"] == str(engine_dir)
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.8"
    # Reuse and chunked prefill need paged context FMHA, which TensorRT-LLM's builder turns off with an int8 KV
    # cache (builders/trtllm/rules.py): the config follows what the engine was built with.
    paged = "true" if build["plugin_config"]["use_paged_context_fmha"] else "false"
    assert params["enable_kv_cache_reuse"] == params["enable_chunked_context"] == paged
    assert paged == ("false" if fixture == "llama2-7b-int8sq-kvint8" else "true")
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert params["exclude_input_in_output"] == "true"
    assert "max_tokens_in_paged_kv_cache" not in params  # "unset": only the fraction rules
    names = [i.name for i in trt.input]
    assert "seed" in names and "random_seed" not in names and "min_tokens" in names  # the pinned backend's names
    scalars = [i for i in trt.input if list(i.dims) == [1]]
    assert scalars and all(i.HasField("reshape") and not i.reshape.shape for i in scalars)
    assert {i.name for i in trt.input if not i.optional} == {"input_lengths", "request_output_len"}

    pre = configs["preprocessing"][1]
    pre_params = {k: v.string_value for k, v in pre.parameters.items()}
    assert pre_params["max_input_len"] == str(build["max_input_len"])
    assert pre_params["max_seq_len"] == str(build["max_seq_len"])

    llm_source, llm = configs["llm"]
    assert Path(__file__).parents[1].joinpath("model_repository", llm_source, "1", "model.py").exists()
    assert llm.backend == "python" and llm.model_transaction_policy.decoupled
    assert [i.name for i in llm.input] == [t.name for t in tc.LLM_INPUTS + tc.LLM_CONTROL_INPUTS]  # stop, as on CPU
    assert [o.name for o in llm.output] == [t.name for t in tc.LLM_OUTPUTS]
    llm_params = {k: v.string_value for k, v in llm.parameters.items()}
    assert llm_params["tensorrt_llm_model_name"] == "tensorrt_llm"
    assert int(llm_params["max_inflight"]) == 2 * build["max_batch_size"]
    # preprocessing and the ensemble are exactly the CPU ones
    profile = profile_for(engine_dir)
    assert configs["ensemble"][1] == tc.ensemble_config(profile)
    assert configs["preprocessing"][1] == tc.preprocessing_config(profile, engine_limits(cfg))


def test_budget_fills_max_tokens_in_paged_kv_cache(tmp_path):
    engine_dir = tmp_path / "engine"
    shutil.copytree(ENGINES / "llama3-8b-fp8-kvfp8", engine_dir)
    (tmp_path / BUDGET_FILE).write_text(json.dumps({"max_tokens_in_paged_kv_cache": 123456}))
    configs = {n: c for n, _, c in model_configs_trtllm(profile_for(engine_dir))}
    assert configs["tensorrt_llm"].parameters["max_tokens_in_paged_kv_cache"].string_value == "123456"


def test_render_writes_a_repository(tmp_path):
    out = render_repository(profile_for(ENGINES / "llama2-7b-int8wo"), tmp_path / "repo")
    assert sorted(p.name for p in out.iterdir()) == ["ensemble", "llm", "preprocessing", "tensorrt_llm"]
    for name in ("preprocessing", "llm"):
        assert (out / name / "1" / "model.py").exists()
    assert (out / "tensorrt_llm" / "1").is_dir() and not any((out / "tensorrt_llm" / "1").iterdir())
    for cfg in out.glob("*/config.pbtxt"):
        text_format.Parse(cfg.read_text(), mc.ModelConfig())
    # The chat contract is the CPU layout's: the same preprocessing model, the same ensemble inputs.
    ensemble = text_format.Parse((out / "ensemble" / "config.pbtxt").read_text(), mc.ModelConfig())
    inputs = {i.name: i for i in ensemble.input}
    assert inputs["messages"].optional and inputs["text_input"].optional
    assert (out / "preprocessing" / "1" / "model.py").read_bytes() == \
        (Path(__file__).parent.parent / "model_repository/preprocessing/1/model.py").read_bytes()


def test_refuses_wrong_target_and_missing_engine(tmp_path):
    cpu = ServingProfile(name="cpu", engine_dir=tmp_path, tokenizer_dir=tmp_path)
    with pytest.raises(ValueError, match="not trtllm"):
        model_configs_trtllm(cpu)
    with pytest.raises(FileNotFoundError, match="build the engine first"):
        model_configs_trtllm(profile_for(tmp_path / "nope"))


def test_profiles_load():
    for name in ("latency", "throughput"):
        p = GpuProfile.load(name)
        s = p.serving_profile(engine_dir="/e/engine")
        assert s.target == "trtllm" and str(s.engine_dir) == "/e/engine"
    assert GpuProfile.load("throughput").runtime.batch_scheduler_policy == "max_utilization"
    assert GpuProfile.load("latency").build.max_num_tokens < GpuProfile.load("throughput").build.max_num_tokens


def test_multi_gpu_launch_world_size():
    tp2 = json.loads((ENGINES / "llama3-8b-fp16-tp2" / "config.json").read_text())
    single = json.loads((ENGINES / "llama3-8b-fp16" / "config.json").read_text())
    base = ["--model-repository=/x", "--http-port=8000", "--model-control-mode=none", "--exit-timeout-secs=30"]
    argv, env = server_command("/repo", single, TrtllmOptions(), base)
    assert argv[0].endswith("tritonserver") and env == {}
    argv, env = server_command("/repo", tp2, TrtllmOptions(multi_gpu_mode="orchestrator"), base)
    assert argv[0].endswith("tritonserver") and env["TRTLLM_ORCHESTRATOR"] == "1"
    argv, env = server_command("/repo", tp2, TrtllmOptions(multi_gpu_mode="leader"), base)
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count("-n") == 2 and argv.count(":") == 1  # MPI world size = tp × pp = 2
    rank1 = argv[argv.index(":") + 1:]
    assert "--load-model=tensorrt_llm" in rank1 and "--model-control-mode=explicit" in rank1
    assert "--backend-config=python,shm-region-prefix-name=prefix1_" in rank1
    assert "--model-repository=/repo" in rank1


def test_trtllm_input_table_names_are_unique():
    names = [n for n, _, _ in TRTLLM_INPUTS]
    assert len(names) == len(set(names))


def test_every_parameter_the_backend_cannot_do_without_is_rendered():
    """The pinned backend throws on a missing one of these and the model (so the ensemble) does not load."""
    configs = {n: c for n, _, c in model_configs_trtllm(profile_for(ENGINES / "llama3-8b-fp8-kvfp8"))}
    params = configs["tensorrt_llm"].parameters
    missing = sorted(set(BACKEND_REQUIRED_PARAMETERS) - set(params))
    assert not missing, f"tensorrt_llm config.pbtxt lacks {missing} ({BACKEND_REQUIRED_PARAMETERS})"
    # Guided decoding stays off: the backend switches it on only when both of these are non-empty.
    assert params["guided_decoding_backend"].string_value == params["xgrammar_tokenizer_info_path"].string_value == ""
    assert params["tokenizer_dir"].string_value == str(profile_for(ENGINES / "llama3-8b-fp8-kvfp8").tokenizer_dir)
    # An empty value survives the text format (Triton hands the backend string_value "" for `value { }`).
    reparsed = text_format.Parse(tc.to_pbtxt(configs["tensorrt_llm"]), mc.ModelConfig())
    assert "guided_decoding_backend" in reparsed.parameters


def test_stand_in_loads_the_config_the_real_backend_would(test_profile):
    """Issue 19's last check: the stand-in's tensorrt_llm config.pbtxt is the GPU render of the same engine with
    only the backend swapped and its own standin_* parameters added (tests/conftest.py serves it under Triton)."""
    from builders.trtllm.standin import standin_configs, standin_engine_config

    options = TrtllmOptions(max_tokens_in_paged_kv_cache="unset")
    gpu_profile = test_profile.resolved().model_copy(update={"target": "trtllm"})
    stand_in = {n: c for n, _, c in standin_configs(test_profile, options=options)}  # writes what the GPU build would
    real = {n: c for n, _, c in model_configs_trtllm(gpu_profile, options,
                                                      standin_engine_config(gpu_profile.engine_dir))}
    assert real["tensorrt_llm"].parameters["guided_decoding_backend"].string_value == "xgrammar"
    assert real.keys() == stand_in.keys()
    for name in real:
        if name != "tensorrt_llm":
            assert stand_in[name] == real[name], name
    swapped = mc.ModelConfig()
    swapped.CopyFrom(stand_in["tensorrt_llm"])
    assert (swapped.backend, real["tensorrt_llm"].backend) == ("python", "tensorrtllm")
    swapped.backend = "tensorrtllm"
    added = sorted(k for k in swapped.parameters if k not in real["tensorrt_llm"].parameters)
    assert added and all(k.startswith("standin_") for k in added), added
    for key in added:
        del swapped.parameters[key]
    assert swapped == real["tensorrt_llm"]


def test_tokenizer_info_is_what_the_backend_reads(tiny_checkpoint, tmp_path):
    """The fields getGuidedDecodingConfigFromParams parses, built as TensorRT-LLM's generator builds them."""
    from transformers import AutoTokenizer

    from builders.trtllm.guided import find_tokenizer_info, write_tokenizer_info

    assert find_tokenizer_info(tmp_path / "engine") is None
    path = write_tokenizer_info(tiny_checkpoint, tmp_path)
    assert find_tokenizer_info(tmp_path / "engine") == path  # beside the engine, in the build output
    info = json.loads(path.read_text())
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    assert info["encoded_vocab"] == tokenizer.convert_ids_to_tokens(list(range(len(info["encoded_vocab"]))))
    assert json.loads(info["tokenizer_str"])["model"]["type"] == json.loads(
        (tiny_checkpoint / "tokenizer.json").read_text())["model"]["type"]
    assert info["stop_token_ids"] == [tokenizer.eos_token_id]
