"""The launcher against a real tritonserver (the pytriton wheel's 2.51 on CPU, or /opt/tritonserver)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serving import stub_python
from serving.drain import LLM_GRACE_S, PREPROCESSING_GRACE_S, DrainGate
from serving.launcher import EXIT_TIMEOUT_AFTER_DRAIN_SECS, ServerConfig, TritonServer, build_command, free_ports
from serving.parent_death import stop_with_parent
from serving.server_log import FOREIGN_PYTHON_HINT, diagnose
from serving.triton_install import (PROJECT_ROOT, ServerStartError, TritonInstall, check_project_importable,
                                    find_tritonserver, server_env)
from tests.triton_helpers import SHELLS, other_python, shell_env

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

# Like the project's models: numpy and the project come from the launcher's environment, which the stub embeds.
MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        {init}

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", (2 * x).astype(np.float32))]))
        return out
"""


def write_model(repo: Path, name: str, init: str = "pass") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    (repo / name / "1" / "model.py").write_text(MODEL.format(init=init))


@pytest.fixture(scope="module")
def install():
    try:
        return find_tritonserver()
    except ServerStartError as e:
        pytest.skip(str(e))


@pytest.fixture
def good_repo(tmp_path: Path) -> Path:
    write_model(tmp_path / "repo", "double")
    return tmp_path / "repo"


def config_for(repo: Path, tmp_path: Path, **kw) -> ServerConfig:
    return ServerConfig(repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=5,
                        log_file=tmp_path / "tritonserver.log", **kw)


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_flag_exists_in_this_tritonserver(install, tmp_path):
    help_text = subprocess.run([str(install.binary), "--help"], env=server_env(install),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    cmd = build_command(ServerConfig(tmp_path), install, admin_key="k")
    flags = [arg.split("=")[0] for arg in cmd[1:]]
    assert len(flags) >= 15
    for flag in flags:
        assert f"  {flag} " in help_text or f"  {flag}\n" in help_text, flag


def test_backend_dir_is_prepared_idempotently(install, tmp_path):
    if install.lib_dir is None:
        pytest.skip("NGC install: no backend directory to prepare")
    first = find_tritonserver(tmp_path / "be")
    stub = first.backend_dir / "python" / "triton_python_backend_stub"
    assert stub.is_file() and os.access(stub, os.X_OK) and not stub.is_symlink()
    assert (first.backend_dir / "python" / "libtriton_python.so").is_file()
    before = {p.name: p.stat().st_ino for p in (first.backend_dir / "python").iterdir()}
    second = find_tritonserver(tmp_path / "be")
    assert second == first
    assert {p.name: p.stat().st_ino for p in (second.backend_dir / "python").iterdir()} == before


def test_exit_timeout_is_the_drain_budget_and_tritonserver_gets_a_short_one(tmp_path):
    install = TritonInstall(Path("/bin/tritonserver"), Path("/backends"))
    draining = build_command(ServerConfig(tmp_path, exit_timeout_secs=45), install, admin_key="k")
    assert f"--exit-timeout-secs={EXIT_TIMEOUT_AFTER_DRAIN_SECS}" in draining
    # Without the launcher's drain (tritonserver exec'd as PID 1 on GPU) its own timeout is the whole budget.
    direct = build_command(ServerConfig(tmp_path, exit_timeout_secs=45, drain=False), install, admin_key="k")
    assert "--exit-timeout-secs=45" in direct


def test_drain_gate_opens_only_after_its_grace(tmp_path):
    assert not DrainGate(None).closed_for(0)  # no launcher drain configured: always open
    gate = DrainGate(str(tmp_path / "draining"))
    assert not gate.closed_for(0)
    (tmp_path / "draining").touch()
    assert gate.closed_for(0) and not gate.closed_for(PREPROCESSING_GRACE_S)
    aged = time.time() - LLM_GRACE_S - 0.1
    os.utime(tmp_path / "draining", (aged, aged))
    assert gate.closed_for(PREPROCESSING_GRACE_S) and gate.closed_for(LLM_GRACE_S)


def test_ports_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("HTTP_PORT", "18000")
    monkeypatch.setenv("GRPC_PORT", "18001")
    monkeypatch.delenv("METRICS_PORT", raising=False)
    monkeypatch.setenv("OPENAI_PORT", "19000")
    cfg = ServerConfig.from_env("repo", grpc_port=19001)
    assert (cfg.http_port, cfg.grpc_port, cfg.metrics_port, cfg.openai_port) == (18000, 19001, 8002, 19000)
    monkeypatch.delenv("OPENAI_PORT")
    assert ServerConfig.from_env("repo").openai_port is None  # no front door unless asked (the CLI defaults to 9000)


def test_serves_a_python_model_and_stops_cleanly(install, good_repo, tmp_path):
    server = TritonServer(config_for(good_repo, tmp_path), install)
    with server:
        assert 0 not in (server.config.http_port, server.config.grpc_port, server.config.metrics_port)
        status, body = http("POST", f"{server.urls.http}/v2/models/double/infer",
                            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}]})
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["data"] == [2.0, 4.0, 6.0]
        status, metrics = http("GET", server.urls.metrics)
        assert status == 200 and b"nv_inference_request_success" in metrics
        # Model-repository API is restricted to holders of the admin key.
        assert http("POST", f"{server.urls.http}/v2/repository/index")[0] == 403
        assert http("POST", f"{server.urls.http}/v2/repository/index", headers={"admin-key": "wrong"})[0] == 403
        status, body = http("POST", f"{server.urls.http}/v2/repository/index",
                            headers={"admin-key": server.admin_key})
        assert status == 200 and b'"double"' in body
    assert server.returncode == 0  # SIGTERM: drained and exited cleanly
    assert "successfully unloaded 'double'" in server.log_text()
    assert server.admin_key not in server.log_text()


