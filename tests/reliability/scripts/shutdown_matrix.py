"""Finding 2: when does SIGTERM wait the whole --exit-timeout-secs and exit 1 ("Exit timeout expired")?

For each scenario and run: start a fresh tritonserver, run the scenario, SIGTERM it, and record the exit code,
the exit time and what the server said while it waited: models with in-flight inferences (causes A-C in
docs/reliability.md), a model left "live" after every request ended (cause D), open HTTP connections (cause E).
``stuck_ensemble_requests`` (sent - ensemble successes - failures) is a hint only: Triton counts a cancelled
ensemble request as a failure even while it stays in flight.

    .venv/bin/python tests/reliability/scripts/shutdown_matrix.py --runs 5
    .venv/bin/python tests/reliability/scripts/shutdown_matrix.py --runs 15 --scenarios nonstream16x4,http16x4
    .venv/bin/python tests/reliability/scripts/shutdown_matrix.py --repository /tmp/patched/repo --runs 5

Scenarios: idle, nonstream16(x4), stream4, stream16(x4) (client SDK, asyncio), nonstream8, sync_nonstream16
(SDK, threads), raw_nonstream16 / raw_stream16 (tritonclient, threads), sequential16, http16(x4), http_keepalive,
llm16x4 (gRPC to the llm model), aio_halfclose16x4 / aio_open16x4 / aio_noempty16x4 / aio_stream16x4 /
aio_stream_readall16x4 / aio_llm_stream16x4 (tritonclient.grpc.aio variants), sdk_cancel, raw_cancel,
llm_cancel. Without --repository it renders the test suite's profile into --workdir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.reliability import relkit  # noqa: E402
from tests.triton_helpers import make_input, text_inputs  # noqa: E402


def raw_stream_then_cancel(grpc_url: str, model: str, inputs, cancel: bool = True) -> int:
    """Start one stream, wait for its first response, then cancel the gRPC call (no `stop`). Returns 1."""
    got: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(grpc_url)
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    c.async_stream_infer(model, inputs, request_id="raw-cancel", enable_empty_final_response=True)
    got.get(timeout=60)
    c.stop_stream(cancel_requests=cancel)
    c.close()
    return 1


async def concurrent(grpc_url: str, n: int, stream: bool, max_tokens: int) -> tuple[int, dict]:
    from client import AsyncLLMClient

    async with AsyncLLMClient(grpc_url) as client:
        outcomes = await asyncio.gather(*(relkit.one_request(client, relkit.PROMPTS[i % len(relkit.PROMPTS)],
                                                             max_tokens, stream, 30.0) for i in range(n)))
    kinds: dict[str, int] = {}
    for o in outcomes:
        kinds[o.kind] = kinds.get(o.kind, 0) + 1
    return n, kinds


async def aio_requests(grpc_url: str, n: int, keep_open: bool, stream: bool = False,
                       empty_final: bool = True, model: str = "ensemble",
                       read_to_end: bool = False) -> tuple[int, dict]:
    """``n`` concurrent requests with tritonclient.grpc.aio, one stream each. keep_open=False: the request
    iterator ends right after the request, so gRPC half-closes the stream while the request is in flight
    (what client/aio.py does); keep_open=True: it ends only after the final response has arrived."""
    import tritonclient.grpc.aio as aio

    from client.core import build_inputs, is_final
    from client import SamplingParams

    client = aio.InferenceServerClient(grpc_url)
    kinds: dict[str, int] = {}

    async def one(i: int):
        done = asyncio.Event()

        if model == "ensemble":
            inputs = build_inputs(relkit.PROMPTS[i % len(relkit.PROMPTS)], SamplingParams(max_tokens=64),
                                  stream=stream)
        else:
            inputs = [make_input("input_ids", [[1, 2, 3 + i % 50]], np.int32),
                      make_input("input_lengths", [[3]], np.int32),
                      make_input("request_output_len", [[64]], np.int32),
                      make_input("streaming", [[stream]], bool)]

        async def requests_():
            yield {"model_name": model, "request_id": f"r{i}", "inputs": inputs,
                   "parameters": {"triton_enable_empty_final_response": empty_final}}
            if keep_open:
                await done.wait()

        kind, responses = "no final", 0
        async for result, error in client.stream_infer(requests_()):
            if error is not None:
                kind = "error"
                break
            responses += 1
            data = bool(result.get_response().outputs)
            if is_final(result) or (not empty_final and data):
                kind = f"ok ({'many' if responses > 1 else 1} responses{'' if data else ', last one empty'})"
                done.set()
                if not read_to_end:
                    break  # like client/aio.py: stop reading at the final response
        kinds[kind] = kinds.get(kind, 0) + 1

    try:
        for _ in range(4):
            await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()
    return 4 * n, kinds


def sdk_cancel(grpc_url: str, n: int = 1) -> tuple[int, dict]:
    from client import LLMClient, SamplingParams

    with LLMClient(grpc_url) as client:
        for _ in range(n):
            s = client.stream("def f(x):", SamplingParams(max_tokens=200))
            next(s)
            s.close()
    return n, {}


def threads(n: int, fn) -> tuple[int, dict]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        kinds: dict[str, int] = {}
        for kind in pool.map(fn, range(n)):
            kinds[kind] = kinds.get(kind, 0) + 1
    return n, kinds


def http_generate(http_url: str, i: int) -> str:
    import requests

    r = requests.post(f"{http_url}/v2/models/ensemble/generate",
                      json={"text_input": relkit.PROMPTS[i % len(relkit.PROMPTS)], "max_tokens": 64}, timeout=60)
    return "ok" if r.status_code == 200 else f"http {r.status_code}"


_KEEP = []


def requests_session_request(http_url: str):
    """A keep-alive HTTP client (requests.Session) that stays around, idle, like a proxy's upstream pool."""
    import requests

    session = requests.Session()
    session.post(f"{http_url}/v2/models/ensemble/generate", json={"text_input": "x", "max_tokens": 4}, timeout=60)
    _KEEP.append(session)
    return session


