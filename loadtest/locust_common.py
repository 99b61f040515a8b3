"""What both locust users share (loadtest/locustfile.py: gRPC; loadtest/locustfile_openai.py: HTTP + SSE): the
common options, the run's state, the --max-requests bound, how one request becomes locust statistics (the whole
request, TTFT, TPOT) plus exact percentiles for ``--timings-out``, and the bounded load shape.

Imported by the locustfiles after ``locust`` (gevent's monkey-patching comes first); importing it registers the
listeners below once per process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gevent
import locust.stats
import numpy as np
from locust import LoadTestShape, events

# locust rewrites its --csv files every CSV_STATS_INTERVAL_SEC and not at exit: write often, and give the writer
# a moment after the test stops (below), so the CSV holds every request, like the HTML report.
locust.stats.CSV_STATS_INTERVAL_SEC = 0.2

STATE: dict = {"prompts": [], "started": 0, "completed": 0, "ttft": [], "tpot": [], "latency": [],
               "failures": 0, "quitting": False, "model": None}


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("load")
    g.add_argument("--prompt-tokens", type=int, default=64)
    g.add_argument("--max-tokens", type=int, default=32)
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
    out = {"requests": STATE["completed"], "failures": STATE["failures"]}
    if STATE["model"] is not None:
        out["model"] = STATE["model"]
    out.update(ttft_ms=_percentiles(STATE["ttft"]), tpot_ms=_percentiles(STATE["tpot"]),
               latency_ms=_percentiles(STATE["latency"]))
    Path(opts.timings_out).write_text(json.dumps(out, indent=1) + "\n")


def bounded(environment) -> bool:
    """True once --max-requests requests were started (the run then quits when they are all done)."""
    limit = environment.parsed_options.max_requests
    if not limit:
        return False
    if STATE["started"] >= limit:
        if STATE["completed"] + STATE["failures"] >= limit and not STATE["quitting"]:
            STATE["quitting"] = True
            environment.runner.quit()
        time.sleep(0.05)
        return True
    return False


def record(environment, request_type: str, name: str, start: float, end: float, first: float | None,
           last: float | None, tokens: int, error: BaseException | None) -> None:
    """One request as locust statistics: ``request_type`` (the whole request), ``TTFT`` and ``TPOT``."""
    fire = environment.events.request.fire
    total_ms = (end - start) * 1000
    if error is not None:
        STATE["failures"] += 1
        fire(request_type=request_type, name=name, response_time=total_ms, response_length=0, exception=error,
             context={})
        return
    STATE["completed"] += 1
    STATE["latency"].append(total_ms)
    fire(request_type=request_type, name=name, response_time=total_ms, response_length=tokens, exception=None,
         context={})
    if first is not None:
        ttft_ms = (first - start) * 1000
        STATE["ttft"].append(ttft_ms)
        fire(request_type="TTFT", name=name, response_time=ttft_ms, response_length=0, exception=None, context={})
        if tokens > 1 and last is not None and last > first:
            tpot_ms = (last - first) * 1000 / (tokens - 1)
            STATE["tpot"].append(tpot_ms)
            fire(request_type="TPOT", name=name, response_time=tpot_ms, response_length=0, exception=None,
                 context={})


class BoundedShape(LoadTestShape):
    """``constant``: --shape-users users for --shape-time seconds. ``step``: --step-users more users every
    --step-time seconds up to --shape-users (step load), stopping at --shape-time."""

    def tick(self):
        opts = self.runner.environment.parsed_options
        t = self.get_run_time()
        if t >= opts.shape_time or STATE["quitting"]:
            return None
        if opts.shape == "step":
            users = min(opts.shape_users, opts.step_users * (int(t // opts.step_time) + 1))
            return users, max(opts.shape_spawn_rate, float(opts.step_users))
        return opts.shape_users, opts.shape_spawn_rate