def test_broken_model_is_named_with_its_error(install, good_repo, tmp_path):
    write_model(good_repo, "broken", init='raise RuntimeError("weights file /nope/w.safetensors not found")')
    server = TritonServer(config_for(good_repo, tmp_path), install)
    with pytest.raises(ServerStartError) as err:
        with server:
            pass
    msg = str(err.value)
    assert "model 'broken'" in msg
    assert "RuntimeError: weights file /nope/w.safetensors not found" in msg
    assert "model.py" in msg  # where it was raised
    assert "double" not in msg  # the healthy model is not blamed
    assert server.returncode is not None  # nothing left running


def test_busy_port_is_reported_before_starting(install, good_repo, tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        http_port, metrics_port = free_ports(2)
        config = ServerConfig(good_repo, http_port=http_port, grpc_port=port, metrics_port=metrics_port)
        server = TritonServer(config, install)
        with pytest.raises(ServerStartError, match=rf"^port {port} \(GRPC_PORT\) is already in use$"):
            server.start()
        assert server.process is None


def test_port_taken_after_the_check_is_diagnosed_from_the_log():
    # The bind test can race with another process; then the server's own log names the port.
    log = ("E1202 12:49:38.605574 4364 main.cc:293] \"failed to start Metrics service: "
           "Unavailable - Socket '0.0.0.0:28132' already in use \"\n")
    text = diagnose(log, {28130: "HTTP_PORT", 28131: "GRPC_PORT", 28132: "METRICS_PORT"})
    assert "port 28132 (METRICS_PORT) is already in use" in text


def test_model_status_table_is_parsed():
    log = textwrap.dedent("""\
        I1202 12:50:15.614191 4542 server.cc:674]
        +-----------+---------+---------------------------------------+
        | Model     | Version | Status                                |
        +-----------+---------+---------------------------------------+
        | llm       | 1       | READY                                 |
        | noversion | -       | Not loaded: No model version was found |
        +-----------+---------+---------------------------------------+
        """)
    text = diagnose(log)
    assert "model 'noversion': Not loaded: No model version was found" in text
    assert "llm" not in text


def _cli(repo: Path, tmp_path: Path, ports: list[int], openai: bool = False) -> tuple[subprocess.Popen, Path]:
    """``python -m serving serve``; ``openai``: with the front door on ports[3] (it needs the stack's ensemble)."""
    out = tmp_path / "cli.out"
    env = dict(os.environ, HTTP_PORT=str(ports[0]), GRPC_PORT=str(ports[1]), METRICS_PORT=str(ports[2]),
               HEALTH_PORT=str(free_ports(1, taken=ports)[0]))
    env.pop("OPENAI_PORT", None)
    if openai:
        env["OPENAI_PORT"] = str(ports[3])
    proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--model-repository", str(repo),
                             "--exit-timeout-secs", "5", *([] if openai else ["--no-openai"])], cwd=PROJECT_ROOT,
                            env=env, stdout=out.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=stop_with_parent())
    return proc, out  # the launcher leads its own process group, as a shell's foreground job does


