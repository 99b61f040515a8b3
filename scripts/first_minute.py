"""A newcomer's first minute, as a check: ``make serve``, the first request right after readiness, a clean stop.

The first request after start — one chat question — is sent streamed, then non-streamed, over gRPC and over HTTP:
every streamed answer must concatenate to its non-streamed twin byte for byte. Then the same question through the
OpenAI front door with the official ``openai`` SDK (issue 14's "done when"): the model id from ``/v1/models``, one
``chat.completions.create`` and one with ``stream=True``, whose chunks must concatenate to the non-streamed
content. Then the newcomer's own command, ``python -m client chat "What is the capital of France?"``. Both answers
must name Paris (``--expect``; the default model's greedy answer). Then SIGTERM (what Kubernetes and docker send)
must stop the front door, drain and stop the server with exit code 0. Exit code 0 when all of that holds.

    source .venv/bin/activate && python scripts/first_minute.py     # what .ci/run does after `make test`
    .venv/bin/python scripts/first_minute.py MODEL_DIR=... ENGINE_DIR=... PROFILE=... REPOSITORY=...

Arguments are passed to ``make serve`` (variable overrides); the shell's environment is used as it is (an
activated venv, another Python first on PATH...), except for free ports.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent

QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]
MAX_TOKENS = 32


@dataclass
class Outcome:
    ready_s: float
    pairs: dict[str, tuple[bytes, bytes]]  # transport -> (streamed, non-streamed)
    cli_answer: str  # stdout of `python -m client chat QUESTION`
    exit_code: int | None
    openai_model: str = ""  # the id /v1/models served

    @property
    def openai_answer(self) -> str:
        return self.pairs.get("openai", (b"", b""))[1].decode("utf-8", "replace")

    def ok(self, expect: str = "") -> bool:
        answers = [self.cli_answer, self.openai_answer]
        return (self.exit_code == 0 and all(s == w and w for s, w in self.pairs.values())
                and all(a.strip() and expect.lower() in a.lower() for a in answers))


def _ready(url: str) -> bool:
    """Triton's /v2/health/ready, or the front door's /health."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _http_pair(http: str) -> tuple[bytes, bytes]:
    body = {"messages": json.dumps(MESSAGES), "max_tokens": MAX_TOKENS}
    streamed = b""
    req = urllib.request.Request(f"{http}/v2/models/ensemble/generate_stream", method="POST",
                                 data=json.dumps({**body, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data:"):
                streamed += json.loads(line[5:])["text_output"].encode("utf-8")
    req = urllib.request.Request(f"{http}/v2/models/ensemble/generate", method="POST", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        whole = json.loads(r.read())["text_output"].encode("utf-8")
    return streamed, whole


def _grpc_pair(grpc: str) -> tuple[bytes, bytes]:
    from client.core import SamplingParams
    from client.sync import LLMClient

    params = SamplingParams(max_tokens=MAX_TOKENS)
    with LLMClient(grpc, timeout=120) as client:
        streamed = "".join(client.stream_chat(MESSAGES, params)).encode("utf-8")  # the very first request
        whole = client.chat(MESSAGES, params).text.encode("utf-8")
    return streamed, whole


def _openai_pair(base_url: str) -> tuple[str, tuple[bytes, bytes]]:
    """The official SDK, as the README shows it: the served id, then the question non-streamed and streamed."""
    from openai import OpenAI

    with OpenAI(base_url=base_url, api_key="x", timeout=120, max_retries=0) as client:
        model = client.models.list().data[0].id
        whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS)
        chunks = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return model, (streamed.encode("utf-8"), (whole.choices[0].message.content or "").encode("utf-8"))


def _cli_chat(grpc: str, env: dict[str, str]) -> str:
    command = [sys.executable, "-m", "client", "chat", QUESTION, "--url", grpc, "--max-tokens", str(MAX_TOKENS)]
    done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"python -m client chat exited with {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def _launcher(make: subprocess.Popen, timeout: float = 10):
    """The launcher is the process make's recipe exec'd (make stays its parent)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(make.pid).children():
            if "serving" in child.cmdline():
                return child
        time.sleep(0.05)
    raise RuntimeError("make serve started no launcher")


def run(make_args: list[str], log: Path, env: dict[str, str] | None = None, ready_timeout: float = 1200) -> Outcome:
    env = dict(os.environ if env is None else env)
    from serving.launcher import PORT_ENV, free_ports

    ports = dict(zip(PORT_ENV.values(), map(str, free_ports(len(PORT_ENV)))))  # distinct free ports, one per port the launcher opens
    env.update(ports)
    http, grpc = f"http://localhost:{ports['HTTP_PORT']}", f"localhost:{ports['GRPC_PORT']}"
    openai = f"http://localhost:{ports['OPENAI_PORT']}"
    started = time.monotonic()
    with log.open("wb") as out:
        make = subprocess.Popen(["make", "--no-print-directory", "serve", *make_args], cwd=PROJECT_ROOT, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    pairs: dict[str, tuple[bytes, bytes]] = {}
    try:
        def wait_for(url: str) -> None:
            while not _ready(url):
                if make.poll() is not None or time.monotonic() - started > ready_timeout:
                    raise RuntimeError(f"make serve did not become ready (exit code {make.poll()}):\n"
                                       + log.read_text("utf-8", "replace")[-4000:])
                time.sleep(0.02)  # the first request follows readiness as closely as a script can

        wait_for(f"{http}/v2/health/ready")
        ready_s = time.monotonic() - started
        pairs["grpc"] = _grpc_pair(grpc)
        pairs["http"] = _http_pair(http)
        wait_for(f"{openai}/health")  # the launcher starts the front door once Triton is ready
        openai_model, pairs["openai"] = _openai_pair(f"{openai}/v1")
        cli_answer = _cli_chat(grpc, env)
        _launcher(make).send_signal(signal.SIGTERM)
        exit_code = make.wait(120)
    finally:
        if make.poll() is None:  # a check failed: stop the server too (killing make alone would orphan it)
            try:
                launcher = _launcher(make, timeout=1)
                for process in [launcher, *launcher.children(recursive=True)]:  # tritonserver, stubs, front door
                    process.kill()
            except Exception:  # noqa: BLE001 - best effort; the original error is what matters
                pass
            make.kill()
            make.wait()
    return Outcome(ready_s, pairs, cli_answer, exit_code, openai_model)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("make_args", nargs="*", help="variable overrides for make serve (NAME=VALUE)")
    parser.add_argument("--log", type=Path, default=PROJECT_ROOT / "build" / "first_minute.log")
    parser.add_argument("--expect", default="Paris",
                        help="text the chat answers (OpenAI SDK, CLI) must contain ('' for any)")
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    shell = f"venv {os.environ['VIRTUAL_ENV']} activated" if os.environ.get("VIRTUAL_ENV") else "no venv activated"
    print(f"first minute: make serve ({shell}; log {args.log})", flush=True)
    outcome = run(args.make_args, args.log)
    print(f"  ready after {outcome.ready_s:.1f} s")
    for transport, (streamed, whole) in outcome.pairs.items():
        verdict = "equal" if streamed == whole and whole else "DIFFERENT"
        what = "OpenAI SDK" if transport == "openai" else f"first request over {transport}"
        print(f"  {what}: streamed {verdict} to non-streamed ({len(whole)} bytes)")
        if verdict != "equal":
            print(f"    streamed:     {streamed!r}\n    non-streamed: {whole!r}")
    for what, answer in ((f"openai SDK, model {outcome.openai_model!r}", outcome.openai_answer),
                         (f"python -m client chat {QUESTION!r}", outcome.cli_answer)):
        print(f"  {what}: {answer.strip()!r}"
              + ("" if args.expect.lower() in answer.lower() else f" — does NOT contain {args.expect!r}"))
    print(f"  SIGTERM: make serve exited with {outcome.exit_code}")
    ok = outcome.ok(args.expect)
    print("first minute: OK" if ok else "first minute: FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
