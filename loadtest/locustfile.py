"""locust user for the ensemble: gRPC streaming, TTFT and TPOT recorded as custom statistics.

Run it through ``python -m loadtest locust`` (headless, bounded in time and request count, CSV + HTML), or by
hand::

    python -m locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s --host grpc://localhost:8001

Order matters: locust (imported first) monkey-patches with gevent, then ``init_gevent()`` makes gRPC
cooperate with gevent *before* tritonclient is imported; otherwise all users silently run one at a time.
Each user keeps one gRPC stream open and closes its client in ``on_stop`` (locust hangs at exit otherwise).

Statistics (locust's CSV/HTML): request type ``gRPC`` = the whole request (sent -> final response);
type ``TTFT`` = sent -> first response with text; type ``TPOT`` = (last - first) / (output tokens - 1).
Because locust keeps response times with 1 ms resolution below 100 ms, exact percentiles are also written
as JSON (``--timings-out``) for ``python -m loadtest locust``.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import random
import time
from pathlib import Path

from locust import LoadTestShape, User, constant, events, task  # noqa: I001 - locust first (gevent patching)

import gevent  # noqa: E402
import grpc.experimental.gevent as grpc_gevent  # noqa: E402
import locust.stats  # noqa: E402

grpc_gevent.init_gevent()

# locust rewrites its --csv files every CSV_STATS_INTERVAL_SEC and not at exit: write often, and give the writer
# a moment after the test stops (below), so the CSV holds every request, like the HTML report.
locust.stats.CSV_STATS_INTERVAL_SEC = 0.2

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

MIX = (  # (name, weight, prompt tokens, output tokens): the --mix workload
    ("short", 3, 32, 24),
    ("long", 1, 256, 64),
)

_state: dict = {"prompts": [], "started": 0, "completed": 0, "ttft": [], "tpot": [], "latency": [],
                "failures": 0, "quitting": False}


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("triton")
    g.add_argument("--triton-model", default="ensemble")
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--max-tokens", type=int, default=32)
    g.add_argument("--mix", action="store_true", help="3 short (32->24) : 1 long (256->64) prompts")
    g.add_argument("--no-stream", action="store_true")
    g.add_argument("--tokenizer", default=os.environ.get("LOADTEST_TOKENIZER", "build/models/smollm2"))
    g.add_argument("--max-requests", type=int, default=0, help="stop the run after this many requests")
    g.add_argument("--shape", choices=["constant", "step"], default="constant")
    g.add_argument("--shape-users", type=int, default=4, help="users (constant) / ceiling (step)")
    g.add_argument("--shape-spawn-rate", type=float, default=4.0)
    g.add_argument("--step-users", type=int, default=2)
    g.add_argument("--step-time", type=float, default=10.0)
    g.add_argument("--shape-time", type=float, default=30.0, help="seconds the shape runs")
    g.add_argument("--timings-out", default="", help="write exact TTFT/TPOT/latency percentiles here (JSON)")
    g.add_argument("--request-timeout", type=float, default=120.0)


@events.init.add_listener
def _prepare(environment, **_kw) -> None:
    from loadtest.inputs import PromptTokenizer, prompt_with_tokens

    opts = environment.parsed_options
    if opts is None:
        return
    tok = PromptTokenizer(opts.tokenizer)
    rng = random.Random(0)
    kinds = [(n, w, p, o) for n, w, p, o in MIX] if opts.mix else [("generate", 1, opts.prompt_tokens, opts.max_tokens)]
    prompts = []
    for name, weight, p_tokens, o_tokens in kinds:
        for _ in range(8 * weight):
            prompts.append((name, prompt_with_tokens(tok, p_tokens, rng), o_tokens))
    rng.shuffle(prompts)
    _state["prompts"] = prompts


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"count": 0}
    a = np.asarray(values)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {"count": len(a), "avg": float(a.mean()), "p50": float(p50), "p90": float(p90), "p95": float(p95),
            "p99": float(p99), "max": float(a.max())}


@events.test_stop.add_listener
def _let_csv_catch_up(environment, **_kw) -> None:
    gevent.sleep(0.5)


@events.quitting.add_listener
def _write_timings(environment, **_kw) -> None:
    opts = environment.parsed_options
    if not opts or not opts.timings_out:
        return
    out = {"requests": _state["completed"], "failures": _state["failures"],
           "ttft_ms": _percentiles(_state["ttft"]), "tpot_ms": _percentiles(_state["tpot"]),
           "latency_ms": _percentiles(_state["latency"])}
    Path(opts.timings_out).write_text(json.dumps(out, indent=1) + "\n")


def _inputs(prompt: str, max_tokens: int, stream: bool) -> list:
    def tensor(name, value, dtype, triton):
        t = grpcclient.InferInput(name, [1, 1], triton)
        t.set_data_from_numpy(np.array([[value]], dtype=dtype))
        return t

    return [tensor("text_input", prompt.encode(), object, "BYTES"),
            tensor("max_tokens", max_tokens, np.int32, "INT32"),
            tensor("min_tokens", max_tokens, np.int32, "INT32"),  # exact output length (ignore EOS)
            tensor("stream", stream, bool, "BOOL")]


class TritonStreamingUser(User):
    """One gRPC stream per user; one request in flight per user (closed loop, no think time)."""

    wait_time = constant(0)
    _ids = itertools.count()

    def on_start(self) -> None:
        host = (self.host or "grpc://localhost:8001").removeprefix("grpc://")
        self.client = grpcclient.InferenceServerClient(host)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error,
                                                                                   time.perf_counter())))

    def on_stop(self) -> None:
        try:
            self.client.stop_stream()
        finally:
            self.client.close()

    def _bounded(self) -> bool:
        """True once --max-requests requests were started (the run then quits)."""
        limit = self.environment.parsed_options.max_requests
        if not limit:
            return False
        if _state["started"] >= limit:
            if _state["completed"] + _state["failures"] >= limit and not _state["quitting"]:
                _state["quitting"] = True
                self.environment.runner.quit()
            time.sleep(0.05)
            return True
        return False

    @task
    def generate(self) -> None:
        if self._bounded() or not _state["prompts"]:
            return
        opts = self.environment.parsed_options
        _state["started"] += 1
        name, prompt, max_tokens = _state["prompts"][next(self._ids) % len(_state["prompts"])]
        stream = not opts.no_stream
        request_id = f"u{id(self) % 100000}-{next(self._ids)}"
        start = time.perf_counter()
        first = last = None
        tokens = 0
        error = None
        try:
            self.client.async_stream_infer(opts.triton_model, _inputs(prompt, max_tokens, stream),
                                           request_id=request_id, enable_empty_final_response=True)
            while True:
                result, err, at = self.responses.get(timeout=opts.request_timeout)
                if err is not None:
                    error = err
                    break
                response = result.get_response()
                text = result.as_numpy("text_output")
                if text is not None and text.size and text.reshape(-1)[0]:
                    first = first or at
                    last = at
                n = result.as_numpy("num_output_tokens")
                if n is not None and n.size:
                    tokens = int(n.reshape(-1)[0])
                if response.parameters["triton_final_response"].bool_param:
                    break
        except queue.Empty:
            error = TimeoutError(f"no response within {opts.request_timeout:g} s")
        except Exception as exc:  # noqa: BLE001 - every failure is a locust failure, not a crash
            error = exc
        end = time.perf_counter()
        fire = self.environment.events.request.fire
        if error is not None:
            _state["failures"] += 1
            fire(request_type="gRPC", name=name, response_time=(end - start) * 1000, response_length=0,
                 exception=error, context={})
            return
        _state["completed"] += 1
        total_ms = (end - start) * 1000
        _state["latency"].append(total_ms)
        fire(request_type="gRPC", name=name, response_time=total_ms, response_length=tokens, exception=None,
             context={})
        if first is not None:
            ttft_ms = (first - start) * 1000
            _state["ttft"].append(ttft_ms)
            fire(request_type="TTFT", name=name, response_time=ttft_ms, response_length=0, exception=None,
                 context={})
            if tokens > 1 and last is not None and last > first:
                tpot_ms = (last - first) * 1000 / (tokens - 1)
                _state["tpot"].append(tpot_ms)
                fire(request_type="TPOT", name=name, response_time=tpot_ms, response_length=0, exception=None,
                     context={})


class BoundedShape(LoadTestShape):
    """``constant``: --shape-users users for --shape-time seconds. ``step``: --step-users more users every
    --step-time seconds up to --shape-users (step load), stopping at --shape-time."""

    def tick(self):
        opts = self.runner.environment.parsed_options
        t = self.get_run_time()
        if t >= opts.shape_time or _state["quitting"]:
            return None
        if opts.shape == "step":
            users = min(opts.shape_users, opts.step_users * (int(t // opts.step_time) + 1))
            return users, max(opts.shape_spawn_rate, float(opts.step_users))
        return opts.shape_users, opts.shape_spawn_rate