def _wait_for_line(proc: subprocess.Popen, out: Path, prefix: str, timeout: float = 180) -> list[str]:
    deadline = time.monotonic() + timeout
    while f"\n{prefix}" not in "\n" + out.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return [ln for ln in out.read_text().splitlines() if ln.startswith(prefix)]


def test_cli_serves_until_sigterm(install, good_repo, tmp_path):
    ports = free_ports(3)
    proc, out = _cli(good_repo, tmp_path, ports)
    try:
        ready = _wait_for_line(proc, out, "ready:", timeout=120)
        assert len(ready) == 1 and ready[0].startswith(
            f"ready: HTTP http://localhost:{ports[0]}, gRPC localhost:{ports[1]}, "
            f"metrics http://localhost:{ports[2]}/metrics, liveness http://localhost:"), out.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "successfully unloaded 'double'" in out.read_text()  # drained, not killed
    finally:
        if proc.poll() is None:
            proc.kill()


def test_busy_openai_port_is_named_before_starting(install, good_repo, tmp_path):
    ports = free_ports(3)
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc, out = _cli(good_repo, tmp_path, [*ports, port], openai=True)
        assert proc.wait(60) == 1
    assert f"port {port} (OPENAI_PORT) is already in use" in out.read_text()


def _front_door_pid(launcher: subprocess.Popen) -> int:
    import psutil

    return next(c.pid for c in psutil.Process(launcher.pid).children() if "openai" in c.cmdline())


def test_front_door_starts_after_triton_and_its_death_stops_everything(install, model_repository, tmp_path):
    """make serve's front door (issue 14): started once Triton is ready, ready itself (/health) before the launcher
    says "ready:"; killed on its own, it takes the whole server down with a one-line reason and a non-zero exit."""
    ports = free_ports(4)
    proc, out = _cli(model_repository, tmp_path, ports, openai=True)
    try:
        ready = _wait_for_line(proc, out, "ready:")
        assert len(ready) == 1 and ready[0].startswith(
            f"ready: HTTP http://localhost:{ports[0]}, gRPC localhost:{ports[1]}, metrics "
            f"http://localhost:{ports[2]}/metrics, OpenAI http://localhost:{ports[3]}/v1, liveness "), \
            out.read_text()[-3000:]
        text = out.read_text()
        assert text.index("successfully loaded 'ensemble'") < text.index("openai front door ready on")
        assert http("GET", f"http://localhost:{ports[3]}/health")[0] == 200
        os.kill(_front_door_pid(proc), signal.SIGKILL)
        assert proc.wait(60) != 0
        assert "serving: the OpenAI front door exited on its own with code -9; stopping tritonserver" in out.read_text()
        assert "drain finished" in out.read_text()  # Triton still drained: nothing in flight was cut
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_drains_an_open_stream(install, model_repository, tmp_path):
    """A terminal's Ctrl-C sends SIGINT to the whole foreground process group. Only the launcher may see it: had the
    front door got it too, the launcher's SIGTERM after it would be a second signal ("stop now"), cutting the open
    stream with tracebacks, and Triton would have started its shutdown before the front door finished."""
    from openai import OpenAI

    ports = free_ports(4)
    proc, out = _cli(model_repository, tmp_path, ports, openai=True)
    try:
        assert _wait_for_line(proc, out, "ready:"), out.read_text()[-3000:]
        client = OpenAI(base_url=f"http://localhost:{ports[3]}/v1", api_key="unused", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=200, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"min_tokens": 200})
        chunks = [next(stream)]
        os.killpg(proc.pid, signal.SIGINT)
        chunks += list(stream)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        assert chunks[-1].usage.completion_tokens == 200  # the whole answer, not a cut one
        assert proc.wait(60) == 0
        text = out.read_text()
        assert "Traceback" not in text and "drain finished" in text, text[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_killed_launcher_takes_its_children_with_it(install, model_repository, tmp_path):
    """A launcher killed outright (SIGKILL, the OOM killer) runs no stop code. Its tritonserver, the stubs and the front
    door must not live on holding the ports: the kernel sends each child SIGTERM when the launcher dies."""
    import psutil

    def running(p: psutil.Process) -> bool:
        try:
            return p.status() != psutil.STATUS_ZOMBIE  # an orphan's zombie waits for whoever adopted it
        except psutil.NoSuchProcess:
            return False

    ports = free_ports(4)
    proc, out = _cli(model_repository, tmp_path, ports, openai=True)
    started: list[psutil.Process] = []
    try:
        assert _wait_for_line(proc, out, "ready:"), out.read_text()[-3000:]
        started = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in started)
        assert "tritonserver" in names and "triton_python_backend_stub" in names and "openai" in names, names
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while any(map(running, started)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p.pid for p in started if running(p)], out.read_text()[-3000:]
        for port in ports:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no listener
                s.bind(("0.0.0.0", port))  # free again
    finally:
        for p in [proc, *filter(running, started)]:
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                p.kill()


