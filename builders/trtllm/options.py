"""GPU serving knobs (TensorRT-LLM runtime and Triton queueing) and the latency / throughput profiles.

A GPU profile file (``builders/trtllm/profiles/*.yaml``) has three sections: ``serving`` (the project's
:class:`~builders.profile.ServingProfile`, target trtllm), ``build`` (engine limits and build flags) and
``runtime`` (:class:`TrtllmOptions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TrtllmOptions(_Strict):
    """TensorRT-LLM's executor settings, under the C++ backend's parameter names (tensorrtllm_backend
    docs/model_config.md), which the GPU layout's ``llm`` maps to ``ExecutorConfig`` (serving/executor_engine.py)."""

    batch_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] = "guaranteed_no_evict"
    kv_cache_free_gpu_mem_fraction: float = Field(0.9, gt=0, le=1)
    #: "auto": the builder's memory budget (≤ max_batch_size × max_seq_len); "unset": only the fraction rules.
    max_tokens_in_paged_kv_cache: int | Literal["auto", "unset"] = "auto"
    enable_kv_cache_reuse: bool = True
    enable_chunked_context: bool = True
    multi_gpu_mode: Literal["orchestrator", "leader"] = "orchestrator"


class BuildSettings(_Strict):
    max_batch_size: int = Field(64, ge=1)
    max_input_len: int = Field(3072, ge=1)
    max_seq_len: int = Field(4096, ge=2)
    max_num_tokens: int = Field(8192, ge=1)
    multiple_profiles: bool = True
    tokens_per_block: int = Field(32, ge=8)


class GpuProfile(_Strict):
    serving: dict
    build: BuildSettings = BuildSettings()
    runtime: TrtllmOptions = TrtllmOptions()

    @classmethod
    def load(cls, name_or_path: str | Path) -> GpuProfile:
        path = Path(name_or_path)
        if not path.suffix:
            path = PROFILES_DIR / f"{name_or_path}.yaml"
        return cls.model_validate(yaml.safe_load(path.read_text()) or {})

    def serving_profile(self, **overrides):
        from ..profile import ServingProfile

        data = dict(self.serving)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return ServingProfile.model_validate(data)
