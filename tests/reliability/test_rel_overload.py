"""Section 2 — overload: 10x the measured capacity (CI: 10 s; the 60 s run is scripts/overload.py).

A dedicated server with 2 KV slots and an LLM queue of 4, so capacity is small and overload is cheap to
offer from one Python client. Requests beyond the queue bound must be refused at once with UNAVAILABLE
("request queue is full"), accepted ones must complete, the server must not crash and its memory must stay
bounded (RSS of the process tree from /proc). While the llm's queue is full, preprocessing refuses at the ensemble's
entry, before tokenising (serving/queue_full.py): most of the overload never reaches the llm.
"""

from __future__ import annotations

import json
import time

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import InferRequestedOutput

from client import GenerationError, LLMClient, SamplingParams
from serving.health import probe
from serving.prometheus import fetch, total
from serving.queue_full import QueueFullFlag
from tests.reliability import relkit
from tests.triton_helpers import text_inputs

SLOTS, LLM_QUEUE, MAX_TOKENS = 2, 4, 96
PREPROCESSING_INSTANCES = 1  # tests/stack.py's profile


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    work = tmp_path_factory.mktemp("overload")
    engine = relkit.build_engine(tiny_checkpoint, work / "engine", max_batch_size=SLOTS)
    repo = relkit.render(work / "repo", engine, tiny_checkpoint, llm_queue=LLM_QUEUE)
    server = relkit.start_server(repo, work, exit_timeout_secs=10, name="overload")
    yield server
    server.stop()


def requests_to(metrics_url: str) -> dict[str, float]:
    """Requests each model of the ensemble has answered, refusals included (Triton's counters)."""
    samples = fetch(metrics_url)
    return {model: total(samples, "nv_inference_request_success", model=model)
            + total(samples, "nv_inference_request_failure", model=model) for model in ("preprocessing", "llm")}


def test_ten_times_capacity_is_refused_fast_and_the_rest_completes(server):
    before = requests_to(server.urls.metrics)
    result = relkit.overload(server, factor=10, duration_s=10, max_tokens=MAX_TOKENS, slots=SLOTS)
    after = requests_to(server.urls.metrics)
    r = result["report"]
    seen = {model: after[model] - before[model] for model in after}
    print("\noverload:", json.dumps(r), "requests seen by each model:", seen)
    assert r["live_after"]
    assert r.get("n_error", 0) == 0 and r.get("n_timeout", 0) == 0, r["errors"]  # accepted ones complete
    assert r.get("n_rejected", 0) >= r["requests"] * 0.5  # most of the 10x is refused...
    # ...at once, not after waiting for a slot (60 s run, quiet machine: p50 7.5 ms, p99 83 ms; the bounds leave
    # room for a shared 2-core CI box, where the client itself sends ~200 requests/s)
    assert r["reject_p50_ms"] < 100 and r["reject_p99_ms"] < 1000
    # ...by the ensemble's entry: the llm saw its queue's and slots' worth and what raced the queue-full byte, a
    # fraction of what preprocessing saw (a plain tritonserver, without the launcher's file, has the llm see all).
    assert seen["llm"] < 0.5 * seen["preprocessing"], seen
    # ...and the server keeps working at capacity meanwhile: requests waiting in (nearly) every once-a-second sample,
    # and both slots in use. Not "both slots busy in every sample": a slot freed by a finished request is filled at
    # the engine's next step, and a CI run's sample caught that moment twice in 9 (1 active, 4 queued). Its completion
    # rate is only a floor: on 2 cores the load generator takes CPU from the engine (60 s run, docs/reliability.md:
    # 5.7 completed per s against the 10.4 measured without it).
    during = [row for row in result["samples"] if 1 <= row["t"] <= 10 and row["active"] is not None]
    waiting = [row for row in during if row["queued"] >= 1]
    assert len(during) >= 5 and len(waiting) >= 0.8 * len(during), result["samples"]
    assert max(row["active"] for row in during) == SLOTS, result["samples"]
    assert r["completed_rps"] >= 0.3 * r["capacity_rps"]
    assert r["rss_peak_mib"] - r["rss_baseline_mib"] < 200  # memory bounded
    after = relkit.idle(server.urls.metrics, timeout=30)
    assert after.active == 0 and after.queued == 0


def test_a_full_llm_queue_is_refused_at_the_entry_while_tokenize_and_probes_still_answer(server):
    """The llm's byte set by hand (no load: nothing flips it back): what an overload's refusals look like."""
    flag = QueueFullFlag(str(server.state_dir / "queue-full"))
    before = requests_to(server.urls.metrics)
    flag.publish(0, True)
    try:
        outcomes, started = [], time.monotonic()
        with LLMClient(server.urls.grpc) as client:
            for _ in range(8):
                try:
                    outcomes.append(client.generate("def f(x):", SamplingParams(max_tokens=4)).text)
                except GenerationError as exc:
                    outcomes.append(str(exc))
        # Each preprocessing instance lets one request a second through to the llm (a byte left by a dead stub must
        # not refuse everything); this idle llm serves those. The rest are refused at the entry.
        refused = [o for o in outcomes if "request queue is full" in o]
        seconds = time.monotonic() - started
        assert len(refused) >= len(outcomes) - PREPROCESSING_INSTANCES * (int(seconds) + 1), (seconds, outcomes)
        tokenizer = grpcclient.InferenceServerClient(server.urls.grpc)
        ids = tokenizer.infer("preprocessing", text_inputs("def f(x):", 1), outputs=[InferRequestedOutput("input_ids")])
        assert ids.as_numpy("input_ids").size > 0  # a direct call asks for one output: it is not bound for the llm
        assert probe(server.urls.grpc).ok  # a liveness probe passes the entry (and the llm's admission)
        seen = {model: count - before[model] for model, count in requests_to(server.urls.metrics).items()}
        let_through = len(outcomes) - len(refused)
        assert seen == {"preprocessing": len(outcomes) + 2, "llm": let_through + 1}, seen
    finally:
        flag.publish(0, False)
    with LLMClient(server.urls.grpc) as client:
        assert client.generate("def f(x):", SamplingParams(max_tokens=4)).text
