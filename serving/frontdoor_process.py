"""The OpenAI front door (``python -m serving openai``) as a child of the launcher.

The launcher starts it once Triton is ready and stops it *before* Triton drains: on SIGTERM the front door refuses
new requests with 503 and finishes its open streams, which needs a Triton that still serves them; only then may
Triton refuse work. If the front door dies on its own the launcher stops everything (serving half a server —
Triton's ports without the OpenAI API a user was told about — would hide the failure).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from serving.parent_death import launcher_child
from serving.triton_install import PROJECT_ROOT, ServerStartError

#: Extra seconds after the front door's own drain timeout before it is killed.
STOP_MARGIN_SECS = 10


class FrontDoor:
    """One ``python -m serving openai`` process in front of the Triton at ``triton`` (gRPC ``host:port``)."""

    def __init__(self, triton: str, port: int, drain_timeout: int = 30, say: Callable[[str], None] = print,
                 host: str = "0.0.0.0") -> None:
        self.triton, self.port, self.host, self.drain_timeout = triton, port, host, drain_timeout
        self.say = say  # the launcher's printer: one lock for Triton's log, the front door's and ours
        self.process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._stopping = False
        self._echo: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}"

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def command(self) -> list[str]:
        return [sys.executable, "-m", "serving", "openai", "--triton", self.triton, "--host", self.host,
                "--port", str(self.port), "--drain-timeout", str(self.drain_timeout)]

    def start(self) -> bool:
        """Start the process; False (and nothing started) when stop() came first."""
        with self._lock:  # a SIGTERM racing the start either sees the process or prevents it
            if self._stopping:
                return False
            try:
                self.process = subprocess.Popen(self.command(), cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **launcher_child())
            except OSError as e:
                raise ServerStartError(f"cannot run the OpenAI front door: {e}") from e
        self._echo = threading.Thread(target=self._pump, name="frontdoor-log", daemon=True)
        self._echo.start()
        return True

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            try:
                self.say(raw.decode("utf-8", "replace").rstrip("\n"))
            except (OSError, ValueError):
                pass  # our stdout is gone; keep reading or the front door blocks on a full pipe

    def is_ready(self) -> bool:
        """``/health`` answers 200: Triton's ensemble is ready and the front door serves (not draining)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float, triton_alive: Callable[[], bool]) -> None:
        """Block until ``/health`` is 200. Raise ServerStartError when the front door or Triton exits first, or
        after ``timeout``; return quietly when stop() was called meanwhile."""
        assert self.process is not None, "start() first"
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if self._stopping:
                return
            if self.process.poll() is not None:
                raise ServerStartError(f"the OpenAI front door exited with code {self.process.returncode} before "
                                       "it was ready (its output is above)")
            if not triton_alive():
                raise ServerStartError("tritonserver exited while the OpenAI front door was starting")
            if time.monotonic() > deadline:
                raise ServerStartError(f"the OpenAI front door was not ready on {self.url}/health after "
                                       f"{timeout:.0f} s")
            time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM, then wait while it finishes its open streams (its --drain-timeout, plus a margin), then SIGKILL.
        Safe to call twice and before start(); returns the exit code (None when it never started)."""
        with self._lock:
            self._stopping = True
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(self.drain_timeout + STOP_MARGIN_SECS)
        except subprocess.TimeoutExpired:
            self.say(f"serving: the OpenAI front door did not exit {self.drain_timeout + STOP_MARGIN_SECS} s after "
                     "SIGTERM; killing it")
            self.process.kill()
            self.process.wait()
        if self._echo is not None:
            self._echo.join(timeout=5)
        return self.process.returncode

    def kill(self) -> None:
        with self._lock:
            self._stopping = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
