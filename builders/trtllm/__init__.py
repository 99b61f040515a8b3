"""TensorRT-LLM (GPU) target: engine build plan, compute-capability gate, memory budget, engine manifest,
GPU model repository and the container entry point.

Nothing of TensorRT-LLM is imported anywhere in this package: the build runs its tools as subprocesses
inside the pinned image, and versions are read from package metadata. Importing this package is cheap
(submodules load on first use).

Public API::

    make_plan(checkpoint, output_dir, variant, gpu, **options) -> BuildPlan        (plan.py)
    plan_commands(plan) -> list[Command]; predict_engine_config(plan) -> dict      (plan.py)
    check_variant(variant, gpu, kv_cache_dtype=None)  raises UnsupportedOnGpu      (gpus.py)
    BUILDER_RULES; refusals(...); plugin_flags(...)  TensorRT-LLM's builder rules    (rules.py)
    lookup_gpu(name) / detect_gpus() -> GpuSpec(s)                                  (gpus.py)
    compute_budget(shape, variant, gpu, ...) -> MemoryBudget; kv_bytes_per_token; weight_bytes  (memory.py)
    EngineManifest, check_engine(engine_dir, runtime=None), check_repository(repo, runtime=None)  (manifest.py)
    model_configs_trtllm(profile, options=None, engine_cfg=None)   (layout.py; builders.repository renders it)
    engine_main(argv) -> int   (build.py: python -m builders engine --target trtllm ...)
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "make_plan": "plan", "plan_commands": "plan", "predict_engine_config": "plan", "BuildPlan": "plan",
    "BuildLimits": "plan", "check_variant": "gpus", "lookup_gpu": "gpus", "detect_gpus": "gpus",
    "UnsupportedOnGpu": "gpus", "GpuSpec": "gpus", "compute_budget": "memory", "kv_bytes_per_token": "memory",
    "weight_bytes": "memory", "ModelShape": "memory", "MemoryBudget": "memory", "EngineManifest": "manifest",
    "EngineMismatch": "manifest", "check_engine": "manifest", "check_repository": "manifest",
    "RuntimeInfo": "manifest", "model_configs_trtllm": "layout",
    "engine_main": "build", "TrtllmOptions": "options", "GpuProfile": "options", "BUILDER_RULES": "rules",
    "refusals": "rules", "plugin_flags": "rules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(name)
