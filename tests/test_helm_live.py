"""The chart's CPU container, run for real: the exact args and environment `helm template` renders for
ci/cpu-values.yaml start the real launcher and tritonserver (on free local ports, with the test model
repository), the `helm test` checks pass against it, the admin APIs the chart restricts refuse requests without
the key, and SIGTERM drains within the grace period the chart computed.

Slower than tests/test_helm.py (it starts a server); it shares the session's tiny model from conftest.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from serving.launcher import free_port
from test_helm import FILES, ROOT, docs_of, helm_bin, helm_env, one, profile_file, template  # noqa: F401 (fixtures)

ADMIN_KEY = "chart-test-admin-key"
API_KEY = "chart-test-api-key"


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0


@pytest.fixture(scope="module")
def chart_server(helm_bin, helm_env, model_repository, tmp_path_factory):
    docs = docs_of(template(helm_bin, helm_env, values=[profile_file("cpu")]).stdout)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert "command" not in server  # the image's ENTRYPOINT: tini -- python -m serving serve
    ports = {"HTTP_PORT": free_port(), "GRPC_PORT": free_port(), "METRICS_PORT": free_port()}
    assert len(set(ports.values())) == 3
    env = dict(os.environ)
    for e in server["env"]:
        if e["name"] in ports:
            env[e["name"]] = str(ports[e["name"]])
        elif "value" in e:
            env[e["name"]] = e["value"]
    env["TRITON_ADMIN_KEY"] = ADMIN_KEY  # what the secretKeyRef provides in the cluster
    args = [a.replace("$(TRITON_ADMIN_KEY)", ADMIN_KEY) for a in server["args"]]
    assert args[0].startswith("--model-repository=")
    args[0] = f"--model-repository={model_repository}"
    log = tmp_path_factory.mktemp("chart-server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    http = f"127.0.0.1:{ports['HTTP_PORT']}"
    deadline = time.monotonic() + 300
    while _status(f"http://{http}/v2/health/ready") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the chart's CPU command did not become ready:\n{log.read_text()[-3000:]}", pytrace=False)
        time.sleep(0.5)
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    try:
        yield {"proc": proc, "http": http, "grpc": f"127.0.0.1:{ports['GRPC_PORT']}", "log": log,
               "drain_budget": grace - pre_stop, "pod": pod}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _helm_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-B", str(FILES / "helm_test.py"), *args], capture_output=True,
                          text=True, timeout=180, cwd=ROOT)


@pytest.mark.parametrize("check", ["ready", "generate", "stream", "chat"])
def test_helm_test_checks_pass_against_the_chart_command(chart_server, check):
    proc = _helm_check(check, f"--http={chart_server['http']}", "--prompt=def f():", "--max-tokens=8")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK {check}:")


def test_helm_test_grpc_stream(chart_server):
    proc = _helm_check("grpc-stream", f"--grpc={chart_server['grpc']}", "--prompt=def f():", "--max-tokens=8",
                       f"--client-python={sys.executable}")
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def chart_front_door(chart_server, tmp_path):
    """The chart's `openai` container, run for real: its command (the image's python -> this interpreter, the
    gRPC and OpenAI ports -> free local ones) and LLM_API_KEY, which the secretKeyRef provides in the cluster."""
    front = next(c for c in chart_server["pod"]["containers"] if c["name"] == "openai")
    port = free_port()
    grpc_port = chart_server["grpc"].rsplit(":", 1)[1]
    command = [sys.executable] + [
        f"--triton=localhost:{grpc_port}" if a.startswith("--triton=") else f"--port={port}" if a.startswith("--port=")
        else a for a in front["command"][1:]]
    assert command[1:4] == ["-m", "serving", "openai"]
    env = dict(os.environ, LLM_API_KEY=API_KEY)
    env.update({e["name"]: e["value"] for e in front["env"] if "value" in e})
    log = tmp_path / "front-door.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    probe = front["readinessProbe"]["httpGet"]["path"]
    deadline = time.monotonic() + 120
    while _status(f"http://127.0.0.1:{port}{probe}") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the chart's front door did not become ready:\n{log.read_text()[-3000:]}", pytrace=False)
        time.sleep(0.3)
    try:
        yield {"proc": proc, "openai": f"127.0.0.1:{port}", "log": log}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_helm_test_openai_chat_through_the_chart_front_door(chart_front_door):
    """helm test's `openai-chat` check against the chart's two containers; without the key it is refused (401),
    with the Secret's key it gets a chat completion; SIGTERM (what the kubelet sends) stops the front door with 0."""
    args = ["openai-chat", f"--openai={chart_front_door['openai']}", "--max-tokens=8", "--expect="]
    proc = subprocess.run([sys.executable, "-B", str(FILES / "helm_test.py"), *args], capture_output=True, text=True,
                          timeout=180, cwd=ROOT, env={k: v for k, v in os.environ.items() if k != "LLM_API_KEY"})
    assert proc.returncode == 1 and "401" in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-B", str(FILES / "helm_test.py"), *args], capture_output=True, text=True,
                          timeout=180, cwd=ROOT, env=dict(os.environ, LLM_API_KEY=f"{API_KEY},another-key"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK openai-chat:") and "model " in proc.stdout
    front = chart_front_door["proc"]
    front.send_signal(signal.SIGTERM)
    assert front.wait(60) == 0, chart_front_door["log"].read_text()[-2000:]


def test_helm_test_check_fails_readably_when_nothing_listens():
    proc = _helm_check("ready", f"--http=127.0.0.1:{free_port()}", "--retries=0")
    assert proc.returncode == 1 and proc.stderr.startswith("FAIL ready:"), proc.stderr


def test_admin_apis_need_the_key(chart_server):
    base = f"http://{chart_server['http']}"
    for path in ("/v2/trace/setting", "/v2/logging"):  # the launcher restricts them (the chart adds no flags)
        assert _status(base + path) == 403, path
        assert _status(base + path, {"admin-key": ADMIN_KEY}) == 200, path
    assert _status(base + "/v2/health/live") == 200


def test_sigterm_drains_within_the_computed_grace(chart_server):
    proc = chart_server["proc"]
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=chart_server["drain_budget"])
    except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within {chart_server['drain_budget']} s (terminationGracePeriodSeconds - preStop)")
    assert rc == 0, chart_server["log"].read_text()[-2000:]
    assert time.monotonic() - start < chart_server["drain_budget"]
