"""Typed load-test profiles (``loadtest/profiles/*.yaml``).

A profile says *what* load to offer (closed-loop concurrency or an open-loop Poisson/constant request rate),
*which* requests (prompt and output token-length distributions, streaming or not), *how long* to measure,
and *which SLOs* the result must meet. ``loadtest.commands`` turns it into perf_analyzer / genai-perf
command lines; ``loadtest.sweep`` runs them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
PROFILES_DIR = PACKAGE_DIR / "profiles"
DEFAULT_TOKENIZER = PROJECT_ROOT / "build" / "models" / "smollm2"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenDist(_Strict):
    """A token-length distribution: normal(mean, stddev) clipped to [min, max] and rounded."""

    mean: int = Field(ge=1)
    stddev: float = Field(0.0, ge=0)
    min: int | None = Field(None, ge=1)
    max: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> "TokenDist":
        lo, hi = self.low, self.high
        if lo > hi:
            raise ValueError(f"min {lo} > max {hi}")
        if not lo <= self.mean <= hi:
            raise ValueError(f"mean {self.mean} outside [{lo}, {hi}]")
        return self

    @property
    def low(self) -> int:
        return self.min if self.min is not None else max(1, int(self.mean - 3 * self.stddev))

    @property
    def high(self) -> int:
        return self.max if self.max is not None else int(self.mean + 3 * self.stddev + 0.5)


class PromptMix(_Strict):
    """One kind of request in a mixed workload: its share and its lengths."""

    weight: float = Field(1.0, gt=0)
    prompt_tokens: TokenDist
    output_tokens: TokenDist


class Inputs(_Strict):
    """The request population written to perf_analyzer's ``--input-data`` JSON."""

    prompt_tokens: TokenDist | None = None
    output_tokens: TokenDist | None = None
    mix: list[PromptMix] = Field(default_factory=list, description="weighted request kinds (instead of the two above)")
    num_prompts: int = Field(32, ge=1)
    seed: int = 0
    exact_output: bool = Field(True, description="send min_tokens = max_tokens so every request generates "
                                                 "exactly its output length (genai-perf's ignore_eos)")
    temperature: float | None = Field(None, ge=0, description="None: greedy (the server's default)")

    @model_validator(mode="after")
    def _one_source(self) -> "Inputs":
        if self.mix and (self.prompt_tokens or self.output_tokens):
            raise ValueError("give either mix or prompt_tokens/output_tokens, not both")
        if not self.mix and not (self.prompt_tokens and self.output_tokens):
            raise ValueError("prompt_tokens and output_tokens are required (or a mix)")
        return self

    def kinds(self) -> list[PromptMix]:
        if self.mix:
            return list(self.mix)
        assert self.prompt_tokens is not None and self.output_tokens is not None
        return [PromptMix(weight=1.0, prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens)]


class Load(_Strict):
    """``concurrency``: closed loop, N requests always in flight. ``request_rate``: open loop, requests/s
    with Poisson (or constant) arrivals, whatever the server does."""

    mode: Literal["concurrency", "request_rate"] = "concurrency"
    levels: list[float] = Field(min_length=1)
    distribution: Literal["constant", "poisson"] = "constant"

    @field_validator("levels")
    @classmethod
    def _positive(cls, levels: list[float]) -> list[float]:
        if any(v <= 0 for v in levels):
            raise ValueError("load levels must be > 0")
        return levels

    @model_validator(mode="after")
    def _integral_concurrency(self) -> "Load":
        if self.mode == "concurrency" and any(v != int(v) for v in self.levels):
            raise ValueError("concurrency levels must be whole numbers")
        return self

    @property
    def axis_label(self) -> str:
        return "concurrent streams" if self.mode == "concurrency" else "offered load (requests/s)"


