"""The chart's CPU container, run for real: the exact args and environment `helm template` renders for
ci/cpu-values.yaml start the real launcher and tritonserver, the `helm test` checks pass against it, the admin
APIs the chart restricts refuse requests without the key, and SIGTERM drains within the grace period the chart
computed.

Two ways, one set of tests:
- TRITON_LLM_IMAGE=<image> (`make image-test` sets it; a container engine, podman or docker, must be present):
  the chart's containers run from the CPU image as the pod runs them — the verify-engine init container, then the
  Triton container (its args and env, uid/gid, dropped capabilities, /tmp and /dev/shm, the image's own model),
  the front door in the same network namespace, and the `helm test` checks in the image too.
- otherwise the command outside any container: the same args and env, on free local ports, with the session's
  tiny model from conftest.py.

Slower than tests/test_helm.py (it starts a server).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

from serving.launcher import free_port, free_ports
from serving.parent_death import stop_with_parent
from test_helm import FILES, ROOT, docs_of, helm_bin, helm_env, one, profile_file, template  # noqa: F401 (fixtures)

ADMIN_KEY = "chart-test-admin-key"
API_KEY = "chart-test-api-key"


IMAGE = os.environ.get("TRITON_LLM_IMAGE") or None
CHART_FILES_MOUNT = "/opt/triton-llm-chart"  # where the chart's ConfigMap of scripts is mounted in the pod


def _engine() -> list[str]:
    found = os.environ.get("CONTAINER_ENGINE") or shutil.which("podman") or shutil.which("docker")
    if found is None:
        pytest.fail(f"TRITON_LLM_IMAGE={IMAGE} is set but neither podman nor docker is installed", pytrace=False)
    if os.path.basename(found) == "podman":  # Debian's podman here: runc, and explicit ulimits (README: Container)
        return [found, "--runtime", os.environ.get("OCI_RUNTIME", "runc")]
    return [found]


def _engine_run_args() -> list[str]:
    if os.path.basename(_engine()[0]) == "podman":
        return ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    return []


def _container_args(container: dict, pod: dict) -> list[str]:
    """The pod's and the container's security context and volumes, as `run` options."""
    sc = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    args = []
    if "runAsUser" in sc:
        args += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
    if sc.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for m in container.get("volumeMounts", []):
        vol = volumes[m["name"]]
        if m["mountPath"] == "/dev/shm":
            args.append(f"--shm-size={vol['emptyDir'].get('sizeLimit', '64Mi').replace('Mi', 'm').replace('Gi', 'g')}")
        elif "emptyDir" in vol:
            args += ["--tmpfs", f"{m['mountPath']}:rw,mode=1777"]
        elif "configMap" in vol:  # the chart's scripts: this checkout's files
            args += ["-v", f"{FILES}:{m['mountPath']}:ro"]
    return args


class _LogView:
    def __init__(self, name: str):
        self.name = name

    def read_text(self) -> str:
        out = subprocess.run([*_engine(), "logs", self.name], capture_output=True, text=True, timeout=60)
        return out.stdout + out.stderr


class _ContainerProcess:
    """What the tests do with a subprocess.Popen, for a container: poll, signal, wait, kill."""

    def __init__(self, name: str):
        self.name = name

    def _state(self) -> dict:
        out = subprocess.run([*_engine(), "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", self.name],
                             capture_output=True, text=True, timeout=60)
        status, _, code = out.stdout.strip().partition(" ")
        return {"status": status or "gone", "code": int(code) if code.lstrip("-").isdigit() else None}

    def poll(self) -> int | None:
        state = self._state()
        return None if state["status"] in ("running", "created", "configured", "initialized") else state["code"]

    def send_signal(self, sig: int) -> None:
        subprocess.run([*_engine(), "kill", "--signal", signal.Signals(sig).name.removeprefix("SIG"), self.name],
                       check=True, capture_output=True, timeout=60)

    def wait(self, timeout: float | None = None) -> int:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600)
        while (code := self.poll()) is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.2)
        return code

    def kill(self) -> None:
        subprocess.run([*_engine(), "rm", "-f", "-t", "0", self.name], capture_output=True, timeout=120)


def _status(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return 0

def _wait_ready(url: str, proc, log, timeout_s: float, what: str) -> None:
    """Poll ``url`` until it answers 200; if ``proc`` ends or the time runs out, fail with its log's tail (read
    before the kill: a removed container has no logs), the process stopped."""
    deadline = time.monotonic() + timeout_s
    while _status(url) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text()[-3000:]
            proc.kill()
            pytest.fail(f"{what} did not become ready:\n{tail}", pytrace=False)
        time.sleep(0.3)



@pytest.fixture(scope="module")
def chart_server(helm_bin, helm_env, request, tmp_path_factory):
    docs = docs_of(template(helm_bin, helm_env, values=[profile_file("cpu")]).stdout)
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert "command" not in server  # the image's ENTRYPOINT: tini -- python -m serving serve
    args = [a.replace("$(TRITON_ADMIN_KEY)", ADMIN_KEY) for a in server["args"]]
    assert args[0].startswith("--model-repository=")
    grace = pod["terminationGracePeriodSeconds"]
    pre_stop = int(server["lifecycle"]["preStop"]["exec"]["command"][1])
    info = {"drain_budget": grace - pre_stop, "pod": pod}
    if IMAGE:
        yield from _chart_server_in_image(pod, server, args, info)
        return
    ports = dict(zip(("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "HEALTH_PORT"), free_ports(4)))
    env = dict(os.environ)
    for e in server["env"]:
        if e["name"] in ports:
            env[e["name"]] = str(ports[e["name"]])
        elif "value" in e:
            env[e["name"]] = e["value"]
    env["TRITON_ADMIN_KEY"] = ADMIN_KEY  # what the secretKeyRef provides in the cluster
    args[0] = f"--model-repository={request.getfixturevalue('model_repository')}"
    log = tmp_path_factory.mktemp("chart-server") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", *args], cwd=ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=stop_with_parent())
    http = f"127.0.0.1:{ports['HTTP_PORT']}"
    _wait_ready(f"http://{http}/v2/health/ready", proc, log, 300, "the chart's CPU command")
    try:
        yield {**info, "proc": proc, "http": http, "http_host": http, "grpc": f"127.0.0.1:{ports['GRPC_PORT']}",
               "health_host": f"127.0.0.1:{ports['HEALTH_PORT']}", "server": server,
               "log": log, "netns": None, "client_python": sys.executable}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _chart_server_in_image(pod: dict, server: dict, args: list[str], info: dict):
    """The pod from the image: the init container, then the Triton container on the chart's own ports (published
    on free local ones for the checks from outside), its model repository the image's."""
    name = f"triton-llm-helm-live-{uuid.uuid4().hex[:8]}"
    for init in pod.get("initContainers", []):
        proc = subprocess.run([*_engine(), "run", "--rm", *_engine_run_args(), *_container_args(init, pod),
                               *[f"-e{e['name']}={e['value']}" for e in init.get("env", []) if "value" in e],
                               "--entrypoint", init["command"][0], IMAGE, *init["command"][1:], *init.get("args", [])],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"init container {init['name']}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    env["TRITON_ADMIN_KEY"] = ADMIN_KEY  # what the secretKeyRef provides in the cluster
    inner = {k: int(env[k]) for k in ("HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "HEALTH_PORT")}
    front = next((c for c in pod["containers"] if c["name"] == "openai"), None)
    openai_inner = next((int(a.split("=", 1)[1]) for a in (front or {}).get("command", []) if a.startswith("--port=")),
                        9000)
    host = dict(zip((*inner, "OPENAI_PORT"), free_ports(5)))
    publish = [a for k, p in inner.items() for a in ("-p", f"127.0.0.1:{host[k]}:{p}")]
    publish += ["-p", f"127.0.0.1:{host['OPENAI_PORT']}:{openai_inner}"]  # the front door shares this netns
    subprocess.run([*_engine(), "run", "-d", "--name", name, *_engine_run_args(), *_container_args(server, pod),
                    *publish, *[f"-e{k}={v}" for k, v in env.items()], IMAGE, *args],
                   check=True, capture_output=True, text=True, timeout=120)
    proc = _ContainerProcess(name)
    http_host = f"127.0.0.1:{host['HTTP_PORT']}"
    try:
        _wait_ready(f"http://{http_host}/v2/health/ready", proc, _LogView(name), 300, "the chart's Triton container")
        yield {**info, "proc": proc, "http": f"127.0.0.1:{inner['HTTP_PORT']}", "http_host": http_host,
               "grpc": f"127.0.0.1:{inner['GRPC_PORT']}", "health_host": f"127.0.0.1:{host['HEALTH_PORT']}",
               "server": server, "log": _LogView(name), "netns": name,
               "client_python": "python", "openai_inner": openai_inner, "openai_host": host["OPENAI_PORT"]}
    finally:
        proc.kill()


def _helm_check(*args: str, netns: str | None = None, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess:
    """helm_test.py with ARGS: with ``netns`` (a container's name), as the chart's test pod runs it — in the image,
    the chart's files mounted where its ConfigMap goes, in that container's network namespace; else here."""
    if netns is None:
        return subprocess.run([sys.executable, "-B", str(FILES / "helm_test.py"), *args], capture_output=True,
                              text=True, timeout=180, cwd=ROOT, env=env)
    keys = [f"-eLLM_API_KEY={env['LLM_API_KEY']}"] if env and env.get("LLM_API_KEY") else []
    return subprocess.run([*_engine(), "run", "--rm", *_engine_run_args(), "--network", f"container:{netns}",
                           "-v", f"{FILES}:{CHART_FILES_MOUNT}:ro", *keys, "--entrypoint", "python3", IMAGE, "-B",
                           f"{CHART_FILES_MOUNT}/helm_test.py", *args],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("check", ["ready", "generate", "stream", "chat"])
def test_helm_test_checks_pass_against_the_chart_command(chart_server, check):
    proc = _helm_check(check, f"--http={chart_server['http']}", "--prompt=def f():", "--max-tokens=8",
                       netns=chart_server["netns"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"OK {check}:")


def test_helm_test_grpc_stream(chart_server):
    proc = _helm_check("grpc-stream", f"--grpc={chart_server['grpc']}", "--prompt=def f():", "--max-tokens=8",
                       f"--client-python={chart_server['client_python']}", netns=chart_server["netns"])
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def chart_front_door(chart_server, tmp_path):
    """The chart's `openai` container, run for real: its command (the image's python -> this interpreter, the
    gRPC and OpenAI ports -> free local ones) and LLM_API_KEY, which the secretKeyRef provides in the cluster."""
    front = next(c for c in chart_server["pod"]["containers"] if c["name"] == "openai")
    if chart_server["netns"]:
        yield from _front_door_in_image(chart_server, front)
        return
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
                                stdin=subprocess.DEVNULL, preexec_fn=stop_with_parent())
    probe = front["readinessProbe"]["httpGet"]["path"]
    _wait_ready(f"http://127.0.0.1:{port}{probe}", proc, log, 120, "the chart's front door")
    try:
        yield {"proc": proc, "openai": f"127.0.0.1:{port}", "log": log, "netns": None}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _front_door_in_image(chart_server: dict, front: dict):
    """The chart's `openai` container from the image, in the Triton container's network namespace (a pod's)."""
    name = f"{chart_server['netns']}-openai"
    env = {e["name"]: e["value"] for e in front.get("env", []) if "value" in e}
    env["LLM_API_KEY"] = API_KEY
    subprocess.run([*_engine(), "run", "-d", "--name", name, *_engine_run_args(),
                    *_container_args(front, chart_server["pod"]), "--network", f"container:{chart_server['netns']}",
                    *[f"-e{k}={v}" for k, v in env.items()], "--entrypoint", front["command"][0], IMAGE,
                    *front["command"][1:]], check=True, capture_output=True, text=True, timeout=120)
    proc = _ContainerProcess(name)
    probe = front["readinessProbe"]["httpGet"]["path"]
    try:
        _wait_ready(f"http://127.0.0.1:{chart_server['openai_host']}{probe}", proc, _LogView(name), 120,
                    "the chart's front door")
        yield {"proc": proc, "openai": f"127.0.0.1:{chart_server['openai_inner']}", "log": _LogView(name),
               "netns": chart_server["netns"]}
    finally:
        proc.kill()


def test_helm_test_openai_chat_through_the_chart_front_door(chart_front_door):
    """helm test's `openai-chat` check against the chart's two containers; without the key it is refused (401),
    with the Secret's key it gets a chat completion; SIGTERM (what the kubelet sends) stops the front door with 0."""
    args = ["openai-chat", f"--openai={chart_front_door['openai']}", "--max-tokens=8", "--expect="]
    netns = chart_front_door["netns"]
    proc = _helm_check(*args, netns=netns, env={k: v for k, v in os.environ.items() if k != "LLM_API_KEY"})
    assert proc.returncode == 1 and "401" in proc.stderr, proc.stderr
    proc = _helm_check(*args, netns=netns, env=dict(os.environ, LLM_API_KEY=f"{API_KEY},another-key"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("OK openai-chat:") and "model " in proc.stdout
    front = chart_front_door["proc"]
    front.send_signal(signal.SIGTERM)
    assert front.wait(60) == 0, chart_front_door["log"].read_text()[-2000:]


def test_helm_test_check_fails_readably_when_nothing_listens():
    proc = _helm_check("ready", f"--http=127.0.0.1:{free_port()}", "--retries=0")
    assert proc.returncode == 1 and proc.stderr.startswith("FAIL ready:"), proc.stderr


def test_admin_apis_need_the_key(chart_server):
    base = f"http://{chart_server['http_host']}"
    for path in ("/v2/trace/setting", "/v2/logging"):  # the launcher restricts them (the chart adds no flags)
        assert _status(base + path) == 403, path
        assert _status(base + path, {"admin-key": ADMIN_KEY}) == 200, path
    assert _status(base + "/v2/health/live") == 200


def test_the_liveness_probe_generates(chart_server):
    """The chart's livenessProbe, as the kubelet sends it: the path on the container's named port answers 200 after
    generating a token (serving/health.py)."""
    probe = chart_server["server"]["livenessProbe"]["httpGet"]
    port = next(p for p in chart_server["server"]["ports"] if p["name"] == probe["port"])
    assert port["containerPort"] == int(chart_server["server"]["env"][
        [e["name"] for e in chart_server["server"]["env"]].index("HEALTH_PORT")]["value"])
    with urllib.request.urlopen(f"http://{chart_server['health_host']}{probe['path']}", timeout=30) as r:
        body = json.loads(r.read())
    assert r.status == 200 and body["ok"], body


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
