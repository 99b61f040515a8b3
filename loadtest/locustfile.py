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
import queue
import random
import time

from locust import User, constant, events, task  # noqa: I001 - locust first (gevent patching)

import grpc.experimental.gevent as grpc_gevent  # noqa: E402

grpc_gevent.init_gevent()

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from loadtest.locust_common import STATE, BoundedShape, bounded, record  # noqa: E402, F401 - locust finds the shape

MIX = (  # (name, weight, prompt tokens, output tokens): the --mix workload
    ("short", 3, 32, 24),
    ("long", 1, 256, 64),
)


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    g = parser.add_argument_group("triton")
    g.add_argument("--triton-model", default="ensemble")
    g.add_argument("--mix", action="store_true", help="3 short (32->24) : 1 long (256->64) prompts")


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
    STATE["prompts"] = prompts


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

    @task
    def generate(self) -> None:
        if bounded(self.environment) or not STATE["prompts"]:
            return
        opts = self.environment.parsed_options
        STATE["started"] += 1
        name, prompt, max_tokens = STATE["prompts"][next(self._ids) % len(STATE["prompts"])]
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
        record(self.environment, "gRPC", name, start, time.perf_counter(), first, last, tokens, error)