def test_cli_explains_a_failed_start(install, good_repo, tmp_path):
    write_model(good_repo, "broken", init="import no_such_module_xyz")
    proc, out = _cli(good_repo, tmp_path, free_ports(3))
    assert proc.wait(120) != 0
    text = out.read_text()
    assert "serving: failed to start tritonserver" in text
    assert "model 'broken': Internal: ModuleNotFoundError: No module named 'no_such_module_xyz'" in text


# A stand-in tritonserver for the stop below: its "stub" holds 1 GiB it has written to (so unmapping it at exit takes
# a while), named and numbered as python_backend's stub_launcher names its stubs; on SIGTERM the server tells the
# stub to end, waits until the stub's command line reads empty (it is unmapping its memory, not yet a zombie), exits.
EXITING_SERVER = """\
import os, signal, subprocess, sys, time
code = "import os, sys; hold = b'1' * (1 << 30); print('up', flush=True); sys.stdin.read(); os._exit(0)"
stub = subprocess.Popen(["/opt/x/triton_python_backend_stub", "-c", code, "model", "region", str(os.getpid())],
                        executable=sys.executable, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
stub.stdout.readline()
def stop(*_):
    stub.stdin.close()
    while open(f"/proc/{stub.pid}/cmdline", "rb").read():
        time.sleep(0.001)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
print(stub.pid, flush=True)
signal.pause()
"""


def test_a_stub_still_tearing_down_when_tritonserver_exits_is_waited_for(tmp_path):
    """CI, 2026-12-04: the launcher looked for stubs by command line only after tritonserver's exit, saw none while a
    stub was still unmapping its memory, and returned with that stub running. It now notes them beforehand."""
    import psutil

    server = TritonServer(ServerConfig(tmp_path, drain=False))
    server.process = subprocess.Popen([sys.executable, "-c", EXITING_SERVER], stdout=subprocess.PIPE)
    stub = psutil.Process(int(server.process.stdout.readline()))
    assert server.stop(timeout=30) == 0
    try:
        assert stub.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass

# ---- the stub embeds the launcher's interpreter, whatever shell it was started from (serving/stub_python.py)

STDLIB_C_MODULES = "import ssl, sqlite3, ctypes, hashlib, lzma, _ssl"


def test_stub_environment_names_this_interpreter_first(monkeypatch, tmp_path):
    env = stub_python.stub_environment({"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/x", "PYTHONHOME": "/usr",
                                        "PYTHONPATH": "/somewhere"})
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert os.path.samefile(Path(env["PATH"].split(os.pathsep)[0]) / "python3", sys.executable)
    lib = stub_python.shared_library()
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [str(lib.parent), "/x"]
    assert "PYTHONHOME" not in env and "PYTHONPATH" not in env
    want = json.loads(env[stub_python.EXPECTED_ENV])
    assert want["version"] == ".".join(map(str, sys.version_info[:3])) and want["prefix"] == os.path.realpath(sys.prefix)
    # The wheel's libraries come after libpython's folder, never before it.
    install = TritonInstall(Path("/bin/tritonserver"), Path("/be"), Path("/wheel/libs"))
    assert server_env(install, {"PATH": "/bin"})["LD_LIBRARY_PATH"].split(os.pathsep)[:2] == [str(lib.parent),
                                                                                             "/wheel/libs"]


