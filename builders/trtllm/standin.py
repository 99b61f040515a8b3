"""The GPU layout on CPU: the same repository the GPU build renders, with the ``llm``'s executor bindings
(``executor_bindings``) pointing at cpu_engine/trtllm_executor.py — TensorRT-LLM's executor API over the CPU engine or
the ``null`` token source — instead of ``tensorrt_llm.bindings.executor``.

Only that parameter and the stand-in's own ``standin_*`` parameters (token source and its pace, threads) differ from
the GPU repository; everything else — inputs, outputs, batching, the executor's settings — is
``layout.model_configs_trtllm``, the function that renders the real one, so the two cannot drift. ``engine_dir``
names the CPU engine, whose ``config.json`` is in TensorRT-LLM's engine schema.
"""

from __future__ import annotations

import copy
from pathlib import Path

from ..profile import ServingProfile
from .guided import find_tokenizer_info, write_tokenizer_info
from .layout import TRTLLM_BINDINGS, engine_info, model_configs_trtllm
from .options import TrtllmOptions

#: What ``make serve LAYOUT=…`` and the end-to-end tests (tests/conftest.py) serve: the CPU layout, or the GPU
#: layout (the llm over TensorRT-LLM's executor API) with the stand-in executor over the same CPU engine.
LAYOUTS = ("cpu", "trtllm-standin")
STANDIN_BINDINGS = "cpu_engine.trtllm_executor"


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
    # The CPU profile's KV budget and reuse switch: the stand-in's cache is the CPU engine's, paged the same way.
    options = options or TrtllmOptions(max_tokens_in_paged_kv_cache=profile.llm.max_tokens_in_paged_kv_cache or "unset",
                                       enable_kv_cache_reuse=profile.llm.enable_kv_cache_reuse)
    gpu_profile = profile.resolved().model_copy(update={"target": "trtllm"})
    if find_tokenizer_info(gpu_profile.engine_dir) is None:  # what the GPU build writes beside its engine
        write_tokenizer_info(gpu_profile.tokenizer_dir, gpu_profile.engine_dir)
    configs = []
    for name, source, cfg in model_configs_trtllm(gpu_profile, options, standin_engine_config(gpu_profile.engine_dir)):
        if name == gpu_profile.llm_model_name:
            assert cfg.parameters["executor_bindings"].string_value == TRTLLM_BINDINGS
            for key, value in {"executor_bindings": STANDIN_BINDINGS, "standin_token_source": token_source,
                               "standin_cpu_threads": profile.llm.cpu_threads,
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
