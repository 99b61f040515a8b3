"""The front door's own Prometheus metrics (Triton's stay on Triton's metrics port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)


class FrontDoorMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.requests = Counter("openai_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("openai_request_duration_seconds", "From the request to its last byte", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft = Histogram("openai_time_to_first_token_seconds", "Streamed requests: from the request to the "
                              "first content chunk", ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.in_flight = Gauge("openai_requests_in_flight", "Generation requests being served", registry=self.registry)
        self.prompt_tokens = Counter("openai_prompt_tokens", "Prompt tokens of finished requests",
                                     registry=self.registry)
        self.completion_tokens = Counter("openai_completion_tokens", "Completion tokens of finished requests",
                                         registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
