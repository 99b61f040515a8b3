"""GPU repository rendered from fixture engine ``config.json`` files (TensorRT-LLM's schema, one per
quant_algo): every config parses with Triton's model-config protobuf and carries the engine's limits, and the
``ExecutorConfig`` the llm builds from it is one TensorRT-LLM's bindings accept (checked against the stand-in module,
which refuses what the nanobind bindings refuse)."""

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
from builders.trtllm.layout import BUDGET_FILE, TRTLLM_BINDINGS, model_configs_trtllm
from builders.trtllm.options import GpuProfile, TrtllmOptions
from builders.trtllm.pins import EXECUTOR_WORKER_PATH
from builders.trtllm.serve import server_command
from cpu_engine import EngineLimits
from cpu_engine import trtllm_executor as standin_bindings
from serving.executor_engine import executor_config

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
    assert list(configs) == ["preprocessing", "llm", "ensemble"]  # no tensorrt_llm model: the llm owns the executor
    for name, (_, config) in configs.items():
        text = tc.to_pbtxt(config)
        parsed = text_format.Parse(text, mc.ModelConfig())
        assert parsed == config and parsed.name == name

    pre = configs["preprocessing"][1]
    pre_params = {k: v.string_value for k, v in pre.parameters.items()}
    assert pre_params["max_input_len"] == str(build["max_input_len"])
    assert pre_params["max_seq_len"] == str(build["max_seq_len"])

    llm_source, llm = configs["llm"]
    assert Path(__file__).parents[1].joinpath("model_repository", llm_source, "1", "model.py").exists()
    assert llm.backend == "python" and llm.model_transaction_policy.decoupled
    assert [i.name for i in llm.input] == [t.name for t in tc.LLM_INPUTS + tc.LLM_CONTROL_INPUTS]  # stop, as on CPU
    assert [o.name for o in llm.output] == [t.name for t in tc.LLM_OUTPUTS]
    assert llm_source == "llm"  # the CPU layout's model code
    assert [g.count for g in llm.instance_group] == [1]  # it owns the executor, which places itself on the GPUs
    params = {k: v.string_value for k, v in llm.parameters.items()}
    assert params["executor_bindings"] == TRTLLM_BINDINGS and params["engine_dir"] == str(engine_dir)
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.8"
    assert params["executor_worker_path"] == EXECUTOR_WORKER_PATH
    # Reuse and chunked prefill need paged context FMHA, which TensorRT-LLM's builder turns off with an int8 KV
    # cache (builders/trtllm/rules.py): the config follows what the engine was built with.
    paged = "true" if build["plugin_config"]["use_paged_context_fmha"] else "false"
    assert params["enable_kv_cache_reuse"] == params["enable_chunked_context"] == paged
    assert paged == ("false" if fixture == "llama2-7b-int8sq-kvint8" else "true")
    assert params["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert "max_tokens_in_paged_kv_cache" not in params  # "unset": only the fraction rules
    assert params["xgrammar_tokenizer_info_path"] == ""  # no tokenizer info beside the fixture: guided decoding off

    # The ExecutorConfig those parameters make, built with bindings that refuse what TensorRT-LLM's refuse.
    limits = EngineLimits.from_build(build, max_queue_size=64)
    config = executor_config(standin_bindings, params, limits)
    assert config.kv_cache_config.free_gpu_memory_fraction == 0.8
    assert config.kv_cache_config.enable_block_reuse is (paged == "true")
    assert config.kv_cache_config.max_tokens is None
    assert config.enable_chunked_context is (paged == "true")
    assert config.scheduler_config.capacity_scheduler_policy is \
        standin_bindings.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert (config.max_batch_size, config.max_num_tokens, config.max_beam_width) == (
        build["max_batch_size"], build["max_num_tokens"], 1)
    assert config.guided_decoding_config is None and config.parallel_config is None
    # preprocessing and the ensemble are exactly the CPU ones
    profile = profile_for(engine_dir)
    assert configs["ensemble"][1] == tc.ensemble_config(profile)
    assert configs["preprocessing"][1] == tc.preprocessing_config(profile, tc.engine_limits(cfg))


def test_budget_fills_max_tokens_in_paged_kv_cache(tmp_path):
    engine_dir = tmp_path / "engine"
    shutil.copytree(ENGINES / "llama3-8b-fp8-kvfp8", engine_dir)
    (tmp_path / BUDGET_FILE).write_text(json.dumps({"max_tokens_in_paged_kv_cache": 123456}))
    configs = {n: c for n, _, c in model_configs_trtllm(profile_for(engine_dir))}
    params = {k: v.string_value for k, v in configs["llm"].parameters.items()}
    assert params["max_tokens_in_paged_kv_cache"] == "123456"
    config = executor_config(standin_bindings, params, EngineLimits(8, 4096, 2048, 64))
    assert config.kv_cache_config.max_tokens == 123456


def test_render_writes_a_repository(tmp_path):
    out = render_repository(profile_for(ENGINES / "llama2-7b-int8wo"), tmp_path / "repo")
    assert sorted(p.name for p in out.iterdir()) == ["ensemble", "llm", "preprocessing"]
    for name in ("preprocessing", "llm"):
        assert (out / name / "1" / "model.py").read_bytes() == \
            (Path(__file__).parent.parent / f"model_repository/{name}/1/model.py").read_bytes()
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
    assert "--load-model=llm" in rank1 and "--model-control-mode=explicit" in rank1
    assert "--backend-config=python,shm-region-prefix-name=prefix1_" in rank1
    assert "--model-repository=/repo" in rank1


def test_orchestrator_mode_and_guided_decoding_reach_the_executor_config(tmp_path, monkeypatch):
    engine_dir = tmp_path / "engine"
    shutil.copytree(ENGINES / "llama3-8b-fp16-tp2", engine_dir)
    (tmp_path / "xgrammar_tokenizer_info.json").write_text(json.dumps(
        {"encoded_vocab": ["a", "b"], "tokenizer_str": "{}", "stop_token_ids": [1]}))
    configs = {n: c for n, _, c in model_configs_trtllm(profile_for(engine_dir))}
    params = {k: v.string_value for k, v in configs["llm"].parameters.items()}
    monkeypatch.setenv("TRTLLM_ORCHESTRATOR", "1")  # builders/trtllm/serve.py sets it for TP × PP > 1
    config = executor_config(standin_bindings, params, EngineLimits(8, 4096, 2048, 64))
    parallel = config.parallel_config
    assert parallel.communication_mode is standin_bindings.CommunicationMode.ORCHESTRATOR
    assert parallel.orchestrator_config.worker_executable_path == EXECUTOR_WORKER_PATH
    guided = config.guided_decoding_config
    assert guided.backend is standin_bindings.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR
    assert (guided.encoded_vocab, guided.stop_token_ids) == (["a", "b"], [1])


def test_the_stand_in_bindings_refuse_what_nanobind_refuses():
    """TensorRT-LLM 1.2's nanobind bindings: keyword-only arguments, no None for non-optional ones, no unknown
    keywords (docs/gpu.md); a call of ours that the real module would refuse fails in every CPU test instead."""
    b = standin_bindings
    with pytest.raises(TypeError):
        b.Request([1, 2], 4, True)  # streaming is keyword-only
    with pytest.raises(TypeError):
        b.Request([1, 2], 4, streaming=None)
    with pytest.raises(TypeError):
        b.Request([1, 2], 4, priority=None)
    with pytest.raises(TypeError):
        b.Request([1, 2], 4, max_new_tokens=3)
    with pytest.raises(TypeError):
        b.SamplingConfig(1, 40)  # top_k is keyword-only
    with pytest.raises(TypeError):
        b.KvCacheConfig(enable_block_reuse=None)
    with pytest.raises(TypeError):
        b.ExecutorConfig(max_beam_width=None)
    with pytest.raises(TypeError):
        b.OrchestratorConfig(True, None)


def test_stand_in_is_the_gpu_render_with_only_its_bindings_swapped(test_profile):
    """The stand-in's llm config is the GPU render of the same engine with only ``executor_bindings`` swapped and its
    own standin_* parameters added (tests/conftest.py serves it under Triton)."""
    from builders.trtllm.standin import STANDIN_BINDINGS, standin_configs, standin_engine_config

    options = TrtllmOptions(max_tokens_in_paged_kv_cache="unset")
    gpu_profile = test_profile.resolved().model_copy(update={"target": "trtllm"})
    stand_in = {n: c for n, _, c in standin_configs(test_profile, options=options)}  # writes what the GPU build would
    real = {n: c for n, _, c in model_configs_trtllm(gpu_profile, options,
                                                      standin_engine_config(gpu_profile.engine_dir))}
    assert real["llm"].parameters["xgrammar_tokenizer_info_path"].string_value  # guided decoding on
    assert real.keys() == stand_in.keys()
    for name in real:
        if name != "llm":
            assert stand_in[name] == real[name], name
    swapped = mc.ModelConfig()
    swapped.CopyFrom(stand_in["llm"])
    assert swapped.parameters["executor_bindings"].string_value == STANDIN_BINDINGS
    swapped.parameters["executor_bindings"].string_value = TRTLLM_BINDINGS
    added = sorted(k for k in swapped.parameters if k not in real["llm"].parameters)
    assert added and all(k.startswith("standin_") for k in added), added
    for key in added:
        del swapped.parameters[key]
    assert swapped == real["llm"]


def test_tokenizer_info_is_what_the_backend_reads(tiny_checkpoint, tmp_path):
    """The fields of TensorRT-LLM's GuidedDecodingConfig, built as TensorRT-LLM's generator builds them."""
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
