"""The GPU layout on CPU: the same repository the GPU build renders, with ``tensorrt_llm`` served by a Python
stand-in (model_repository/trtllm/tensorrt_llm_standin) over the CPU engine or the ``null`` token source.

Only three things differ from the GPU repository: ``tensorrt_llm``'s ``backend`` (python, not tensorrtllm) and
its source folder, and ``standin_*`` parameters (token source and its pace, engine limits); everything else —
inputs, outputs, dtypes, dims, optional flags, batching, the backend's own parameters — is
``layout.tensorrt_llm_config``, the function that renders the real one, so the two cannot drift.
``gpt_model_path`` names the CPU engine, whose ``config.json`` is in TensorRT-LLM's engine schema.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ..profile import ServingProfile
from .guided import find_tokenizer_info, write_tokenizer_info
from .layout import engine_info, engine_limits, model_configs_trtllm
from .options import TrtllmOptions

#: What ``make serve LAYOUT=…`` and the end-to-end tests (tests/conftest.py) serve: the CPU llm, or the GPU
#: layout (llm wrapper over tensorrt_llm) with the stand-in over the same CPU engine.
LAYOUTS = ("cpu", "trtllm-standin")
STANDIN_SOURCE = "trtllm/tensorrt_llm_standin"


def standin_engine_config(engine_dir: str | Path) -> dict:
    """The CPU engine's config.json as a GPU build of our plan would write it: paged context FMHA on
    (builders/trtllm/plan.py passes ``--use_paged_context_fmha enable``), so KV reuse and chunked context stay
    on in the rendered parameters as they would on a GPU. The CPU engine has no plugin config of its own."""
    cfg = copy.deepcopy(engine_info(engine_dir))
    cfg["build_config"].setdefault("plugin_config", {})["use_paged_context_fmha"] = True
    return cfg


def standin_configs(profile: ServingProfile, token_source: str = "engine", options: TrtllmOptions | None = None,
                    null_step_ms: float = 0.0):
    """(model name, source, ModelConfig) of the GPU repository over a CPU engine (a CPU profile's engine)."""
    from cpu_engine.token_sources import TOKEN_SOURCES  # it loads the engine's modules (torch): only when rendering

    if token_source not in TOKEN_SOURCES:
        raise ValueError(f"token source {token_source!r}: expected one of {', '.join(TOKEN_SOURCES)}")
    options = options or TrtllmOptions(max_tokens_in_paged_kv_cache="unset")
    gpu_profile = profile.resolved().model_copy(update={"target": "trtllm"})
    if find_tokenizer_info(gpu_profile.engine_dir) is None:  # what the GPU build writes beside its engine
        write_tokenizer_info(gpu_profile.tokenizer_dir, gpu_profile.engine_dir)
    engine_cfg = standin_engine_config(gpu_profile.engine_dir)
    limits = engine_limits(engine_cfg)
    configs = []
    for name, source, cfg in model_configs_trtllm(gpu_profile, options, engine_cfg):
        if name == options.tensorrt_llm_model_name:
            cfg.backend = "python"
            source = STANDIN_SOURCE
            for key, value in {"standin_token_source": token_source,
                               "standin_cpu_threads": profile.llm.cpu_threads,
                               "standin_max_input_len": limits["max_input_len"],
                               "standin_max_seq_len": limits["max_seq_len"],
                               "standin_null_step_ms": null_step_ms}.items():
                cfg.parameters[key].string_value = str(value)
        configs.append((name, source, cfg))
    return configs


def render_layout(layout: str, profile: ServingProfile, out_dir: str | Path, token_source: str = "engine",
                  null_step_ms: float = 0.0) -> Path:
    """``profile``'s repository (a CPU profile) in ``layout``, one of LAYOUTS; the stand-in's ``token_source`` (and
    the ``null`` source's step) apply to the GPU layout."""
    from ..repository import render_repository

    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if layout == "cpu":
        return render_repository(profile, out_dir)
    return render_repository(profile, out_dir, standin_configs(profile, token_source, null_step_ms=null_step_ms))
