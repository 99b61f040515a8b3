"""The engine gauges on the front door's port for an inference gateway's endpoint picker (serving/openai/
engine_metrics.py), read the way the picker reads them: a GET of the path on the routed port with no credentials,
parsed with an independent Prometheus text parser (prometheus_client's), series picked by name and labels.

The overload run with the gauges crossing and falling back is in tests/test_prometheus.py (both layouts).
"""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from serving.openai.engine_metrics import engine_families
from tests.openai_front import FrontDoorProcess

pytestmark = pytest.mark.both_layouts

PATH = "/engine/metrics"
KEY = "gateway-test-key"


def epp_get(url: str) -> tuple[int, str, str]:
    """(status, content type, body) of a scrape with no Authorization header, as the picker sends it."""
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read().decode()


def families(text: str) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def relaying_door(triton):
    door = FrontDoorProcess(triton.urls.grpc, api_keys=KEY,
                            extra_args=("--engine-metrics-path", PATH, "--triton-metrics-url", triton.urls.metrics))
    yield door
    door.stop()


def test_engine_gauges_are_served_without_the_key(relaying_door, triton):
    status, content_type, body = epp_get(relaying_door.url + PATH)
    assert status == 200, body
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    found = families(body)
    # Both layouts: the llm model's engine gauges, one series each, labelled with the model.
    for name in ("llm_engine_queued_requests", "llm_engine_active_slots", "llm_engine_kv_cache_occupancy"):
        (sample,) = found[name]
        assert sample.labels == {"model": "llm", "version": "1"} and sample.value >= 0, sample
    if triton.layout == "trtllm-standin":  # TensorRT-LLM's families, what the picker's triton-tensorrt-llm type reads
        requests = {s.labels["request_type"]: s.value for s in found["nv_trt_llm_request_metrics"]}
        kv = {s.labels["kv_cache_block_type"]: s.value for s in found["nv_trt_llm_kv_cache_block_metrics"]}
        assert {"waiting", "scheduled", "active", "max"} <= set(requests) and {"fraction", "tokens_per"} <= set(kv)
    # Only engine families: none of Triton's request counters, model names of other models or the front door's own.
    assert all(name.startswith(("llm_engine_", "nv_trt_llm_")) for name in found), sorted(found)


def test_the_rest_still_wants_the_key(relaying_door):
    for path in ("/metrics", "/v1/models"):
        status, _, body = epp_get(relaying_door.url + path)
        assert status == 401 and "API key" in body, (path, status, body)


def test_a_dead_metrics_port_is_a_scrape_error_not_an_idle_engine(triton):
    from serving.launcher import free_port

    door = FrontDoorProcess(triton.urls.grpc, extra_args=(
        "--engine-metrics-path", PATH, "--triton-metrics-url", f"http://127.0.0.1:{free_port()}/metrics"))
    try:
        status, _, body = epp_get(door.url + PATH)
    finally:
        door.stop()
    assert status == 503 and "metrics_unavailable" in body, (status, body)


def test_off_by_default(triton):
    door = FrontDoorProcess(triton.urls.grpc)
    try:
        status, _, _ = epp_get(door.url + PATH)
    finally:
        door.stop()
    assert status == 404


@pytest.mark.parametrize("path", ["engine/metrics", "/engine/metrics/", "/v1/models", "/metrics"])
def test_a_bad_path_is_refused_at_start(path, triton):
    run = subprocess.run([sys.executable, "-m", "serving", "openai", "--triton", triton.urls.grpc,
                          "--engine-metrics-path", path], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "engine metrics path" in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_only_engine_families_pass():
    exposition = "\n".join([
        "# HELP nv_inference_request_success Number of successful inference requests",
        "# TYPE nv_inference_request_success counter",
        'nv_inference_request_success{model="llm",version="1"} 3',
        "# HELP llm_engine_queued_requests Requests waiting for a KV-cache slot",
        "# TYPE llm_engine_queued_requests gauge",
        'llm_engine_queued_requests{model="llm",version="1"} 5',
        "# TYPE nv_trt_llm_request_metrics gauge",
        'nv_trt_llm_request_metrics{model="llm",request_type="waiting",version="1"} 2',
        "# TYPE openai_requests counter",
        'openai_requests_total{route="x",status="200"} 1',
    ])
    kept = engine_families(exposition)
    assert kept.splitlines() == [
        "# HELP llm_engine_queued_requests Requests waiting for a KV-cache slot",
        "# TYPE llm_engine_queued_requests gauge",
        'llm_engine_queued_requests{model="llm",version="1"} 5',
        "# TYPE nv_trt_llm_request_metrics gauge",
        'nv_trt_llm_request_metrics{model="llm",request_type="waiting",version="1"} 2']
    assert engine_families("# TYPE nv_inference_count counter\nnv_inference_count 1\n") == ""
