"""Profile -> perf_analyzer / genai-perf command lines (one per load level).

The ensemble is decoupled, so perf_analyzer always talks gRPC with ``--streaming`` (Triton refuses unary
ModelInfer for decoupled models); a non-streaming profile sends ``stream: false`` in the input data and gets
exactly one response per request, still over the stream API.

A profile with ``endpoint: chat`` or ``completions`` measures the OpenAI front door (``python -m serving openai``)
instead: genai-perf's ``--endpoint-type chat|completions`` over HTTP + SSE, ``-u`` = the front door's host:port.
genai-perf sends ``max_tokens`` there; OpenAI has no ``min_tokens`` (the front door refuses unknown parameters
with 400), so output lengths are "up to" the profile's, and the model may stop earlier at its end token.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from .spec import LoadProfile, level_str


@dataclass(frozen=True)
class Endpoints:
    grpc: str = "localhost:8001"  # host:port
    metrics: str | None = "http://localhost:8002/metrics"
    http: str | None = "http://localhost:8000"

    @classmethod
    def from_grpc(cls, grpc: str, http_port_offset: int = -1, metrics_port_offset: int = 1) -> "Endpoints":
        """Triton's default layout: HTTP = gRPC-1, metrics = gRPC+1 (8000/8001/8002)."""
        host, _, port = grpc.rpartition(":")
        p = int(port)
        return cls(grpc, f"http://{host}:{p + metrics_port_offset}/metrics", f"http://{host}:{p + http_port_offset}")


def request_count(profile: LoadProfile, level: float) -> int:
    """The fixed request count for one level (0 = time windows)."""
    m = profile.measurement
    if not (m.request_count or m.requests_per_stream):
        return 0
    per_stream = max(m.requests_per_stream, 2)
    n = max(m.request_count, int(per_stream * level + 0.999))
    return n


def perf_analyzer_args(profile: LoadProfile, level: float, *, url: str, input_data: Path, csv: Path,
                       export: Path, metrics_url: str | None = None) -> list[str]:
    """perf_analyzer arguments (without the binary) measuring ``profile`` at one load level."""
    m = profile.measurement
    args = ["-m", profile.model, "-i", "grpc", "-u", url, "--streaming", "--input-data", str(input_data),
            "--measurement-interval", str(m.interval_ms), "--max-trials", str(m.max_trials),
            "--stability-percentage", f"{m.stability_percentage:g}", "--percentile", "99",
            "-f", str(csv), "--verbose-csv", "--profile-export-file", str(export)]
    if profile.load.mode == "concurrency":
        n = int(level)
        # One thread per stream: perf_analyzer's default caps threads at 16 for concurrency mode.
        args += ["--concurrency-range", str(n), "--max-threads", str(max(16, n))]
    else:
        args += ["--request-rate-range", f"{level:g}", "--request-distribution", profile.load.distribution,
                 "--max-threads", "16"]
    count = request_count(profile, level)
    if count:
        args += ["--request-count", str(count)]
    if metrics_url:
        args += ["--collect-metrics", "--metrics-url", metrics_url, "--metrics-interval", "1000"]
    return args


def genai_perf_args(profile: LoadProfile, level: float, *, url: str, tokenizer: Path, artifact_dir: Path,
                    metrics_url: str | None = None) -> list[str]:
    """genai-perf arguments (without the executable) for the same level: synthetic prompts of the profile's
    lengths, tokenised with the local tokenizer, exact output lengths (min_tokens / ignore_eos)."""
    inputs = profile.inputs
    kinds = inputs.kinds()
    if len(kinds) > 1:
        raise ValueError(f"profile {profile.name!r} mixes request kinds; genai-perf takes one distribution "
                         "(use perf_analyzer: python -m loadtest sweep)")
    p, o = kinds[0].prompt_tokens, kinds[0].output_tokens
    if profile.openai:
        target = ["--endpoint-type", profile.endpoint, "-u", url.removeprefix("http://")]
    else:
        target = ["--endpoint-type", "kserve", "--backend", "tensorrtllm", "-u", url]
    args = ["profile", "-m", profile.model, *target, "--tokenizer", str(tokenizer),
            "--synthetic-input-tokens-mean", str(p.mean), "--synthetic-input-tokens-stddev", f"{p.stddev:g}",
            "--output-tokens-mean", str(o.mean), "--output-tokens-stddev", f"{o.stddev:g}",
            "--num-prompts", str(inputs.num_prompts), "--random-seed", str(inputs.seed),
            "--artifact-dir", str(artifact_dir), "--profile-export-file", "profile_export.json"]
    if inputs.exact_output and o.stddev == 0 and not profile.openai:
        # genai-perf's --output-tokens-mean-deterministic sends tensorrtllm_backend's old ``min_length``;
        # our ensemble (like current tensorrtllm_backend) calls it min_tokens.
        args += ["--extra-inputs", f"min_tokens:{o.mean}"]
    if profile.streaming:
        args += ["--streaming"]
    if profile.load.mode == "concurrency":
        args += ["--concurrency", str(int(level))]
    else:
        args += ["--request-rate", f"{level:g}"]
    count = request_count(profile, level)
    if count:
        args += ["--request-count", str(count)]
    else:
        args += ["--measurement-interval", str(profile.measurement.interval_ms),
                 "--stability-percentage", f"{profile.measurement.stability_percentage:g}"]
    if metrics_url and not profile.openai:  # Triton telemetry; the front door's own /metrics is not Triton's
        args += ["--server-metrics-url", metrics_url]
    if profile.measurement.warmup_requests:
        # perf_analyzer 2.51 (under genai-perf) hangs after its warm-up when it sends fewer warm-up requests than
        # the concurrency (seen with --service-kind openai: "Sending 1 warmup request" at concurrency 2, forever):
        # warm up at least one request per stream.
        warm = profile.measurement.warmup_requests
        if profile.load.mode == "concurrency":
            warm = max(warm, int(level))
        args += ["--warmup-request-count", str(warm)]
    return args


def level_dir_name(profile: LoadProfile, level: float) -> str:
    return f"{'c' if profile.load.mode == 'concurrency' else 'r'}{level_str(level)}"


def render(argv: list[str]) -> str:
    return shlex.join(str(a) for a in argv)
