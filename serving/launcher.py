"""Start, watch and stop a real ``tritonserver`` (used by ``python -m serving serve`` and by test fixtures).

The launcher stays the server's parent: when start-up fails it reads the server's log and says *why*
(serving/server_log.py), and on SIGTERM it drains before it stops the server (serving/drain.py). Finding the
server and preparing its environment is serving/triton_install.py. ``serve`` also runs the OpenAI front door in
front of it (serving/frontdoor_process.py): started after Triton is ready, stopped before Triton drains.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from serving.drain import DRAIN_FILE_ENV, drain
from serving.frontdoor_process import FrontDoor
from serving.health import DEFAULT_DEADLINE_S, HEALTH_PATH, HealthServer
from serving.parent_death import launcher_child
from serving.queue_full import QUEUE_FULL_FILE_ENV, create_queue_full_file
from serving.server_log import diagnose
from serving.triton_install import (PROJECT_ROOT, ServerStartError, TritonInstall, check_project_importable,
                                    find_tritonserver, server_env)

PORT_ENV = {"http_port": "HTTP_PORT", "grpc_port": "GRPC_PORT", "metrics_port": "METRICS_PORT",
            "openai_port": "OPENAI_PORT", "health_port": "HEALTH_PORT"}
DEFAULT_OPENAI_PORT = 9000
DEFAULT_HEALTH_PORT = 8003
ADMIN_KEY_ENV = "TRITON_ADMIN_KEY"
# APIs that can change what is served or map client memory: usable only with the admin-key header.
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"
# After a drain nothing is in flight; what tritonserver still waits for then is a client's idle HTTP
# keep-alive connection or a model a gRPC call left referenced (docs/reliability.md, causes D and E).
EXIT_TIMEOUT_AFTER_DRAIN_SECS = 10
# How long a Python-backend stub may outlive tritonserver before the launcher kills it (stubs_of).
STUB_EXIT_GRACE_SECS = 10


# ---------------------------------------------------------------------------------------------- config


@dataclass
class ServerConfig:
    model_repository: Path
    http_port: int = 8000  # 0 = pick a free port at start
    grpc_port: int = 8001
    metrics_port: int = 8002
    openai_port: int | None = None  # the OpenAI front door's port (None: no front door; the launcher's CLI sets it)
    health_port: int | None = None  # the generating liveness check's port (serving/health.py; None: none)
    health_deadline_s: float = DEFAULT_DEADLINE_S
    exit_timeout_secs: int = 30  # how long accepted requests may run once a stop is asked for
    drain: bool = True  # the launcher drains before SIGTERM (False: tritonserver gets SIGTERM itself, e.g. as PID 1)
    log_verbose: int = 0
    extra_args: list[str] = field(default_factory=list)
    log_file: Path | None = None  # None: server output is echoed to our stdout

    @classmethod
    def from_env(cls, model_repository: Path | str, **overrides) -> ServerConfig:
        """Ports from HTTP_PORT / GRPC_PORT / METRICS_PORT / OPENAI_PORT when set; explicit overrides win."""
        ports = {k: int(os.environ[v]) for k, v in PORT_ENV.items() if os.environ.get(v)}
        ports.update({k: v for k, v in overrides.items() if v is not None})
        return cls(model_repository=Path(model_repository), **ports)


class ServerUrls(NamedTuple):
    http: str
    grpc: str
    metrics: str


def stop_process(proc: subprocess.Popen, timeout: float) -> int:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; the exit code (a child that already exited: its own)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, taken: Collection[int] = ()) -> list[int]:
    """``n`` distinct free ports, none in ``taken``: the sockets stay bound until all are chosen, so the kernel
    cannot hand out the same port twice (it may, to sockets bound and closed one after another)."""
    sockets: list[socket.socket] = []
    try:
        while len(sockets) < n:
            s = socket.socket()
            s.bind(("", 0))
            if s.getsockname()[1] in taken:
                s.close()
                continue
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_ports(config: ServerConfig) -> None:
    seen: dict[int, str] = {}
    for name, env in PORT_ENV.items():
        port = getattr(config, name)
        if port is None:  # no front door, no health endpoint
            continue
        if port in seen:
            raise ServerStartError(f"port {port} is used for both {seen[port]} and {env}")
        seen[port] = env
        with socket.socket() as s:
            # SO_REUSEADDR like the server: a port in TIME_WAIT is usable, one with a listener is not.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                raise ServerStartError(f"port {port} ({env}) is already in use") from None


def build_command(config: ServerConfig, install: TritonInstall, admin_key: str) -> list[str]:
    restricted = f"{RESTRICTED_APIS}:admin-key={admin_key}"
    # With a drain, the exit timeout was spent waiting for requests before SIGTERM; tritonserver's own is short.
    exit_timeout = min(config.exit_timeout_secs, EXIT_TIMEOUT_AFTER_DRAIN_SECS) if config.drain \
        else config.exit_timeout_secs
    return [
        str(install.binary),
        f"--model-repository={Path(config.model_repository).resolve()}",
        f"--backend-directory={install.backend_dir}",
        f"--http-port={config.http_port}",
        f"--grpc-port={config.grpc_port}",
        f"--metrics-port={config.metrics_port}",
        "--allow-metrics=true",
        "--allow-cpu-metrics=true",
        f"--exit-timeout-secs={exit_timeout}",
        "--model-control-mode=none",  # load everything at start, never change at run time
        "--strict-readiness=true",  # ready only when every model is
        "--disable-auto-complete-config",  # we ship full configs (2.51: --strict-model-config is deprecated)
        "--log-info=true",
        f"--log-verbose={config.log_verbose}",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
        *config.extra_args,
    ]


# ---------------------------------------------------------------------------------------------- server


def stubs_of(server_pid: int) -> dict[int, int]:
    """The Python-backend stubs that tritonserver ``server_pid`` started and that run now: pid -> start time.

    Triton starts each stub with its own pid as the 5th argument (python_backend's stub_launcher). A stub
    normally ends with its server, but the GPU layout's wrapper can hang at exit after a stream that ended in
    an error (docs/gpu.md, "Open"); in the container tini ends it, here the launcher must. Read them while the
    server runs: a stub that tears down its memory reads an empty cmdline before it is a zombie.
    """
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if len(argv) > 5 and argv[0].endswith(b"/triton_python_backend_stub") and argv[5] == str(server_pid).encode():
            if (stat := _stat(int(entry.name))) is not None:
                found[int(entry.name)] = stat[1]
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """The process's state letter and start time (clock ticks after boot), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # from the state field on, after the parenthesised name
    return fields[0], int(fields[19])


def _running(pid: int, started: int) -> bool:
    """Still running: not gone, not a zombie, and not another process that was given the same pid since."""
    stat = _stat(pid)
    return stat is not None and stat[1] == started and stat[0] not in "ZX"


class TritonServer:
    """One tritonserver process. ``with TritonServer(cfg) as s:`` starts it and waits until it is ready.

    Start it from a thread that outlives it: it gets SIGTERM when that thread ends (serving/parent_death.py)."""

    def __init__(self, config: ServerConfig, install: TritonInstall | None = None,
                 ready_timeout: float = 300.0) -> None:
        self.config = config
        self.install = install
        self.ready_timeout = ready_timeout
        self.admin_key = os.environ.get(ADMIN_KEY_ENV) or ""
        self.process: subprocess.Popen[bytes] | None = None
        self.stop_requested = False
        self.last_probe = "none yet"  # what the last readiness probe saw (is_ready)
        self.state_dir: Path | None = None
        self.drain_file: Path | None = None
        self._drain_lock = threading.Lock()
        self._drained = False
        self._tail: collections.deque[str] = collections.deque(maxlen=5000)
        self._echo: threading.Thread | None = None
        self._echo_lock = threading.Lock()
        self._stubs: dict[int, int] = {}  # stubs_of() the server, read at readiness and before its SIGTERM

    @property
    def urls(self) -> ServerUrls:
        c = self.config
        return ServerUrls(f"http://localhost:{c.http_port}", f"localhost:{c.grpc_port}",
                          f"http://localhost:{c.metrics_port}/metrics")

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def start(self) -> None:
        if self.process is not None:
            raise RuntimeError("server already started")
        # Port 0 = any free port (tests); resolved here so .urls and the command agree.
        chosen = {getattr(self.config, k) for k in PORT_ENV} - {None}
        unset = [name for name in PORT_ENV if getattr(self.config, name) == 0]
        self.config = dataclasses.replace(self.config, **dict(zip(unset, free_ports(len(unset), taken=chosen))))
        repo = Path(self.config.model_repository)
        if not repo.is_dir():
            raise ServerStartError(f"model repository {repo} does not exist (build it first)")
        check_ports(self.config)
        cmd, env = self.prepare()
        # One folder per server for what its models' stubs share: the queue-full bytes (serving/queue_full.py) and
        # the drain file, which they stat() before taking a request.
        self.state_dir = Path(tempfile.mkdtemp(prefix="triton-llm-"))
        create_queue_full_file(self.state_dir / "queue-full")
        env[QUEUE_FULL_FILE_ENV] = str(self.state_dir / "queue-full")
        if self.config.drain:
            self.drain_file = self.state_dir / "draining"
            env[DRAIN_FILE_ENV] = str(self.drain_file)
        log_file = Path(self.config.log_file) if self.config.log_file is not None else None
        if log_file is not None:
            log_file.parent.mkdir(parents=True, exist_ok=True)
        # stderr too: gRPC bind errors and the final "error: creating server" line are printed there.
        with open(log_file, "wb") if log_file else contextlib.nullcontext(subprocess.PIPE) as out:
            try:
                self.process = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, **launcher_child())
            except OSError as e:
                raise ServerStartError(f"cannot run {cmd[0]}: {e}") from e
        if log_file is None:
            # Echo the log to our stdout and keep a tail of it for diagnosis.
            self._echo = threading.Thread(target=self._pump, name="tritonserver-log", daemon=True)
            self._echo.start()

    def prepare(self) -> tuple[list[str], dict[str, str]]:
        """The command and environment of the process to run (the GPU entry point runs its own, mpirun included)."""
        self.install = self.install or find_tritonserver()
        self.admin_key = self.admin_key or secrets.token_urlsafe(24)  # never printed
        env = server_env(self.install)
        check_project_importable(env)
        return build_command(self.config, self.install, self.admin_key), env

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace")
            self._tail.append(line.rstrip("\n"))
            with self._echo_lock:
                try:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                except (OSError, ValueError):
                    pass  # our stdout is gone; keep draining or the server blocks on a full pipe

    def say(self, text: str) -> None:
        """Print a line to stdout without splitting a server log line in two."""
        with self._echo_lock:
            print(text, flush=True)

    def port_names(self) -> dict[int, str]:
        return {getattr(self.config, name): env for name, env in PORT_ENV.items()
                if getattr(self.config, name) is not None}

    def log_text(self) -> str:
        if self.config.log_file is not None and Path(self.config.log_file).exists():
            return Path(self.config.log_file).read_text("utf-8", "replace")
        return "\n".join(self._tail)

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.urls.http}/v2/health/ready", timeout=2) as r:
                self.last_probe = f"HTTP {r.status}"
                return r.status == 200
        except (urllib.error.URLError, OSError) as exc:
            self.last_probe = repr(exc)  # said when it never gets ready: refused, 400 while models load, a timeout
            return False

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until /v2/health/ready answers 200. On failure, stop the server and raise ServerStartError."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while True:
            if self.process.poll() is not None:
                problem = f"tritonserver exited with code {self.process.returncode} before it was ready"
                break
            if self.is_ready():
                self._stubs.update(stubs_of(self.process.pid))
                return
            if self.stop_requested:
                problem = "stopped before it was ready"
                break
            if time.monotonic() > deadline:
                problem = (f"tritonserver was not ready after {timeout or self.ready_timeout:.0f} s (last probe of "
                           f"{self.urls.http}/v2/health/ready: {self.last_probe})")
                break
            time.sleep(0.25)
        self.stop()
        log = self.log_text()
        where = f" (log: {self.config.log_file})" if self.config.log_file else ""
        raise ServerStartError(f"{problem}{where}:\n{diagnose(log, self.port_names())}")

    def drain(self) -> bool:
        """Refuse new requests (UNAVAILABLE) and wait, up to exit_timeout_secs, until the accepted ones have
        finished. True when the server went idle. Runs once; a second caller waits for the first."""
        with self._drain_lock:
            if self._drained or self.drain_file is None or self.returncode is not None:
                return self._drained
            started = time.monotonic()
            self.say(f"draining: new requests are refused; waiting up to {self.config.exit_timeout_secs} s "
                     "for the accepted ones")
            self._drained = drain(self.drain_file, self.urls.metrics, self.config.exit_timeout_secs)
            self.say(f"drain {'finished' if self._drained else 'timed out'} after "
                     f"{time.monotonic() - started:.1f} s; stopping tritonserver")
            return self._drained

    def _sigterm(self) -> None:
        self.drain()
        if self.process is not None and self.process.poll() is None:
            self._stubs.update(stubs_of(self.process.pid))
            self.process.send_signal(signal.SIGTERM)

    def terminate(self) -> None:
        """Drain, then SIGTERM, in the background; returns at once. Marks the stop as requested, so
        wait_ready() does not report it as a failure."""
        self.stop_requested = True
        if self.process is not None and self.process.poll() is None:
            threading.Thread(target=self._sigterm, name="tritonserver-drain", daemon=True).start()

    def stop(self, timeout: float | None = None) -> int | None:
        """Drain, SIGTERM, wait (default: exit_timeout_secs + 15 s for model unloading), then SIGKILL."""
        if self.process is None:
            return None
        self._sigterm()
        try:
            self.process.wait(self.config.exit_timeout_secs + 15 if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return self.wait_exit()

    def wait_exit(self) -> int | None:
        """Wait for tritonserver to exit, then clean up after it: the log pump, the drain file, stray stubs."""
        assert self.process is not None
        self.process.wait()
        if self._echo is not None:
            self._echo.join(timeout=5)
        if self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        # Stubs finish tearing down their interpreter a moment after tritonserver exits: wait for that first.
        stubs = {**self._stubs, **stubs_of(self.process.pid)}
        deadline = time.monotonic() + STUB_EXIT_GRACE_SECS
        while (stray := [pid for pid, started in stubs.items() if _running(pid, started)]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in stray:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # SIGKILL lands asynchronously: "stopped" is said once the stubs are gone (or zombies awaiting init).
        deadline = time.monotonic() + STUB_EXIT_GRACE_SECS
        while any(_running(pid, stubs[pid]) for pid in stray) and time.monotonic() < deadline:
            time.sleep(0.05)
        if stray:
            self.say(f"stopped: killed {len(stray)} Python-backend stub(s) tritonserver left running "
                     f"(pids {', '.join(map(str, stray))})")
        return self.process.returncode

    def __enter__(self) -> TritonServer:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------- CLI


#: The GPU layout's llm runs TensorRT-LLM's executor from these bindings (builders/trtllm/layout.py TRTLLM_BINDINGS).
TRTLLM_BINDINGS = "tensorrt_llm.bindings.executor"


def tensorrt_llm_models(model_repository: Path) -> list[str]:
    """Models of the repository that run TensorRT-LLM engines (a cheap look at the configs; the CPU stand-in's
    bindings are others)."""
    return sorted(cfg.parent.name for cfg in Path(model_repository).glob("*/config.pbtxt")
                  if f'"{TRTLLM_BINDINGS}"' in cfg.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # passed verbatim to tritonserver
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m serving", description="Run NVIDIA Triton for this project.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run tritonserver in the foreground until SIGTERM/SIGINT",
                           epilog="Arguments after '--' are passed to tritonserver unchanged.")
    serve.add_argument("--model-repository", type=Path, default=PROJECT_ROOT / "build" / "model_repository")
    for name, env in PORT_ENV.items():
        default = {"openai_port": DEFAULT_OPENAI_PORT, "health_port": DEFAULT_HEALTH_PORT}.get(
            name, "the Triton default")
        serve.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"default: ${env} or {default}")
    serve.add_argument("--health-deadline", type=float, default=DEFAULT_DEADLINE_S,
                       help=f"seconds the liveness check (GET {HEALTH_PATH} on the health port) waits for its token")
    serve.add_argument("--exit-timeout-secs", type=int, default=30)
    serve.add_argument("--log-verbose", type=int, default=0)
    serve.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for readiness")
    serve.add_argument("--no-openai", action="store_true",
                       help="run tritonserver alone, without the OpenAI front door (Kubernetes runs the front door "
                            "in a container of its own)")
    args = parser.parse_args(argv)
    if engines := tensorrt_llm_models(args.model_repository):
        print(f"serving: {', '.join(engines)} runs TensorRT-LLM engines: serve GPU repositories with "
              f"`python -m builders.trtllm serve --model-repository {args.model_repository}`, which first checks "
              "each engine against this GPU and TensorRT-LLM version", file=sys.stderr, flush=True)
        return 1

    try:
        config = ServerConfig.from_env(args.model_repository, http_port=args.http_port, grpc_port=args.grpc_port,
                                       metrics_port=args.metrics_port, openai_port=args.openai_port,
                                       health_port=args.health_port)
    except ValueError as e:
        parser.error(f"bad port in environment: {e}")
    config.openai_port = None if args.no_openai else (
        DEFAULT_OPENAI_PORT if config.openai_port is None else config.openai_port)
    config.health_port = DEFAULT_HEALTH_PORT if config.health_port is None else config.health_port
    config.health_deadline_s = args.health_deadline
    config.exit_timeout_secs, config.log_verbose, config.extra_args = (
        args.exit_timeout_secs, args.log_verbose, extra)
    server = TritonServer(config, ready_timeout=args.ready_timeout)
    return serve_until_stopped(server, args.ready_timeout)


def serve_until_stopped(server: TritonServer, ready_timeout: float) -> int:
    """Start Triton, then the liveness endpoint and the front door (each if the config has its port); serve until
    SIGTERM/SIGINT or until either process dies. Stop order: the front door first (it finishes its open streams),
    then Triton's drain; the liveness endpoint answers until Triton has exited."""
    front: FrontDoor | None = None
    health: HealthServer | None = None
    stopping = threading.Event()

    def stop_all() -> None:
        if front is not None:
            front.stop()
        server.terminate()

    def forward(signum: int, _frame: object) -> None:
        if stopping.is_set():  # a second signal: the user wants out now
            if front is not None:
                front.kill()
            if server.process is not None:
                server.process.kill()
            return
        stopping.set()
        server.stop_requested = True  # wait_ready() reports a stop during start-up as a stop, not a failure
        threading.Thread(target=stop_all, name="stop", daemon=True).start()

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        server.start()
        server.wait_ready()
    except ServerStartError as e:
        if server.stop_requested:  # stopped by the user during start-up: not a failure to diagnose
            return _wait_exit(server)
        print(f"serving: failed to start tritonserver: {e}", file=sys.stderr, flush=True)
        return 1
    u = server.urls
    if server.config.health_port is not None:
        health = HealthServer(u.grpc, server.config.health_port, server.config.health_deadline_s).start()
    if server.config.openai_port is not None:
        front = FrontDoor(u.grpc, server.config.openai_port, server.config.exit_timeout_secs, say=server.say)
        try:
            if front.start():
                front.wait_ready(ready_timeout, triton_alive=lambda: server.returncode is None)
        except ServerStartError as e:
            server.say(f"serving: failed to start the OpenAI front door: {e}; stopping tritonserver")
            front.kill()
            server.stop()
            return 1
    if not stopping.is_set():
        openai = f", OpenAI {front.url}/v1" if front is not None else ""
        live = f", liveness http://localhost:{health.port}{HEALTH_PATH}" if health is not None else ""
        server.say(f"ready: HTTP {u.http}, gRPC {u.grpc}, metrics {u.metrics}{openai}{live}")
    assert server.process is not None
    failed = False
    while server.process.poll() is None:  # a child that dies on its own stops the whole server, loudly
        if front is not None and front.returncode is not None and not front.stopping:
            server.say(f"serving: the OpenAI front door exited on its own with code {front.returncode}; "
                       "stopping tritonserver")
            failed = True
            forward(signal.SIGTERM, None)
        time.sleep(0.2)
    if not stopping.is_set():  # nobody asked it to stop: say so, whatever else runs
        also = "; stopping the OpenAI front door" if front is not None and not front.stopping else ""
        server.say(f"serving: tritonserver exited on its own with code {server.returncode}{also}")
        failed = True
    if front is not None and not front.stopping:
        front.stop()
    rc = _wait_exit(server)
    if health is not None:
        health.stop()
    front_rc = front.stop() if front is not None else 0  # already stopped: returns its exit code
    return rc or (_exit_code(front_rc) if front_rc else 0) or (1 if failed else 0)


def _wait_exit(server: TritonServer) -> int:
    return 1 if server.process is None else _exit_code(server.wait_exit())


def _exit_code(rc: int | None) -> int:
    if rc is None:
        return 1
    return 128 - rc if rc < 0 else rc  # killed by signal N -> 128+N, like a shell


if __name__ == "__main__":
    sys.exit(main())
