"""`make image-test`: the CPU image, run and tested the way a user and Kubernetes use it.

Against the running container (podman, or docker), with the project's own clients (client/ over gRPC, the OpenAI
SDK against serving/openai):

  serve      ready over HTTP; a chat question answered by the gRPC ensemble and by the OpenAI front door, streamed ==
             non-streamed; one bad input each gets its 400; every process runs as uid != 0; the root filesystem is
             read-only (--read-only, a tmpfs on /tmp) and the server does not need it writable
  drain      `stop -t 60` with 8 streams in flight (4 gRPC, 4 OpenAI): 8/8 complete, new requests refused, exit 0
  liveness   the liveness check that generates (GET /health/generate, the image's HEALTHCHECK): 200; the llm stub
             stopped (SIGSTOP) -> 503 within its deadline while Triton's /v2/health/live stays 200; SIGCONT -> 200
             again, or tritonserver aborted and the container exited non-zero (what a restart policy restarts)
  cold       container create -> ready over HTTP, N starts (default 3), with the parts from the logs
  cpu        the engine loaded in the image decodes with its compiled step on this machine's CPU, and, with torch's
             capability lowered to AVX2 (ATEN_CPU_CAPABILITY=avx2, standing in for an AVX2-only node), with the
             portable x86-64-v3 package, never the AVX-512 one (cpu_engine/cpu_target.py)
  helm       tests/test_helm_live.py with the chart's containers run from this image (TRITON_LLM_IMAGE)

    python scripts/image_test.py [--image triton-llm-stack:cpu] [--starts 3] [--only serve,drain,liveness,cold,cpu,helm]
                                 [--json build/image-test.json]

Prints a table per part and writes the measurements as JSON. Exit 0 when every check passes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving.launcher import free_ports  # noqa: E402 - after the project root is on sys.path

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STOP_TIMEOUT_S = 60


def engine() -> list[str]:
    """The container engine command: podman (Debian's, with runc and explicit ulimits) or docker."""
    found = os.environ.get("CONTAINER_ENGINE") or shutil.which("podman") or shutil.which("docker")
    if not found:
        raise SystemExit("image_test: neither podman nor docker is installed")
    if Path(found).name == "podman":
        return [found, "--runtime", os.environ.get("OCI_RUNTIME", "runc")]
    return [found]


def run_args() -> list[str]:
    """What every `run`/`create` of the image gets besides ports: ulimits (podman here refuses setrlimit
    without them), a read-only root with a tmpfs on /tmp, and /dev/shm for the Python backend."""
    args = ["--read-only", "--tmpfs", "/tmp:rw,size=256m,mode=1777", "--shm-size=256m"]
    if Path(engine()[0]).name == "podman":
        args += ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    return args


def sh(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([*engine(), *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def http_status(url: str, body: dict | None = None, timeout: float = 5) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


class Container:
    """One container of the image on free local ports."""

    def __init__(self, image: str, name: str, extra: list[str] | None = None):
        self.image, self.name = image, name
        self.ports = dict(zip(("http", "grpc", "metrics", "openai", "health"), free_ports(5)))
        self.extra = extra or []
        self.t_create = self.t_created = self.t_started = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def openai(self) -> str:
        return f"http://127.0.0.1:{self.ports['openai']}/v1"

    @property
    def health(self) -> str:
        return f"http://127.0.0.1:{self.ports['health']}/health/generate"

    def create_and_start(self) -> None:
        sh("rm", "-f", self.name, check=False)
        publish = [a for inner, p in zip((8000, 8001, 8002, 9000, 8003), self.ports.values())
                   for a in ("-p", f"127.0.0.1:{p}:{inner}")]
        self.t_create = time.time()
        sh("create", "--name", self.name, *run_args(), *publish, *self.extra, self.image)
        self.t_created = time.time()
        sh("start", self.name)
        self.t_started = time.time()

    def wait_ready(self, url: str, timeout: float = 180) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if http_status(url, timeout=2)[0] == 200:
                return time.time()
            if self.state()["Status"] not in ("running", "created", "configured", "initialized"):
                break
            time.sleep(0.05)
        raise RuntimeError(f"{url} not ready; container {self.state()}; logs:\n{self.logs()[-4000:]}")

    def state(self) -> dict:
        out = sh("inspect", "--format", "{{json .State}}", self.name, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else {"Status": "gone"}

    def logs(self, timestamps: bool = False) -> str:
        out = sh("logs", *(["-t"] if timestamps else []), self.name, check=False)
        return out.stdout + out.stderr

    def remove(self) -> None:
        sh("rm", "-f", "-t", "0", self.name, check=False)


# ---------------------------------------------------------------------------------------------------- serve

def check_serve(c: Container, results: dict) -> None:
    from openai import BadRequestError, OpenAI

    from client import LLMClient, SamplingParams

    checks = results.setdefault("serve", {})
    params = SamplingParams(max_tokens=48)
    with LLMClient(c.grpc) as llm:
        whole = llm.chat(QUESTION, params)
        streamed = "".join(llm.stream_chat(QUESTION, params))
    assert "Paris" in whole.text, whole
    assert streamed == whole.text, (streamed, whole.text)
    checks["grpc_chat"] = whole.text

    oa = OpenAI(base_url=c.openai, api_key="x", max_retries=0, timeout=60)
    model = oa.models.list().data[0].id
    answer = oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=48).choices[0].message.content
    chunks = oa.chat.completions.create(model=model, messages=QUESTION, max_tokens=48, stream=True)
    streamed_oa = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "Paris" in answer and streamed_oa == answer, (answer, streamed_oa)
    assert answer == whole.text, ("the front door answered otherwise than the ensemble", answer, whole.text)
    checks["openai_chat"] = {"model": model, "text": answer}

    status, body = http_status(f"{c.http}/v2/models/ensemble/generate", {"messages": "not json", "max_tokens": 8})
    assert status == 400, (status, body)
    checks["http_bad_input"] = f"{status}: {body.decode()[:160]}"
    try:
        oa.chat.completions.create(model=model, messages=[], max_tokens=8)
        raise AssertionError("the front door accepted an empty conversation")
    except BadRequestError as e:
        checks["openai_bad_input"] = f"{e.status_code}: {str(e)[:160]}"

    top = sh("top", c.name, "user", "pid", "args").stdout.splitlines()[1:]
    users = {line.split()[0] for line in top if line.strip()}
    assert users and "root" not in users and "0" not in users, top
    uid = sh("exec", c.name, "id", "-u").stdout.strip()
    assert uid != "0", uid
    checks["users"] = {"processes": len(top), "users": sorted(users), "exec uid": uid}

    ro = sh("exec", c.name, "sh", "-c", "touch /app/x 2>&1; touch /tmp/x && echo tmp-writable", check=False).stdout
    assert "Read-only file system" in ro and "tmp-writable" in ro, ro
    assert c.state()["Status"] == "running"
    checks["read_only"] = "root filesystem read-only, /tmp a tmpfs; served throughout"
    for k, v in checks.items():
        print(f"  serve {k}: {v}")


# ---------------------------------------------------------------------------------------------------- cpu

_DECODE = ("from builders.profile import ServingProfile; from cpu_engine import load_engine; "
           "print('decode:', load_engine(ServingProfile.from_yaml('builders/profiles/cpu.yaml').resolved()"
           ".engine_dir).decode)")


def check_cpu_targets(image: str, results: dict) -> None:
    """Which compiled step the image's engine loads here, and on an AVX2-only node, stood in for by torch's
    capability lowered to AVX2 (the engine's own C++ kernels still pick AVX-512 by cpuid: they check at run time)."""
    checks = results.setdefault("cpu", {})
    for name, env in (("this machine", []), ("avx2 node", ["-e", "ATEN_CPU_CAPABILITY=avx2"])):
        done = sh("run", "--rm", *run_args(), *env, "--entrypoint", "python3", image, "-c", _DECODE, timeout=180)
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("decode: ")), done.stdout[-500:])
        checks[name] = line.removeprefix("decode: ")
    assert checks["this machine"].startswith("compiled ("), checks
    assert checks["avx2 node"].startswith("compiled (") and "/x86-64-v3-" in checks["avx2 node"], checks
    for k, v in checks.items():
        print(f"  cpu {k}: {v}")


# ---------------------------------------------------------------------------------------------------- liveness

_FIND_LLM_STUB = ("import pathlib; print(next(p.name for p in pathlib.Path('/proc').glob('[0-9]*') "
                  "if b'/llm/1/model.py' in (p / 'cmdline').read_bytes() and "
                  "(p / 'cmdline').read_bytes().split(b'\\0')[0].endswith(b'triton_python_backend_stub')))")


def check_liveness(image: str, results: dict) -> None:
    """On a container of its own: stopping the llm stub may end tritonserver (Triton 2.51 aborts over it)."""
    from serving.health import DEFAULT_DEADLINE_S

    checks = results.setdefault("liveness", {})
    c = Container(image, "triton-llm-image-test-liveness")
    try:
        c.create_and_start()
        c.wait_ready(c.health)  # the launcher serves it once Triton is ready
        status, body = http_status(c.health, timeout=30)
        assert status == 200 and json.loads(body)["ok"], (status, body)
        assert sh("healthcheck", "run", c.name, check=False).returncode == 0, "the image's HEALTHCHECK failed"
        checks["healthy"] = json.loads(body)
        pid = sh("exec", c.name, "python3", "-c", _FIND_LLM_STUB).stdout.strip()
        signal_stub = ["exec", c.name, "python3", "-c", "import os, signal, sys; os.kill(int(sys.argv[1]), "
                       "getattr(signal, sys.argv[2]))", pid]
        sh(*signal_stub, "SIGSTOP")
        try:
            started = time.monotonic()
            status, body = http_status(c.health, timeout=30)
            took = time.monotonic() - started
            assert status == 503 and took < DEFAULT_DEADLINE_S + 3, (status, took, body)
            assert http_status(f"{c.http}/v2/health/live")[0] == 200  # Triton's own says nothing is wrong
            checks["stopped"] = {"status": status, "seconds": round(took, 2), "detail": json.loads(body)["detail"],
                                 "triton_live": 200,
                                 "healthcheck_rc": sh("healthcheck", "run", c.name, check=False).returncode}
            assert checks["stopped"]["healthcheck_rc"] != 0, "the image's HEALTHCHECK passed with the llm stopped"
        finally:
            sh(*signal_stub, "SIGCONT", check=False)
        deadline = time.monotonic() + 60
        while True:
            state = c.state()
            if state["Status"] not in ("running", "created", "configured", "initialized"):
                assert state.get("ExitCode") not in (0, None), state
                checks["after_sigcont"] = f"container exited {state.get('ExitCode')} (tritonserver aborted)"
                break
            status, body = http_status(c.health, timeout=30)
            if status == 200:
                checks["after_sigcont"] = "generating again"
                break
            assert time.monotonic() < deadline, (status, body)
            time.sleep(1)
        for k, v in checks.items():
            print(f"  liveness {k}: {v}")
    except Exception:
        print(c.logs()[-3000:], file=sys.stderr)
        raise
    finally:
        c.remove()


# ---------------------------------------------------------------------------------------------------- drain

def check_drain(c: Container, results: dict, streams_each: int = 4) -> None:
    """`stop -t 60` while 8 streams are in flight: the launcher (behind tini) stops the front door (its open
    streams finish, new requests 503), then drains Triton (new requests UNAVAILABLE, the accepted ones finish)."""
    from openai import OpenAI

    from client import LLMClient, SamplingParams

    grpc_tokens, openai_tokens = 64, 24  # the gRPC streams outlive the front door's: Triton's drain is seen too
    first_token = threading.Barrier(2 * streams_each + 1, timeout=120)
    outcome: dict[str, dict] = {}

    def grpc_stream(i: int) -> None:
        key = f"grpc-{i}"
        try:
            with LLMClient(c.grpc) as llm:
                stream = llm.stream(f"Story {i}: Once upon a time",
                                    SamplingParams(max_tokens=grpc_tokens, min_tokens=grpc_tokens))
                text, first = "", True
                for delta in stream:
                    text += delta
                    if first:
                        first = False
                        first_token.wait()
                done = stream.completion
                outcome[key] = {"ok": done is not None and done.num_output_tokens == grpc_tokens,
                                "tokens": done.num_output_tokens if done else None,
                                "finish": done.finish_reason if done else None, "end": time.time()}
        except Exception as e:  # noqa: BLE001 - reported below
            outcome[key] = {"ok": False, "error": repr(e)[:300], "end": time.time()}

    def openai_stream(i: int) -> None:
        key = f"openai-{i}"
        try:
            oa = OpenAI(base_url=c.openai, api_key="x", max_retries=0, timeout=120)
            chunks, finish, first = 0, None, True
            for ch in oa.completions.create(model=model, prompt=f"Chapter {i}. It was a dark and stormy night",
                                            max_tokens=openai_tokens, stream=True):
                if ch.choices and ch.choices[0].text:
                    chunks += 1
                    if first:
                        first = False
                        first_token.wait()
                if ch.choices and ch.choices[0].finish_reason:
                    finish = ch.choices[0].finish_reason
            outcome[key] = {"ok": finish in ("stop", "length"), "chunks": chunks, "finish": finish,
                            "end": time.time()}
        except Exception as e:  # noqa: BLE001
            outcome[key] = {"ok": False, "error": repr(e)[:300], "end": time.time()}

    model = OpenAI(base_url=c.openai, api_key="x", max_retries=0).models.list().data[0].id
    threads = [threading.Thread(target=grpc_stream, args=(i,)) for i in range(streams_each)]
    threads += [threading.Thread(target=openai_stream, args=(i,)) for i in range(streams_each)]
    for t in threads:
        t.start()
    first_token.wait()  # all 8 are streaming
    stop_result: dict = {}

    def stop() -> None:
        stop_result["start"] = time.time()
        proc = sh("stop", "-t", str(STOP_TIMEOUT_S), c.name, check=False, timeout=STOP_TIMEOUT_S + 30)
        stop_result.update(end=time.time(), rc=proc.returncode, err=proc.stderr.strip())

    stopper = threading.Thread(target=stop)
    stopper.start()
    # Probe once the stop has reached the front door (its /health turns 503, or nothing listens): podman's own
    # start-up before it signals is longer than any fixed pause on a busy machine.
    health, deadline = c.openai.removesuffix("/v1") + "/health", time.monotonic() + 60
    while stopper.is_alive() and time.monotonic() < deadline and http_status(health, timeout=2)[0] == 200:
        time.sleep(0.05)
    # New requests while draining: the front door answers 503 (or no longer listens); Triton, once its drain has
    # begun (after the front door's streams), answers UNAVAILABLE (or no longer listens).
    probes: list[dict] = []
    status, body = http_status(f"{c.openai}/chat/completions",
                               {"model": model, "messages": QUESTION, "max_tokens": 4}, timeout=30)
    probes.append({"t": time.time(), "via": "openai", "refused": status in (0, 503), "status": status,
                   "body": body.decode()[:160]})
    # Until the first refusal or the end of the stop, not while our gRPC streams run: on an idle machine they end
    # before the front door's, so Triton's drain had not begun yet and every probe was (rightly) accepted.
    while stopper.is_alive() and not any(p["refused"] for p in probes[1:]):
        try:
            with LLMClient(c.grpc, timeout=30) as llm:
                done = llm.generate("Hello", SamplingParams(max_tokens=2))
            probes.append({"t": time.time(), "via": "grpc", "refused": False, "text": done.text})
        except Exception as e:  # noqa: BLE001 - UNAVAILABLE while Triton drains, or nothing listening any more
            probes.append({"t": time.time(), "via": "grpc", "refused": True, "error": repr(e)[:160]})
        time.sleep(0.2)
    for t in threads:
        t.join(180)
    stopper.join(STOP_TIMEOUT_S + 60)
    state = c.state()
    logs = c.logs(timestamps=True)
    completed = sum(1 for v in outcome.values() if v.get("ok"))
    refused_grpc = [p for p in probes if p["via"] == "grpc" and p["refused"]]
    first_refusal = min((p["t"] for p in refused_grpc), default=None)
    accepted_after = [p for p in probes if p["via"] == "grpc" and not p["refused"] and first_refusal
                      and p["t"] > first_refusal]
    res = {
        "streams_completed": f"{completed}/{len(threads)}",
        "stop_s": round(stop_result["end"] - stop_result["start"], 2),
        "last_stream_end_after_stop_s": round(max(v["end"] for v in outcome.values()) - stop_result["start"], 2),
        "exit_code": state.get("ExitCode"), "stop_rc": stop_result["rc"],
        "openai_probe": probes[0]["status"], "grpc_probes": len([p for p in probes if p["via"] == "grpc"]),
        "grpc_probes_refused": len(refused_grpc),
        "refusal": refused_grpc[0]["error"] if refused_grpc else None,
        "drain_log": [ln.split(" ", 1)[1] for ln in logs.splitlines() if "drain" in ln.lower()][-3:],
        "streams": outcome,
    }
    results["drain"] = res
    for k, v in res.items():
        if k != "streams":
            print(f"  drain {k}: {v}")
    assert completed == len(threads), outcome
    assert probes[0]["refused"], probes[0]
    assert refused_grpc and not accepted_after, probes
    assert stop_result["rc"] == 0 and state.get("ExitCode") == 0, (stop_result, state, logs[-3000:])
    assert res["stop_s"] < STOP_TIMEOUT_S, "stop waited its whole timeout: the container was killed"


# ---------------------------------------------------------------------------------------------------- cold

_TRITON_LINE = re.compile(r"^(\S+) [IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] (.*)$")


def _ts(stamp: str) -> float:
    """podman's RFC 3339 log timestamp (nanoseconds, Z) -> epoch seconds."""
    stamp = stamp.replace("Z", "+00:00")
    head, _, frac_tz = stamp.partition(".")
    frac = re.match(r"\d+", frac_tz).group(0) if frac_tz else "0"
    tz = frac_tz[len(frac):] if frac_tz else stamp[19:]
    return datetime.fromisoformat(f"{head}.{frac[:6]}{tz}").timestamp()


def cold_parts(c: Container, ready_http: float, ready_openai: float) -> dict:
    """The parts of one start, from the container's timestamped log lines (when conmon received them)."""
    marks: dict[str, float] = {}
    wanted = {
        "triton_first_log": lambda m: True,
        "models_loading": lambda m: "loading: " in m,
        "llm_imported": lambda m: "model 'llm' runs Python" in m,
        "preprocessing_imported": lambda m: "model 'preprocessing' runs Python" in m,
        "engine_loaded": lambda m: "CPU engine loaded" in m,
        "llm_loaded": lambda m: "successfully loaded 'llm'" in m,
        "preprocessing_loaded": lambda m: "successfully loaded 'preprocessing'" in m,
        "ensemble_loaded": lambda m: "successfully loaded 'ensemble'" in m,
        "http_service": lambda m: "Started HTTPService" in m,
    }
    engine_s = None
    for line in c.logs(timestamps=True).splitlines():
        stamp, _, rest = line.partition(" ")
        m = _TRITON_LINE.match(line)
        msg = m.group(2) if m else rest
        for key, match in wanted.items():
            if key not in marks and m and match(msg):
                marks[key] = _ts(stamp)
        found = re.search(r"CPU engine loaded from \S+ in ([\d.]+)s", msg)
        if found:
            engine_s = float(found.group(1))
    t0 = c.t_create
    need = ("triton_first_log", "models_loading", "llm_imported", "preprocessing_imported", "engine_loaded",
            "llm_loaded", "preprocessing_loaded", "ensemble_loaded")
    missing = [k for k in need if k not in marks]
    if missing:
        raise RuntimeError(f"log lines not found for {missing}:\n{c.logs()[-3000:]}")
    return {
        "create_s": c.t_created - t0,                                  # podman create
        "container_start_s": c.t_started - c.t_created,                # podman start returns (runc, tini exec'd)
        "process_start_s": marks["triton_first_log"] - c.t_started,    # tini -> launcher (imports, install check)
                                                                       # -> tritonserver's first log line
        "triton_init_s": marks["models_loading"] - marks["triton_first_log"],
        "llm_stub_imports_s": marks["llm_imported"] - marks["models_loading"],  # stub start + model.py imports
        "preprocessing_imports_s": marks["preprocessing_imported"] - marks["models_loading"],  # the first of 2
        "engine_load_s": engine_s,                                     # cpu_engine.load_engine, its own clock
        "llm_load_s": marks["llm_loaded"] - marks["models_loading"],   # imports + engine load + threads
        "preprocessing_load_s": marks["preprocessing_loaded"] - marks["models_loading"],  # transformers, tokenizer
        "triton_model_load_s": marks["ensemble_loaded"] - marks["models_loading"],  # all three models
        "ready_after_models_s": ready_http - marks["ensemble_loaded"],
        "ready_http_s": ready_http - t0,                               # create -> /v2/health/ready 200
        "ready_openai_s": ready_openai - t0,                           # create -> front door /v1/models 200
    }


def _go_duration(text: str) -> float | None:
    """Go's time.Duration text (podman's cpu_time: "1m2.5s", "830.1ms") -> seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([\d.]+)(h|ms|us|µs|ns|m|s)", text or "")
    return sum(float(v) * units[u] for v, u in parts) if parts else None


def cpu_seconds(c: Container) -> float | None:
    """CPU time the container has used so far (podman stats), or None where the engine does not say."""
    out = sh("stats", "--no-stream", "--format", "json", c.name, check=False).stdout
    try:
        return _go_duration(json.loads(out)[0]["cpu_time"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def check_cold(image: str, starts: int, results: dict) -> None:
    runs = []
    for i in range(starts):
        c = Container(image, f"triton-llm-image-test-cold-{i}")
        try:
            load = os.getloadavg()[0]
            c.create_and_start()
            ready_http = c.wait_ready(f"{c.http}/v2/health/ready")
            cpu = cpu_seconds(c)
            ready_openai = c.wait_ready(f"{c.openai}/models")
            parts = cold_parts(c, ready_http, ready_openai)
            parts["cpu_s_to_ready"] = cpu  # the container's CPU time when Triton was ready (all its processes)
            parts["load_1min_before"] = load
            parts["load_1min_at_ready"] = os.getloadavg()[0]
            runs.append(parts)
        finally:
            c.remove()
    keys = list(runs[0])
    print("  cold start (s)        " + "  ".join(f"start {i + 1:>2}" for i in range(len(runs))))
    for k in keys:
        print(f"  {k:<24}" + "  ".join(f"{r[k]:>8.2f}" if r[k] is not None else "       -" for r in runs))
    results["cold"] = runs
    worst = max(r["ready_http_s"] for r in runs)
    results["cold_summary"] = {"ready_http_s_max": worst, "goal_s": 10, "met": worst <= 10}
    # A goal, not a check: the start is CPU-bound (cpu_s_to_ready), so its wall time depends on the machine's load.
    print(f"  cold start goal <= 10 s: {'met' if worst <= 10 else 'missed'} (slowest {worst:.1f} s, "
          f"load {max(r['load_1min_at_ready'] for r in runs):.1f} at ready)")


# ---------------------------------------------------------------------------------------------------- helm

def check_helm(image: str, results: dict) -> None:
    env = dict(os.environ, TRITON_LLM_IMAGE=image)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_helm_live.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    results["helm"] = {"rc": proc.returncode, "summary": tail}
    print(f"  helm live test with the image: {' '.join(tail)}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def _history(image: str) -> list[tuple[int, str]]:
    """(bytes, created by) per layer, newest first (podman: one JSON array; docker: one JSON object a line)."""
    out = sh("history", "--no-trunc", "--format", "json" if "podman" in engine()[0] else "{{json .}}", image).stdout
    try:
        rows = json.loads(out)
    except ValueError:
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(int(r.get("size", r.get("Size", 0)) or 0), r.get("CreatedBy", "")) for r in rows]


def image_sizes(image: str) -> dict:
    """Bytes per layer group: base (the base image's own layers), Python deps (the venv), model (engine and
    tokenizer), project (tini/user, the code, the rendered repository)."""
    rows = _history(image)
    base_name = sh("inspect", "--format", '{{index .Labels "org.opencontainers.image.base.name"}}', image,
                   check=False).stdout.strip()
    n_base = len(_history(base_name)) if base_name and sh("image", "exists", base_name, check=False).returncode == 0 \
        else 1
    groups = {"base": sum(size for size, _ in rows[len(rows) - n_base:]), "python_deps": 0, "model": 0, "project": 0}
    for size, created in rows[:len(rows) - n_base]:
        if "-m venv" in created or "requirements" in created:
            groups["python_deps"] += size
        elif "COPY --from=model" in created or re.search(r"COPY dir:\S+ in (/app/)?build/", created):
            groups["model"] += size
        else:
            groups["project"] += size
    groups["total"] = sum(groups.values())
    return groups


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", default="triton-llm-stack:cpu")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--only", default="serve,drain,liveness,cold,cpu,helm")
    ap.add_argument("--json", default=str(ROOT / "build" / "image-test.json"))
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    results: dict = {"image": args.image, "engine": engine(), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if sh("image", "exists", args.image, check=False).returncode != 0 and \
            sh("image", "inspect", args.image, check=False).returncode != 0:
        raise SystemExit(f"image_test: no image {args.image}: run `make image` first")
    results["size_bytes"] = image_sizes(args.image)
    print("image_test: size per layer group (MB): " + ", ".join(
        f"{k} {v / 1e6:.0f}" for k, v in results["size_bytes"].items()))
    failed = []
    t_all = time.monotonic()
    if only & {"serve", "drain"}:
        c = Container(args.image, "triton-llm-image-test")
        try:
            start = time.monotonic()
            c.create_and_start()
            c.wait_ready(f"{c.http}/v2/health/ready")
            c.wait_ready(f"{c.openai}/models")
            print(f"image_test: {args.image} ready in {time.monotonic() - start:.1f} s "
                  f"(HTTP {c.ports['http']}, gRPC {c.ports['grpc']}, OpenAI {c.ports['openai']})")
            for name, fn in (("serve", check_serve), ("drain", check_drain)):
                if name in only:
                    try:
                        fn(c, results)
                        print(f"image_test: {name} OK")
                    except Exception as e:  # noqa: BLE001
                        failed.append(name)
                        print(f"image_test: {name} FAILED: {e!r}"[:3000], file=sys.stderr)
        finally:
            if failed:
                print(c.logs()[-3000:], file=sys.stderr)
            c.remove()
    for name, fn in (("liveness", lambda: check_liveness(args.image, results)),
                     ("cold", lambda: check_cold(args.image, args.starts, results)),
                     ("cpu", lambda: check_cpu_targets(args.image, results)),
                     ("helm", lambda: check_helm(args.image, results))):
        if name in only:
            try:
                fn()
                print(f"image_test: {name} OK")
            except Exception as e:  # noqa: BLE001
                failed.append(name)
                print(f"image_test: {name} FAILED: {e!r}"[:4000], file=sys.stderr)
    results["seconds"] = round(time.monotonic() - t_all, 1)
    results["failed"] = failed
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(f"image_test: {'FAILED: ' + ', '.join(failed) if failed else 'all passed'} in {results['seconds']} s "
          f"(measurements: {args.json})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