def sdk_generate(grpc_url: str, i: int) -> str:
    from client import LLMClient, SamplingParams

    with LLMClient(grpc_url) as client:
        client.generate(relkit.PROMPTS[i % len(relkit.PROMPTS)], SamplingParams(max_tokens=64))
    return "ok"


def llm_generate(grpc_url: str, i: int) -> str:
    from tests.triton_helpers import stream_request

    inputs = [make_input("input_ids", [[1, 2, 3 + i % 50]], np.int32), make_input("input_lengths", [[3]], np.int32),
              make_input("request_output_len", [[64]], np.int32)]
    _, error = stream_request(grpc_url, "llm", inputs, timeout=30)
    return "ok" if error is None else "error"


def raw_generate(grpc_url: str, i: int, stream: bool = False) -> str:
    from tests.triton_helpers import stream_request

    _, error = stream_request(grpc_url, "ensemble", text_inputs(relkit.PROMPTS[i % len(relkit.PROMPTS)], 64,
                                                                stream=stream), timeout=30)
    return "ok" if error is None else "error"


SCENARIOS = {
    "idle": lambda u: (0, {}),
    "http16": None,  # these three need the HTTP URL: see run_once
    "http_keepalive": None,
    "http16x4": None,
    "nonstream16": lambda u: asyncio.run(concurrent(u, 16, False, 64)),
    "stream16": lambda u: asyncio.run(concurrent(u, 16, True, 64)),
    "stream4": lambda u: asyncio.run(concurrent(u, 4, True, 64)),
    "nonstream16x4": lambda u: (64, [asyncio.run(concurrent(u, 16, False, 64)) for _ in range(4)][-1][1]),
    "stream16x4": lambda u: (64, [asyncio.run(concurrent(u, 16, True, 64)) for _ in range(4)][-1][1]),
    "llm16x4": lambda u: (0, [threads(16, lambda i: llm_generate(u, i)) for _ in range(4)][-1][1]),
    "aio_halfclose16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=False)),
    "aio_open16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=True)),
    "aio_noempty16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=False, empty_final=False)),
    "aio_stream16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=False, stream=True)),
    "aio_stream_readall16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=False, stream=True,
                                                                 read_to_end=True)),
    "aio_llm_stream16x4": lambda u: asyncio.run(aio_requests(u, 16, keep_open=False, stream=True, model="llm")),
    "nonstream8": lambda u: asyncio.run(concurrent(u, 8, False, 64)),
    "sync_nonstream16": lambda u: threads(16, lambda i: sdk_generate(u, i)),
    "raw_nonstream16": lambda u: threads(16, lambda i: raw_generate(u, i)),
    "raw_stream16": lambda u: threads(16, lambda i: raw_generate(u, i, stream=True)),
    "sequential16": lambda u: (16, {"ok": sum(raw_generate(u, i) == "ok" for i in range(16))}),
    "sdk_cancel": lambda u: sdk_cancel(u),
    "raw_cancel": lambda u: (raw_stream_then_cancel(u, "ensemble", text_inputs("def f(x):", 200, stream=True)),
                             {}),
    "llm_cancel": lambda u: (0 if raw_stream_then_cancel(u, "llm", [
        make_input("input_ids", [[1, 2, 3]], np.int32), make_input("input_lengths", [[3]], np.int32),
        make_input("request_output_len", [[200]], np.int32), make_input("streaming", [[True]], bool)]) else 0, {}),
}


