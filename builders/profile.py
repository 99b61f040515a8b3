"""The serving profile: the one typed source of truth for every rendered ``config.pbtxt``.

Engine limits (batch, sequence, token budget) are read from the engine's own ``config.json`` so a
profile can never promise more than the engine was built for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

PROJECT_ROOT = Path(__file__).resolve().parent.parent


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DynamicBatcher(_Strict):
    """Triton's dynamic batcher and default queue policy for one model."""

    max_queue_delay_us: int = Field(0, ge=0, description="how long Triton waits to grow a batch")
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    max_queue_size: int = Field(0, ge=0, description="requests queued in Triton before UNAVAILABLE; 0 = unbounded")


class Stage(_Strict):
    """The tokeniser stage: instances and batching (None: no dynamic batcher, the default: in Triton 2.51 its queue
    can hold a request for its 500 ms idle timeout while every instance is busy, docs/reliability.md B12)."""

    instances: int = Field(1, ge=1)
    batcher: DynamicBatcher | None = None


class LLMStage(_Strict):
    """The LLM model. On CPU ``execute()`` only enqueues, so one instance serves every request."""

    instances: int = Field(1, ge=1)
    max_queue_size: int = Field(64, ge=1, description="requests waiting for a KV slot before UNAVAILABLE")
    cpu_threads: int = Field(0, ge=0, description="torch threads for the CPU engine; 0 = all cores")
    drain_timeout_s: float = Field(25.0, gt=0, description="finalize() waits this long for in-flight requests")
    # Each response costs the server ~85 µs of CPU whatever it carries, and the client its own share
    # (docs/benchmarks/serving-cost.md); 50 ms is 20 updates a second per stream.
    stream_interval_ms: float = Field(50.0, ge=0, description="a stream's next response waits until this long after "
                                                              "its last (its first token and its end go at once); "
                                                              "0: a response per engine step")
    # TensorRT-LLM's names. 16,384 tokens is what the engine held before its cache was paged (16 slots × 1,024):
    # now one request may take the whole 8,192-token context and the rest is shared, prefixes included.
    max_tokens_in_paged_kv_cache: int | None = Field(
        16384, ge=1, description="the CPU engine's paged KV cache, in tokens, at most max_batch_size × "
                                 "max_seq_len (README: KV cache and prefix caching); None: that most")
    enable_kv_cache_reuse: bool = Field(True, description="reuse the KV of a cached prompt prefix")


class ServingProfile(_Strict):
    name: str
    target: Literal["cpu", "trtllm"] = "cpu"
    engine_dir: Path
    tokenizer_dir: Path
    max_batch_size: int = Field(32, ge=1, description="Triton max_batch_size of the text stages and ensemble")
    llm_model_name: str = "llm"
    # The model id the OpenAI front door serves (serving/openai), read from the ensemble's config by gRPC, so the
    # front door needs no file of ours (in Kubernetes it runs in another container). None: tokenizer_dir's name.
    served_model_name: str | None = Field(None, min_length=1)
    preprocessing: Stage = Stage()
    llm: LLMStage = LLMStage()

    @model_validator(mode="after")
    def _distinct_names(self) -> "ServingProfile":
        if self.llm_model_name in {"preprocessing", "ensemble"}:
            raise ValueError(f"llm_model_name {self.llm_model_name!r} clashes with another model of the ensemble")
        return self

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.tokenizer_dir.name

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> "ServingProfile":
        data = yaml.safe_load(Path(path).read_text()) or {}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(data)

    def resolved(self, base: Path = PROJECT_ROOT) -> "ServingProfile":
        """Relative paths are relative to the project root, wherever the command runs."""
        return self.model_copy(update={"engine_dir": (base / self.engine_dir).resolve(),
                                       "tokenizer_dir": (base / self.tokenizer_dir).resolve()})
