"""Section 7 — admin APIs are not reachable unauthenticated from the serving ports.

The launcher starts tritonserver with ``--http-restricted-api`` / ``--grpc-restricted-protocol`` and a random
admin key. HTTP callers must send ``admin-key: <key>``; gRPC callers ``triton-grpc-protocol-admin-key: <key>``
(Triton prefixes the header name for gRPC). Refusals: HTTP 403, gRPC UNAVAILABLE "This protocol is restricted".
"""

from __future__ import annotations

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

RESTRICTED_HTTP = [
    ("POST", "/v2/repository/index", None),
    ("POST", "/v2/repository/models/llm/load", {}),
    ("POST", "/v2/repository/models/llm/unload", {}),
    ("POST", "/v2/repository/models/ensemble/unload", {"parameters": {"unload_dependents": True}}),
    ("GET", "/v2/systemsharedmemory/status", None),
    ("POST", "/v2/systemsharedmemory/region/r0/register", {"key": "/dev/shm/x", "offset": 0, "byte_size": 64}),
    ("POST", "/v2/systemsharedmemory/region/r0/unregister", None),
    ("POST", "/v2/systemsharedmemory/unregister", None),
    ("GET", "/v2/cudasharedmemory/status", None),
    ("POST", "/v2/cudasharedmemory/unregister", None),
]
# Change server behaviour (log verbosity floods the disk and costs CPU; trace settings), so admin-only too.
SETTINGS_HTTP = [
    ("POST", "/v2/logging", {"log_verbose_level": 0}),
    ("POST", "/v2/trace/setting", {"trace_rate": "1000"}),
]


def http(triton, method: str, path: str, body, key: str | None):
    headers = {} if key is None else {"admin-key": key}
    return requests.request(method, f"{triton.urls.http}{path}", json=body, headers=headers, timeout=10)


@pytest.mark.parametrize("method,path,body", RESTRICTED_HTTP, ids=[p for _, p, _ in RESTRICTED_HTTP])
def test_http_admin_apis_refuse_without_the_key(triton, method, path, body):
    for key in (None, "wrong-key", ""):
        r = http(triton, method, path, body, key)
        assert r.status_code == 403, (key, r.status_code, r.text)
        assert "This API is restricted, expecting header 'admin-key'" in r.text


@pytest.mark.parametrize("method,path,body", RESTRICTED_HTTP, ids=[p for _, p, _ in RESTRICTED_HTTP])
def test_http_admin_apis_answer_with_the_key(triton, method, path, body):
    r = http(triton, method, path, body, triton.admin_key)
    assert r.status_code != 403, r.text
    if path == "/v2/repository/index":
        assert r.status_code == 200 and {m["name"] for m in r.json()} >= {"ensemble", "llm"}
    elif path.endswith(("/load", "/unload")):  # authorised, then refused by --model-control-mode=none
        assert "explicit model load / unload is not allowed" in r.text
    elif path.endswith("/status"):
        assert r.status_code == 200
    # register of a non-existent region: authorised, then "Unable to open shared memory region"
    assert requests.get(f"{triton.urls.http}/v2/health/ready", timeout=5).status_code == 200  # nothing unloaded


@pytest.mark.parametrize("method,path,body", SETTINGS_HTTP, ids=[p for _, p, _ in SETTINGS_HTTP])
def test_http_settings_apis_refuse_without_the_key(triton, method, path, body):
    """The Helm chart restricts trace and logging; the launcher (make serve, the CPU image) must too."""
    r = http(triton, method, path, body, None)
    assert r.status_code == 403, f"{path} answered {r.status_code} to an unauthenticated caller: {r.text}"


def test_network_cannot_move_log_or_trace_files(triton):
    for path, body in (("/v2/logging", {"log_file": "/tmp/owned.log"}), ("/v2/trace/setting",
                                                                       {"trace_file": "/tmp/owned.json"})):
        r = http(triton, "POST", path, body, triton.admin_key)
        assert r.status_code == 501 and "can not be updated through network protocol" in r.text


def grpc_calls(client: grpcclient.InferenceServerClient):
    return {
        "repository index": lambda h: client.get_model_repository_index(headers=h),
        "load": lambda h: client.load_model("llm", headers=h),
        "unload": lambda h: client.unload_model("llm", headers=h),
        "shm status": lambda h: client.get_system_shared_memory_status(headers=h),
        "shm register": lambda h: client.register_system_shared_memory("r0", "/x", 64, headers=h),
        "shm unregister": lambda h: client.unregister_system_shared_memory(headers=h),
        "cuda shm status": lambda h: client.get_cuda_shared_memory_status(headers=h),
    }


def test_grpc_admin_protocols_refuse_without_the_key_and_answer_with_it(triton):
    client = grpcclient.InferenceServerClient(triton.urls.grpc)
    good = {"triton-grpc-protocol-admin-key": triton.admin_key}
    try:
        for name, call in grpc_calls(client).items():
            for headers in (None, {"triton-grpc-protocol-admin-key": "wrong"}, {"admin-key": triton.admin_key}):
                with pytest.raises(InferenceServerException, match="This protocol is restricted") as refused:
                    call(headers)
                assert refused.value.status() == "StatusCode.UNAVAILABLE", name
            try:
                call(good)
            except InferenceServerException as exc:  # authorised; refused only by what the call asks
                assert "restricted" not in exc.message(), (name, exc.message())
                assert any(s in exc.message() for s in ("explicit model load / unload is not allowed",
                                                        "Unable to open shared memory region")), exc.message()
        index = client.get_model_repository_index(headers=good, as_json=True)
        assert {m["name"] for m in index["models"]} >= {"ensemble", "llm"}
        assert client.is_server_ready()  # inference-side APIs stay open
    finally:
        client.close()


def test_grpc_settings_protocols_refuse_without_the_key(triton):
    client = grpcclient.InferenceServerClient(triton.urls.grpc)
    try:
        with pytest.raises(InferenceServerException, match="restricted"):
            client.update_log_settings({"log_verbose_level": 0})
        with pytest.raises(InferenceServerException, match="restricted"):
            client.update_trace_settings(settings={"trace_rate": "1000"})
    finally:
        client.close()


def test_metrics_port_serves_only_metrics(triton):
    base = triton.urls.metrics.rsplit("/", 1)[0]
    assert requests.get(triton.urls.metrics, timeout=5).status_code == 200
    for path in ("/v2/repository/index", "/v2/logging", "/v2/health/ready"):
        assert requests.post(f"{base}{path}", timeout=5).status_code in (404, 405)


def test_the_key_never_reaches_the_log(triton):
    assert triton.admin_key and triton.admin_key not in triton.log_text()
