"""The CPU model repository: preprocessing → llm (the CPU engine in the llm's own process, its paged KV cache
configured here) as one ensemble. The GPU layout (trtllm/layout.py) shares everything but the llm's engine settings."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from cpu_engine.engine_dir import read_config

from . import triton_config as tc
from .profile import ServingProfile


def llm_config_cpu(profile: ServingProfile, limits: dict) -> mc.ModelConfig:
    """The shared ``llm`` config with the CPU engine's paged cache (TensorRT-LLM's parameter names; empty: the
    engine's default pool)."""
    cfg = tc.llm_config(profile, limits)
    tc.set_parameter(cfg, "max_tokens_in_paged_kv_cache", profile.llm.max_tokens_in_paged_kv_cache or "")
    tc.set_parameter(cfg, "enable_kv_cache_reuse", profile.llm.enable_kv_cache_reuse)
    return cfg


def model_configs_cpu(profile: ServingProfile) -> list[tuple[str, str | None, mc.ModelConfig]]:
    """(model name, source folder in model_repository/ or None, ModelConfig) for every model of the CPU repository."""
    if profile.target != "cpu":
        raise ValueError(f"profile {profile.name!r} has target {profile.target!r}, not cpu")
    limits = tc.engine_limits(read_config(profile.engine_dir))
    return tc.layout_models(profile, limits, llm_config_cpu(profile, limits))
