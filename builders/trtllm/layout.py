"""The GPU model repository: the CPU layout's models, with the ``llm`` running TensorRT-LLM's executor in-process.

    ensemble:  preprocessing  →  llm (Python, decoupled: model_repository/llm, the CPU layout's own code)
                                  │ in the same process
                                  ▼
                                TensorRT-LLM Executor (tensorrt_llm.bindings.executor; in-flight batching on the GPU)

The ``llm`` is the CPU layout's model with ``executor_bindings`` set (serving/executor_engine.py): no ``tensorrt_llm``
Triton model and no BLS, so python_backend's lock-order deadlock between concurrent BLS streams cannot happen
(docs/gpu.md, "Why the llm owns the executor"), and each token crosses one process boundary, not two. The executor's
settings are the C++ backend's parameters under the same names (TensorRT-LLM ``docs/model_config.md``), mapped to
``ExecutorConfig`` as NVIDIA's Python ``tensorrt_llm`` model maps them.

Every ``config.pbtxt`` is a ``ModelConfig`` protobuf message (no templates).
"""

from __future__ import annotations

import json
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from .. import triton_config as tc
from ..profile import ServingProfile
from .guided import find_tokenizer_info
from .options import TrtllmOptions
from .pins import EXECUTOR_WORKER_PATH
from .rules import NEEDS_PAGED_CONTEXT_FMHA

#: The executor bindings the GPU layout's llm imports in its stub (its ``executor_bindings`` parameter).
TRTLLM_BINDINGS = "tensorrt_llm.bindings.executor"
BUDGET_FILE = "memory_budget.json"
#: The runtime options a build rendered with (beside engine/): re-rendering later reproduces them.
OPTIONS_FILE = "trtllm_options.json"

# Guided decoding is on when the build wrote xgrammar's tokenizer info beside the engine (guided.py).
def engine_info(engine_dir: str | Path) -> dict:
    """``config.json`` of a TensorRT-LLM engine directory (TensorRT-LLM's engine schema)."""
    path = Path(engine_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: build the engine first (python -m builders engine "
                                "--target trtllm), or pass the engine directory that holds config.json")
    return json.loads(path.read_text())


def paged_context_fmha(engine_cfg: dict) -> bool:
    """Whether the engine was built with paged context FMHA (what the runtime reads; the builder may have turned
    it off whatever trtllm-build was told, see rules.py)."""
    plugin = engine_cfg["build_config"].get("plugin_config") or {}
    if "use_paged_context_fmha" not in plugin:
        raise ValueError("engine config.json has no build_config.plugin_config.use_paged_context_fmha: not a "
                         "TensorRT-LLM engine config")
    return bool(plugin["use_paged_context_fmha"])


def world_size(engine_cfg: dict) -> int:
    m = engine_cfg["pretrained_config"].get("mapping") or {}
    return int(m.get("world_size") or m.get("tp_size", 1) * m.get("pp_size", 1))


def budget_tokens(engine_dir: str | Path) -> int | None:
    """``max_tokens_in_paged_kv_cache`` from the builder's memory budget beside the engine, if there is one."""
    for path in (Path(engine_dir) / BUDGET_FILE, Path(engine_dir).parent / BUDGET_FILE):
        if path.exists():
            return int(json.loads(path.read_text())["max_tokens_in_paged_kv_cache"])
    return None


def saved_options(engine_dir: str | Path) -> TrtllmOptions | None:
    for path in (Path(engine_dir) / OPTIONS_FILE, Path(engine_dir).parent / OPTIONS_FILE):
        if path.exists():
            return TrtllmOptions.model_validate_json(path.read_text())
    return None


def llm_config_trtllm(profile: ServingProfile, options: TrtllmOptions, engine_cfg: dict,
                      kv_tokens: int | None = None) -> mc.ModelConfig:
    """The shared ``llm`` config with the executor's settings (serving/executor_engine.py ``executor_config``
    reads them): KV-cache reuse and chunked context are false for an engine without paged context FMHA, because the
    runtime would switch them off anyway (rules.py)."""
    if profile.llm.instances != 1:
        raise ValueError(f"profile {profile.name!r}: the GPU layout runs one llm instance (it owns the executor, which "
                         f"places itself on the GPUs), not {profile.llm.instances}")
    limits = tc.engine_limits(engine_cfg)
    cfg = tc.llm_config(profile, limits)
    tokenizer_info = find_tokenizer_info(profile.engine_dir)
    params = {
        "executor_bindings": TRTLLM_BINDINGS,
        "batch_scheduler_policy": options.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": options.kv_cache_free_gpu_mem_fraction,
        "executor_worker_path": EXECUTOR_WORKER_PATH,  # orchestrator mode (TRTLLM_ORCHESTRATOR=1): a worker per rank
        "xgrammar_tokenizer_info_path": str(tokenizer_info or ""),  # guided decoding on when the build wrote it
    }
    paged = paged_context_fmha(engine_cfg)
    params.update({key: getattr(options, key) and paged for key in NEEDS_PAGED_CONTEXT_FMHA})
    tokens = options.max_tokens_in_paged_kv_cache
    if tokens == "auto":
        tokens = kv_tokens
    if isinstance(tokens, int):
        params["max_tokens_in_paged_kv_cache"] = tokens
    for key, value in params.items():
        tc.set_parameter(cfg, key, value)
    return cfg


def model_configs_trtllm(profile: ServingProfile, options: TrtllmOptions | None = None,
                         engine_cfg: dict | None = None):
    """(model name, model source folder or None, ModelConfig) for every model of the GPU repository.

    Same shape as ``builders.cpu_layout.model_configs_cpu`` (sources relative to model_repository/).
    ``engine_cfg`` overrides reading ``<engine_dir>/config.json`` (the dry run predicts it). Without
    ``options``, the ones the build saved beside the engine (``trtllm_options.json``) apply, else defaults.
    """
    if profile.target != "trtllm":
        raise ValueError(f"profile {profile.name!r} has target {profile.target!r}, not trtllm")
    options = options or saved_options(profile.engine_dir) or TrtllmOptions()
    engine_cfg = engine_cfg if engine_cfg is not None else engine_info(profile.engine_dir)
    return tc.layout_models(profile, tc.engine_limits(engine_cfg),
                            llm_config_trtllm(profile, options, engine_cfg, budget_tokens(profile.engine_dir)))