def run_once(repo: Path, workdir: Path, scenario: str, exit_timeout: int, run: int = 0) -> dict:
    server = relkit.start_server(repo, workdir, exit_timeout_secs=exit_timeout, name=f"shutdown-{scenario}-{run}")
    try:
        before = relkit.snapshot(server.urls.metrics)
        if scenario == "http16":
            sent, kinds = threads(16, lambda i: http_generate(server.urls.http, i))
        elif scenario == "http_keepalive":  # one finished request whose connection the client keeps open
            requests_session_request(server.urls.http)
            sent, kinds = 1, {"ok": 1}
        elif scenario == "http16x4":
            sent, kinds = 64, [threads(16, lambda i: http_generate(server.urls.http, i)) for _ in range(4)][-1][1]
        else:
            sent, kinds = SCENARIOS[scenario](server.urls.grpc)
        time.sleep(0.5)
        try:  # the engine itself always drains; what matters is whether every ensemble request ended
            relkit.idle(server.urls.metrics, timeout=30)
            relkit.wait_for(lambda: relkit.snapshot(server.urls.metrics).ensemble_done - before.ensemble_done >= sent,
                            timeout=5, what="ensemble accounting")
        except AssertionError:
            pass
        after = relkit.snapshot(server.urls.metrics)
        stuck = sent - (after.ensemble_done - before.ensemble_done)
    finally:
        started = time.monotonic()
        rc = server.stop(timeout=exit_timeout + 60)
        exit_s = time.monotonic() - started
        for session in _KEEP:
            session.close()
        _KEEP.clear()
    log = server.log_text()
    return {"scenario": scenario, "sent": sent, "client": kinds, "stuck_ensemble_requests": stuck, "rc": rc,
            "exit_s": round(exit_s, 1), "exit_timeout_expired": "Exit timeout expired" in log,
            "waited_for_http_connections": "HTTP service connections" in log,
            "ensemble_left_live": "Found 1 live models" in log and "unloaded 'ensemble'" not in log,
            "left_live": sorted({"ensemble", "preprocessing", "llm"}
                                - set(re.findall(r"successfully unloaded '([^']+)'", log))),
            "log": str(server.config.log_file),
            "in_flight_at_exit": relkit.in_flight_at_exit(log)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", type=Path, help="a rendered model repository (default: the test profile's)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/reliability-shutdown"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--scenarios", default="idle,nonstream16,stream4,stream16,sdk_cancel,raw_cancel,llm_cancel")
    ap.add_argument("--exit-timeout", type=int, default=10)
    ap.add_argument("--out", type=Path, help="append JSON lines here")
    args = ap.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    repo = args.repository
    if repo is None:
        checkpoint, engine = relkit.build_tiny_stack(args.workdir)
        repo = relkit.render(args.workdir / "repo", engine, checkpoint)
    summary: dict[str, list[dict]] = {}
    for scenario in args.scenarios.split(","):
        for i in range(args.runs):
            try:
                row = run_once(repo, args.workdir, scenario, args.exit_timeout, i)
            except Exception as exc:  # noqa: BLE001 - a shared machine: record it, go on
                print(f"{scenario} run {i}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr, flush=True)
                continue
            row["run"] = i
            print(json.dumps(row), flush=True)
            if args.out:
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
            summary.setdefault(scenario, []).append(row)
    print(f"\nrepository: {repo}")
    print(f"{'scenario':<12} {'runs':>4} {'exit 1':>6} {'stuck reqs':>10} {'client hung':>11} {'median exit s':>13}")
    for scenario, rows in summary.items():
        exits = sorted(r["exit_s"] for r in rows)
        print(f"{scenario:<12} {len(rows):>4} {sum(r['rc'] != 0 for r in rows):>6} "
              f"{sum(r['stuck_ensemble_requests'] for r in rows):>10} "
              f"{sum(r['client'].get('timeout', 0) for r in rows):>11} {exits[len(exits) // 2]:>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
