"""Liveness that generates (serving/health.py): under a 10× overload it never fails; a stopped ``llm`` stub fails it
within its deadline while Triton's own ``/v2/health/live`` stays 200; once the stub runs again it passes again — or
Triton 2.51 has aborted over the stopped stub and the launcher has exited non-zero (docs/reliability.md, "Liveness").

Each layout's server runs as operators run it (``python -m serving serve``, the launcher serving
``GET /health/generate`` on its health port), on the suite's tiny model.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest

from serving.health import DEFAULT_DEADLINE_S, HEALTH_PATH
from serving.launcher import free_ports
from tests.reliability import relkit

pytestmark = pytest.mark.both_layouts
OVERLOAD_S = 20.0


@pytest.fixture(scope="module")
def served(layout, layout_repository, tmp_path_factory):
    out = tmp_path_factory.mktemp("liveness") / "serve.log"
    ports = free_ports(3)
    proc = relkit.launch_cli(layout_repository, out, ports, exit_timeout_secs=10)  # no front door
    relkit.wait_cli_ready(proc, out)
    log = out.read_text()
    health_url = log.split("liveness ", 1)[1].split()[0]
    yield {"proc": proc, "health": health_url, "http": f"http://localhost:{ports[0]}",
           "grpc": f"localhost:{ports[1]}", "log": out}
    if proc.poll() is None:
        relkit.terminate_and_wait(proc)


def get(url: str, timeout: float = 30.0) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def llm_stub(launcher) -> psutil.Process:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        cmdline = child.cmdline()
        if cmdline and cmdline[0].endswith("triton_python_backend_stub") and "/llm/1/model.py" in cmdline[1]:
            return child
    raise AssertionError("no llm stub under the launcher")


def test_the_check_never_fails_under_a_tenfold_overload(served):
    """Probes pass the llm's bounded admission while it is full and rejecting, and the engine's waiting requests:
    every probe passes. They still wait their turn in Triton's queues before the llm (docs/reliability.md, 8)."""
    capacity = relkit.measure_capacity(served["grpc"], slots=8, max_tokens=64, duration_s=4.0)
    results: list[tuple[int, dict]] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            results.append(get(served["health"]))
            stop.wait(1.0)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        run = asyncio.run(relkit.open_loop(served["grpc"], 10 * capacity, OVERLOAD_S, 64, stream=True, timeout_s=60))
    finally:
        stop.set()
        prober.join()
    assert run.of("rejected"), "the overload must have filled the queue (else this tests nothing)"
    failed = [body for status, body in results if status != 200]
    seconds = sorted(body["seconds"] for _, body in results)
    ok = sorted(o.latency_s for o in run.of("ok"))
    rejected = sorted(o.latency_s for o in run.of("rejected"))
    print(f"\n10x overload of {capacity:.1f} req/s for {run.duration_s:.0f} s: {len(rejected)} requests rejected "
          f"(p50 {rejected[len(rejected) // 2]:.2f} s), {len(ok)} served (p50 {ok[len(ok) // 2]:.2f} max {ok[-1]:.2f} s), "
          f"{run.kinds()}; {len(results)} probes, {len(failed)} failed, probe seconds p50 "
          f"{seconds[len(seconds) // 2]:.2f} max {seconds[-1]:.2f}")
    # One probe a second, each taking up to its deadline: this many at least, or the overload went unprobed.
    assert len(results) >= OVERLOAD_S // (DEFAULT_DEADLINE_S + 1) and not failed, failed


def test_a_stopped_llm_stub_fails_the_generating_check_while_triton_says_live(served):
    assert get(served["health"])[0] == 200
    stub = llm_stub(served["proc"])
    os.kill(stub.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, body = get(served["health"])
        took = time.monotonic() - started
        # Either Triton's python backend finds the stub unresponsive first ("Stub process 'llm_0_0' is not
        # healthy", about a second) or the deadline passes ("no answer within"): a failure, by the deadline.
        assert status == 503 and not body["ok"], body
        assert took < DEFAULT_DEADLINE_S + 3, took
        # What Kubernetes probed until now: Triton's liveness and readiness say nothing is wrong.
        assert get(f"{served['http']}/v2/health/live")[0] == 200
        assert get(f"{served['http']}/v2/health/ready")[0] == 200
        print(f"\nllm stopped: {status} after {took:.2f} s ({body['detail']}); /v2/health/live and /ready 200")
    finally:
        os.kill(stub.pid, signal.SIGCONT)
    # Then either the stub serves again and so does the check, or — Triton 2.51's python backend, seen here — the
    # stub was declared dead and tritonserver aborted (boost::interprocess::lock_exception), so the launcher exits
    # non-zero and the container restarts. Never what the check exists for: live and ready, and nothing answering.
    deadline = time.monotonic() + 60
    while True:
        if served["proc"].poll() is not None:
            assert served["proc"].returncode != 0
            assert "tritonserver exited on its own" in served["log"].read_text(), "the launcher must say why"
            print(f"after SIGCONT: tritonserver aborted, the launcher exited {served['proc'].returncode}")
            return
        result = get(served["health"])
        if result[0] == 200:
            assert result[1]["ok"] and result[1]["seconds"] < DEFAULT_DEADLINE_S
            print(f"after SIGCONT: generating again ({result[1]['seconds']:.2f} s)")
            return
        assert time.monotonic() < deadline, result
        time.sleep(1)
