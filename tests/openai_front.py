"""The OpenAI front door (serving/openai) as a subprocess of the tests: ``python -m serving openai`` on a free port."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from serving.launcher import free_port
from serving.parent_death import stop_with_parent


class FrontDoorProcess:
    def __init__(self, triton_grpc: str, *, api_keys: str = "", extra_args: tuple[str, ...] = (),
                 ready_timeout: float = 120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "LLM_API_KEY": api_keys}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "serving", "openai", "--triton", triton_grpc, "--host", "127.0.0.1",
             "--port", str(self.port), *extra_args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=stop_with_parent())  # a killed test run leaves no front door behind
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.ready_line = self._wait_ready(ready_timeout)

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            self.lines.put(line)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            if line.startswith("openai front door ready on "):
                return line.strip()
        self.stop()
        raise AssertionError("the front door did not announce readiness:\n" + "".join(self.output))

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60.0) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