def test_a_python_without_shared_library_is_refused_with_advice(monkeypatch):
    real = stub_python.sysconfig.get_config_var
    monkeypatch.setattr(stub_python.sysconfig, "get_config_var",
                        lambda name: "/nonexistent" if name == "LIBDIR" else real(name))
    with pytest.raises(stub_python.StubPythonError, match=r"has no shared library libpython3\.\d+\.so.*"
                       r"--enable-shared"):
        stub_python.stub_environment(dict(os.environ))
    with pytest.raises(ServerStartError, match="--enable-shared"):
        server_env(TritonInstall(Path("/bin/tritonserver"), Path("/be")))


def test_project_must_be_importable_from_the_environment(tmp_path):
    check_project_importable(server_env(TritonInstall(Path("/bin/tritonserver"), Path("/be"))))
    env = server_env(TritonInstall(Path("/bin/tritonserver"), Path("/be")))
    # Another Python, which has no editable install of this checkout: refused with the fix.
    other = other_python()
    if other is None:
        pytest.skip("no second Python on this machine")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("serving.triton_install.sys.executable", other)
        with pytest.raises(ServerStartError, match=r"cannot import it: install this checkout there \(make venv"):
            check_project_importable(env)


@pytest.mark.parametrize("shell", SHELLS)
def test_stub_runs_the_launchers_python_in_any_shell(install, tmp_path, monkeypatch, shell):
    """The model imports the C modules whose ABI moved between 3.11 patch releases (B6: `import ssl` died
    with an activated venv) and reports the interpreter it runs, which must be the launcher's."""
    for key, value in shell_env(shell, tmp_path).items():
        monkeypatch.setenv(key, value)
    if shell == "other-python-first":
        monkeypatch.setenv("PYTHONHOME", "/usr")  # ignored by the isolated stub: must not matter either
    repo = tmp_path / "repo"
    write_model(repo, "stdlib", init=f"{STDLIB_C_MODULES}; from serving.stub_python import check_stub; "
                                     "print(check_stub('stdlib'), flush=True)")
    server = TritonServer(config_for(repo, tmp_path), install)
    with server:
        status, body = http("POST", f"{server.urls.http}/v2/models/stdlib/infer",
                            {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1]}]})
        assert status == 200, body
    log = server.log_text()
    version = ".".join(map(str, sys.version_info[:3]))
    assert f"model 'stdlib' runs Python {version} (prefix {os.path.realpath(sys.prefix)}, " \
           f"{os.path.realpath(stub_python.shared_library())}), the launcher's interpreter" in log


def test_a_stub_on_another_python_refuses_to_load(install, tmp_path, monkeypatch):
    """If the stub ever embeds another interpreter than the launcher's, the model refuses with one line."""
    import serving.launcher as launcher

    def foreign(*args, **kwargs):
        env = server_env(*args, **kwargs)
        env[stub_python.EXPECTED_ENV] = json.dumps({"version": "3.11.0", "prefix": "/opt/elsewhere",
                                                    "libpython": "/opt/elsewhere/lib/libpython3.11.so.1.0"})
        return env

    monkeypatch.setattr(launcher, "server_env", foreign)
    repo = tmp_path / "repo"
    write_model(repo, "checked", init="from serving.stub_python import check_stub; check_stub('checked')")
    with pytest.raises(ServerStartError) as err:
        with TritonServer(config_for(repo, tmp_path), install):
            pass
    msg = str(err.value)
    assert "model 'checked': " in msg and "but the server was started from Python 3.11.0 (prefix /opt/elsewhere" in msg
    assert "start it with `make serve` or `python -m serving serve`" in msg


def test_foreign_python_symptoms_get_the_hint():
    log = ("E1203 05:10:58.193326 2625 model_lifecycle.cc:642] \"failed to load 'preprocessing' version 1: Internal: "
           "ImportError: /x/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so: undefined symbol: _PyModule_Add\"\n")
    text = diagnose(log)
    assert "model 'preprocessing': Internal: ImportError" in text and FOREIGN_PYTHON_HINT in text
    assert FOREIGN_PYTHON_HINT not in diagnose(log.replace("undefined symbol: _PyModule_Add", "bad weights"))