class Measurement(_Strict):
    """How perf_analyzer measures each level.

    ``request_count > 0``: one window of exactly that many requests (bounded, used by smoke tests);
    per level it is raised to at least 2 x concurrency so every stream completes requests.
    Otherwise time windows of ``interval_ms`` until ``stability_percentage`` holds or ``max_trials``; the
    default 999 accepts the first three windows (bounded time, as genai-perf does). With a strict percentage,
    perf_analyzer gives up after ``max_trials`` unstable windows and the level is reported failed.
    """

    request_count: int = Field(0, ge=0)
    requests_per_stream: int = Field(0, ge=0, description="request_count = max(request_count, this x level)")
    interval_ms: int = Field(5000, ge=100)
    max_trials: int = Field(3, ge=1)
    stability_percentage: float = Field(999.0, gt=0)
    warmup_requests: int = Field(0, ge=0, description="sent (and discarded) once before the first level")
    timeout_s: float = Field(300.0, gt=0, description="a level that runs longer is stopped and reported failed")


class SLO(_Strict):
    """Limits a result must meet; ``at`` lists the load levels they apply to (empty: every level)."""

    at: list[float] = Field(default_factory=list)
    ttft_p99_ms: float | None = Field(None, gt=0)
    ttft_p50_ms: float | None = Field(None, gt=0)
    tpot_p99_ms: float | None = Field(None, gt=0)
    tpot_p50_ms: float | None = Field(None, gt=0)
    latency_p99_ms: float | None = Field(None, gt=0)
    min_throughput_rps: float | None = Field(None, ge=0)
    max_error_rate: float = Field(0.0, ge=0, le=1)

    def limits(self) -> dict[str, float]:
        keys = ("ttft_p99_ms", "ttft_p50_ms", "tpot_p99_ms", "tpot_p50_ms", "latency_p99_ms")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


ENDPOINTS = ("kserve", "chat", "completions")
OPENAI_ENDPOINTS = ("chat", "completions")


class LoadProfile(_Strict):
    name: str
    description: str = ""
    tool: Literal["perf_analyzer", "genai-perf"] = "perf_analyzer"
    endpoint: Literal["kserve", "chat", "completions"] = Field(
        "kserve", description="kserve: Triton's gRPC stream API to the ensemble (perf_analyzer or genai-perf); "
                              "chat / completions: the OpenAI front door's /v1/chat/completions or /v1/completions "
                              "over HTTP + SSE (genai-perf only; --url is then the front door's host:port)")
    model: str = Field("ensemble", description="Triton model name (kserve) or the served model id (OpenAI)")
    streaming: bool = Field(True, description="send stream=true (token by token); false: one response")
    load: Load
    inputs: Inputs
    measurement: Measurement = Measurement()
    slo: SLO = SLO()

    @model_validator(mode="after")
    def _openai_needs_genai_perf(self) -> "LoadProfile":
        if self.endpoint in OPENAI_ENDPOINTS and self.tool != "genai-perf":
            raise ValueError(f"endpoint {self.endpoint!r} (the OpenAI front door) is measured with genai-perf: "
                             "set tool: genai-perf (perf_analyzer 2.51 here speaks Triton's protocols only)")
        return self

    @property
    def openai(self) -> bool:
        return self.endpoint in OPENAI_ENDPOINTS

    @classmethod
    def load_file(cls, path: str | Path) -> "LoadProfile":
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)

    def with_overrides(self, *, levels: list[float] | None = None, request_count: int | None = None,
                       num_prompts: int | None = None, model: str | None = None) -> "LoadProfile":
        profile = self
        if model:
            profile = profile.model_copy(update={"model": model})
        if levels:
            profile = profile.model_copy(update={"load": profile.load.model_copy(update={"levels": levels})})
        if request_count is not None:
            m = profile.measurement.model_copy(update={"request_count": request_count})
            profile = profile.model_copy(update={"measurement": m})
        if num_prompts is not None:
            i = profile.inputs.model_copy(update={"num_prompts": num_prompts})
            profile = profile.model_copy(update={"inputs": i})
        return LoadProfile.model_validate(profile.model_dump())  # re-validate the combination


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> LoadProfile:
    """A profile by name (``loadtest/profiles/NAME.yaml``) or by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILES_DIR / f"{name_or_path}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no load profile {name_or_path!r}; available: {', '.join(available_profiles())}")
    return LoadProfile.load_file(path)


def level_str(value: float) -> str:
    """1.0 -> '1', 2.5 -> '2.5' (file names, tables)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
