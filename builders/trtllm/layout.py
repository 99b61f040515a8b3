"""The GPU model repository: the CPU spine with the LLM served by TensorRT-LLM.

    ensemble:  preprocessing  →  llm (Python, decoupled; answers in text)
                                  │ BLS stream, per request
                                  ▼
                                tensorrt_llm (C++ ``tensorrtllm`` backend, in-flight batching)

Why ``llm`` is a thin Python model over ``tensorrt_llm`` rather than ``tensorrt_llm`` itself in the ensemble:
Triton's ensemble scheduler runs a step for response *k* of a decoupled model only when *every* input of the
step has a tensor of iteration *k* (``ensemble_scheduler.cc: GetNextSteps``). Preprocessing answers once, so
a step after ``tensorrt_llm`` cannot take request facts (``input_lengths``, ``request_output_len``) from it
without hanging on the second streamed response; and the C++ backend returns neither ``finish_reason`` nor
cumulative token counts. The ``llm`` wrapper keeps per-request state and answers with exactly the CPU ``llm``
contract (``output_ids``, ``sequence_length``, ``text_output``, ``finish_reason``, ``num_input_tokens``,
``num_output_tokens``), holding a UTF-8 character split across streamed tokens back until it is complete, so
preprocessing and the ensemble are the CPU ones, unchanged. It makes the text itself, in order, on the thread
that sends the request's responses (serving.triton_io.llm_response says why no postprocessing follows it).

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

#: The wrapper model's source folder under model_repository/ (its ``1/model.py``), copied by render_repository.
WRAPPER_SOURCE = "trtllm/llm"
BUDGET_FILE = "memory_budget.json"
#: The runtime options a build rendered with (beside engine/): re-rendering later reproduces them.
OPTIONS_FILE = "trtllm_options.json"

# The tensorrt_llm model's inputs as the pinned backend (r26.07) names them. Ours → theirs where they differ:
# TensorRT-LLM renamed random_seed → seed and min_length → min_tokens (tensorrtllm_backend docs/model_config.md,
# r25.10 onward; v1.0.0 and older still list random_seed / min_length).
TRTLLM_INPUT_NAMES = {"random_seed": "seed", "min_tokens": "min_tokens"}
# Guided decoding is on when the build wrote xgrammar's tokenizer info beside the engine (guided.py); the llm
# wrapper reads the same value and, with it off, refuses guided requests with INVALID_ARG rather than letting the
# backend fail them with INTERNAL.
GUIDED_DECODING_BACKEND = "xgrammar"
_SCALAR = dict(dims=(1,), reshape=True)
TRTLLM_INPUTS = (
    ("input_ids", "INT32", dict(dims=(-1,), ragged=True)),
    ("input_lengths", "INT32", dict(_SCALAR, required=True)),
    ("request_output_len", "INT32", dict(_SCALAR, required=True)),
    ("end_id", "INT32", _SCALAR),
    ("pad_id", "INT32", _SCALAR),
    ("stop_words_list", "INT32", dict(dims=(2, -1), ragged=True)),
    ("bad_words_list", "INT32", dict(dims=(2, -1), ragged=True)),
    ("runtime_top_k", "INT32", _SCALAR),
    ("runtime_top_p", "FP32", _SCALAR),
    ("temperature", "FP32", _SCALAR),
    ("seed", "UINT64", _SCALAR),
    ("min_tokens", "INT32", _SCALAR),
    ("streaming", "BOOL", _SCALAR),
    ("exclude_input_in_output", "BOOL", _SCALAR),
    ("repetition_penalty", "FP32", _SCALAR),
    ("presence_penalty", "FP32", _SCALAR),
    ("frequency_penalty", "FP32", _SCALAR),
    ("return_log_probs", "BOOL", _SCALAR),
    ("num_return_sequences", "INT32", _SCALAR),
    ("guided_decoding_guide_type", "STRING", _SCALAR),
    ("guided_decoding_guide", "STRING", _SCALAR),
    ("return_num_input_tokens", "BOOL", _SCALAR),
    ("return_num_output_tokens", "BOOL", _SCALAR),
    ("stop", "BOOL", _SCALAR),
)
TRTLLM_OUTPUTS = (
    ("output_ids", "INT32", (-1, -1)),
    ("sequence_length", "INT32", (-1,)),
    ("num_input_tokens", "INT32", (1,)),
    ("num_output_tokens", "INT32", (1,)),
    ("output_log_probs", "FP32", (-1, -1)),
    ("cum_log_probs", "FP32", (-1,)),
    ("sequence_index", "INT32", (1,)),
)


def engine_info(engine_dir: str | Path) -> dict:
    """``config.json`` of a TensorRT-LLM engine directory (TensorRT-LLM's engine schema)."""
    path = Path(engine_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: build the engine first (python -m builders engine "
                                "--target trtllm), or pass the engine directory that holds config.json")
    return json.loads(path.read_text())


def engine_limits(engine_cfg: dict) -> dict:
    build = engine_cfg["build_config"]
    missing = [k for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens") if k not in build]
    if missing:
        raise ValueError(f"engine config.json has no build_config.{', '.join(missing)}: not an engine config")
    return {k: build[k] for k in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens")}


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


def _param(cfg: mc.ModelConfig, key: str, value) -> None:
    if isinstance(value, bool):
        value = "true" if value else "false"
    cfg.parameters[key].string_value = str(value)


def tensorrt_llm_config(engine_dir: str | Path, engine_cfg: dict, options: TrtllmOptions,
                        kv_tokens: int | None = None, tokenizer_dir: str | Path = "") -> mc.ModelConfig:
    """The C++ backend model, configured from the engine's own limits and the runtime options. Every parameter
    the backend cannot do without (pins.BACKEND_REQUIRED_PARAMETERS) is set; KV-cache reuse and chunked context
    are false for an engine without paged context FMHA, because the runtime would switch them off anyway."""
    limits = engine_limits(engine_cfg)
    tokenizer_info = find_tokenizer_info(engine_dir)
    cfg = mc.ModelConfig(name=options.tensorrt_llm_model_name, backend="tensorrtllm",
                         max_batch_size=limits["max_batch_size"])
    cfg.model_transaction_policy.decoupled = True  # streaming; the wrapper always reads it as a stream
    db = cfg.dynamic_batching
    db.preferred_batch_size.append(limits["max_batch_size"])
    db.max_queue_delay_microseconds = options.max_queue_delay_us
    db.default_queue_policy.max_queue_size = options.max_queue_size
    for name, dtype, spec in TRTLLM_INPUTS:
        inp = cfg.input.add(name=name, data_type=getattr(mc, f"TYPE_{dtype}"), dims=list(spec["dims"]))
        if not spec.get("required"):
            inp.optional = True
        if spec.get("reshape"):
            inp.reshape.SetInParent()  # shape [ ]: a per-request scalar, as the backend expects
        if spec.get("ragged"):
            inp.allow_ragged_batch = True
    for name, dtype, dims in TRTLLM_OUTPUTS:
        cfg.output.add(name=name, data_type=getattr(mc, f"TYPE_{dtype}"), dims=list(dims))
    # The backend places itself on the GPUs (gpu_device_ids / MPI); Triton only runs its CPU-side instance.
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    params = {
        "gpt_model_type": options.batching_strategy,
        "gpt_model_path": str(engine_dir),
        "max_beam_width": 1,
        "batch_scheduler_policy": options.batch_scheduler_policy,
        "kv_cache_free_gpu_mem_fraction": options.kv_cache_free_gpu_mem_fraction,
        "exclude_input_in_output": True,
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "executor_worker_path": EXECUTOR_WORKER_PATH,
        # The backend turns guided decoding on only when both of these are non-empty (guided.py).
        "tokenizer_dir": str(tokenizer_dir),
        "xgrammar_tokenizer_info_path": str(tokenizer_info or ""),
        "guided_decoding_backend": GUIDED_DECODING_BACKEND if tokenizer_info else "",
    }
    paged = paged_context_fmha(engine_cfg)
    params.update({key: getattr(options, key) and paged for key in NEEDS_PAGED_CONTEXT_FMHA})
    tokens = options.max_tokens_in_paged_kv_cache
    if tokens == "auto":
        tokens = kv_tokens
    if isinstance(tokens, int):
        params["max_tokens_in_paged_kv_cache"] = tokens
    for key, value in params.items():
        _param(cfg, key, value)
    return cfg


def llm_wrapper_config(profile: ServingProfile, options: TrtllmOptions, limits: dict) -> mc.ModelConfig:
    """The ``llm`` step of the ensemble: the CPU llm's tensor contract, served over ``tensorrt_llm``."""
    inflight = options.max_inflight or 2 * limits["max_batch_size"]
    cfg = tc._python_model(profile.llm_model_name, profile.max_batch_size, tc.LLM_INPUTS + tc.LLM_CONTROL_INPUTS,
                           tc.LLM_OUTPUTS,
                           profile.llm.instances,
                           {"tensorrt_llm_model_name": options.tensorrt_llm_model_name,
                            "tokenizer_dir": profile.tokenizer_dir, "max_inflight": inflight,
                            "max_input_len": limits["max_input_len"], "max_seq_len": limits["max_seq_len"],
                            "guided_decoding_backend": GUIDED_DECODING_BACKEND
                            if find_tokenizer_info(profile.engine_dir) else ""})
    cfg.model_transaction_policy.decoupled = True
    cfg.dynamic_batching.max_queue_delay_microseconds = 0  # execute() only hands requests to threads
    return cfg


def model_configs_trtllm(profile: ServingProfile, options: TrtllmOptions | None = None,
                         engine_cfg: dict | None = None):
    """(model name, model source folder or None, ModelConfig) for every model of the GPU repository.

    Same shape as ``builders.repository.model_configs`` (sources relative to model_repository/).
    ``engine_cfg`` overrides reading ``<engine_dir>/config.json`` (the dry run predicts it). Without
    ``options``, the ones the build saved beside the engine (``trtllm_options.json``) apply, else defaults.
    """
    if profile.target != "trtllm":
        raise ValueError(f"profile {profile.name!r} has target {profile.target!r}, not trtllm")
    options = options or saved_options(profile.engine_dir) or TrtllmOptions()
    if profile.llm_model_name == options.tensorrt_llm_model_name:
        raise ValueError(f"llm_model_name and tensorrt_llm_model_name are both {profile.llm_model_name!r}")
    engine_cfg = engine_cfg if engine_cfg is not None else engine_info(profile.engine_dir)
    limits = engine_limits(engine_cfg)
    return [
        ("preprocessing", "preprocessing", tc.preprocessing_config(profile, limits)),
        (profile.llm_model_name, WRAPPER_SOURCE, llm_wrapper_config(profile, options, limits)),
        (options.tensorrt_llm_model_name, None,
         tensorrt_llm_config(profile.engine_dir, engine_cfg, options, budget_tokens(profile.engine_dir),
                             profile.tokenizer_dir)),
        ("ensemble", None, tc.ensemble_config(profile)),
    ]
