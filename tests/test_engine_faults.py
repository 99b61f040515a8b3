"""A failure inside the CPU engine's loop ends the sequences it belongs to with FinishReason.ERROR, frees their slots
and never stops the engine: the other requests, and every later one, are served as if nothing had happened.

Faults come in through the engine's public inputs: a request's guide (grammar matcher), its is_cancelled
callback, the on_event callback, and the model (a forward hook on its embedding, torch's public API). Through a
real tritonserver, on both layouts, the fault is a broken engine directory (one that loads but whose every step
fails), so no test-only hook is needed in the served code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import time
import urllib.error
import urllib.request

import psutil
import pytest
from safetensors.torch import load_file, save_file

from builders.trtllm.standin import LAYOUTS, render_layout
from client import AsyncLLMClient, GenerationError, LLMClient, SamplingParams
from cpu_engine import FinishReason, GenerationRequest
from serving.launcher import ServerConfig, TritonServer
from serving.prometheus import fetch, total
from tests.openai_front import FrontDoorProcess
from tests.test_engine import EngineHold, start_engine
from tests.test_engine_features import Collector
from tests.triton_helpers import wait_for

PROMPT = [0, 10, 20, 30, 10, 40]
OTHER = [5, 6, 7, 8]


class Broken(RuntimeError):
    pass


class FaultyGuide:
    """Allows every token; its matcher raises in ``where`` ("matcher", "fill" or "accept") once ``after`` tokens
    have been accepted."""

    def __init__(self, where: str, after: int = 0):
        self.where, self.after = where, after

    def matcher(self, end_id=None):
        if self.where == "matcher":
            raise Broken("no matcher for this guide")
        return FaultyMatcher(self.where, self.after)


class FaultyMatcher:
    def __init__(self, where, after):
        self.where, self.after, self.accepted = where, after, 0

    def _check(self, where):
        if where == self.where and self.accepted >= self.after:
            raise Broken(f"{where} broke after {self.accepted} tokens")

    def fill(self, bitmask, row):
        self._check("fill")

    def accept(self, token):
        self._check("accept")
        self.accepted += 1
        return True

    def finished(self):
        return False


def alone(engine_dir, request):
    """The request's tokens when it runs on its own."""
    collector = Collector()
    engine = start_engine(engine_dir, collector)
    engine.submit(request)
    collector.wait(1)
    engine.shutdown(10)
    return collector.tokens(request.request_id)


def assert_idle(engine, slots):
    """Slots are released before a sequence's last event goes out, so this holds once the events are in."""
    assert engine.active == 0 and engine.queued == 0 and engine.kv_occupancy == 0
    assert engine.slots.free == slots


def last_event(collector, rid, index=0):
    return collector.events[(rid, index)][-1]


@pytest.mark.parametrize("where", ["fill", "accept"])
def test_a_failing_grammar_ends_its_request_alone(engine_dir, where, caplog):
    healthy = alone(engine_dir, GenerationRequest("good", OTHER, max_new_tokens=30))
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=4)
    with caplog.at_level(logging.ERROR, logger="cpu_engine.engine"):
        engine.submit(GenerationRequest("bad", PROMPT, max_new_tokens=30, guide=FaultyGuide(where, after=3)))
        engine.submit(GenerationRequest("good", OTHER, max_new_tokens=30))
        collector.wait(2)
        bad = last_event(collector, "bad")
        assert bad.finish_reason == FinishReason.ERROR and bad.token_id is None
        assert bad.error == f"Broken: {where} broke after 3 tokens"
        assert len(collector.tokens("bad")) == 3  # the tokens before the fault; the failing step's is dropped
        # The healthy request shared every step with it and finished as it does alone.
        assert collector.tokens("good") == healthy
        assert last_event(collector, "good").finish_reason == FinishReason.LENGTH
        engine.submit(GenerationRequest("later", OTHER, max_new_tokens=30))
        collector.wait(3)
    assert collector.tokens("later") == healthy and last_event(collector, "later").finish_reason == FinishReason.LENGTH
    assert_idle(engine, 4)
    engine.shutdown(10)
    failures = [r for r in caplog.records if r.name == "cpu_engine.engine"]
    assert len(failures) == 1 and "bad" in failures[0].getMessage() and failures[0].exc_info[0] is Broken


def test_a_guide_without_matcher_ends_all_n_sequences(engine_dir):
    collector = Collector()
    engine = start_engine(engine_dir, collector, max_batch_size=4)
    engine.submit(GenerationRequest("bad", PROMPT, max_new_tokens=8, guide=FaultyGuide("matcher"),
                                    num_return_sequences=3))
    engine.submit(GenerationRequest("good", OTHER, max_new_tokens=8))
    collector.wait(4)
    for i in range(3):
        event = last_event(collector, "bad", i)
        assert event.finish_reason == FinishReason.ERROR and event.error == "Broken: no matcher for this guide"
    assert last_event(collector, "good").finish_reason == FinishReason.LENGTH
    assert_idle(engine, 4)
    engine.shutdown(10)


def test_a_failing_model_step_ends_its_sequences_without_spinning(engine_dir, caplog):
    healthy = alone(engine_dir, GenerationRequest("after", OTHER, max_new_tokens=12))
    collector = Collector()
    hold = EngineHold(collector, after=6)  # a few tokens of the three sequences of a and b
    engine = start_engine(engine_dir, hold, max_batch_size=4)
    broken = threading.Event()
    forwards = []

    def hook(_module, _args, _out):
        forwards.append(1)
        if broken.is_set():
            raise Broken("the model failed")

    engine.model.embed_tokens.register_forward_hook(hook)
    with caplog.at_level(logging.ERROR, logger="cpu_engine.engine"):
        engine.submit(GenerationRequest("a", PROMPT, max_new_tokens=200))
        engine.submit(GenerationRequest("b", OTHER, max_new_tokens=200, num_return_sequences=2))
        hold.wait_holding()
        broken.set()  # every step fails from now on: a broken model
        # n = 3 needs all four slots, so it is still waiting: it fails at its prefill, its unborn sequences with it.
        engine.submit(GenerationRequest("c", PROMPT, max_new_tokens=10, num_return_sequences=3))
        hold.release()
        collector.wait(6)
        assert collector.finished() == {(rid, i): FinishReason.ERROR for rid, n in (("a", 1), ("b", 2), ("c", 3))
                                        for i in range(n)}
        assert all(last_event(collector, *key).error == "Broken: the model failed" for key in collector.finished())
        assert_idle(engine, 4)
        seen = len(forwards)
        time.sleep(0.2)
        assert len(forwards) == seen, "the engine keeps stepping with nothing to run"
    # One log record per failing step (a and b together, then c), each with its traceback.
    failures = [r for r in caplog.records if r.name == "cpu_engine.engine"]
    assert len(failures) == 2 and all(r.exc_info[0] is Broken for r in failures)
    broken.clear()  # repaired: the engine serves again
    engine.submit(GenerationRequest("after", OTHER, max_new_tokens=12))
    collector.wait(7)
    assert collector.tokens("after") == healthy and last_event(collector, "after").finish_reason == FinishReason.LENGTH
    assert_idle(engine, 4)
    engine.shutdown(10)


def test_a_failing_callback_ends_only_its_request(engine_dir):
    healthy = alone(engine_dir, GenerationRequest("good", OTHER, max_new_tokens=20))
    collector = Collector()
    calls = {"bad": 0}

    def on_event(event):
        if event.request_id == "bad" and event.token_id is not None:
            calls["bad"] += 1
            if calls["bad"] == 4:  # the consumer fails on one token event
                raise Broken("the consumer failed")
        collector(event)

    engine = start_engine(engine_dir, on_event, max_batch_size=1, max_queue_size=4)

    def is_cancelled():
        raise Broken("is_cancelled failed")

    engine.submit(GenerationRequest("bad", PROMPT, max_new_tokens=20))
    engine.submit(GenerationRequest("good", OTHER, max_new_tokens=20))
    # Waiting behind both (one slot): its own callback fails while it waits.
    engine.submit(GenerationRequest("waiting", OTHER, max_new_tokens=20, is_cancelled=is_cancelled))
    collector.wait(3)
    assert last_event(collector, "bad").error == "Broken: the consumer failed"
    assert last_event(collector, "waiting").error == "Broken: is_cancelled failed"
    assert collector.tokens("waiting") == []
    assert collector.tokens("good") == healthy and last_event(collector, "good").finish_reason == FinishReason.LENGTH
    assert_idle(engine, 1)
    engine.shutdown(10)


# ---- through Triton -------------------------------------------------------------------------------------------

def broken_engine(engine_dir, out):
    """A copy of the engine that says it has 3 query heads over 2 KV heads (its q/o projections cut to match):
    it loads, and every forward fails in attention — a mis-converted checkpoint."""
    shutil.copytree(engine_dir, out)
    config = json.loads((out / "config.json").read_text())
    pc = config["pretrained_config"]
    pc["num_attention_heads"] = 3
    width = 3 * pc["head_size"]
    state = load_file(out / "rank0.safetensors")
    for name in state:
        if name.endswith("q_proj.weight"):
            state[name] = state[name][:width].contiguous()
        elif name.endswith("o_proj.weight"):
            state[name] = state[name][:, :width].contiguous()
    save_file(state, out / "rank0.safetensors")
    (out / "config.json").write_text(json.dumps(config))
    return out


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("which", LAYOUTS)
def test_a_broken_engine_answers_each_request_with_an_error(which, test_profile, engine_dir, tmp_path):
    profile = test_profile.model_copy(update={"engine_dir": broken_engine(engine_dir, tmp_path / "broken")})
    log = tmp_path / "tritonserver.log"
    config = ServerConfig(model_repository=render_layout(which, profile, tmp_path / "repo"), http_port=0, grpc_port=0,
                          metrics_port=0, exit_timeout_secs=10, log_file=log)
    cause = "Number of heads in key and value must divide"
    message = "Executor failed process requestId" if which == "trtllm-standin" else \
        "the engine failed while generating this request"
    with TritonServer(config, ready_timeout=240) as server:
        stubs = psutil.Process(server.process.pid).children()
        assert stubs and all(p.cmdline()[0].endswith("/triton_python_backend_stub") for p in stubs)

        async def burst():  # together, so they share the failing steps: one streamed, one of n = 2 sequences
            async with AsyncLLMClient(server.urls.grpc) as client:
                async def streamed():
                    return [delta async for delta in client.stream("x = 3", SamplingParams(max_tokens=8))]

                return await asyncio.gather(
                    client.generate("x = 0", SamplingParams(max_tokens=8)),
                    client.generate("x = 1", SamplingParams(max_tokens=8)),
                    client.generate_n("x = 2", SamplingParams(max_tokens=8, n=2, temperature=1.0)),
                    streamed(), return_exceptions=True)

        for error in asyncio.run(burst()):
            assert isinstance(error, GenerationError) and message in str(error) and cause in str(error), error
        with LLMClient(server.urls.grpc) as client, pytest.raises(GenerationError, match=cause):
            client.generate("def f():", SamplingParams(max_tokens=4))  # a later request: answered, not hung
        metrics = server.urls.metrics
        wait_for(lambda: total(fetch(metrics), "llm_requests_finished_total", reason="error") == 5,
                 what="five requests counted as errors")
        wait_for(lambda: total(fetch(metrics), "llm_engine_active_slots") == 0, what="slots freed")
        assert total(fetch(metrics), "llm_engine_queued_requests") == 0
        door = FrontDoorProcess(server.urls.grpc)
        try:
            model = json.load(urllib.request.urlopen(door.v1 + "/models", timeout=30))["data"][0]["id"]
            for stream in (False, True):
                body = json.dumps({"model": model, "prompt": "def f():", "max_tokens": 4, "stream": stream})
                request = urllib.request.Request(door.v1 + "/completions", body.encode(),
                                                 {"Content-Type": "application/json"})
                with pytest.raises(urllib.error.HTTPError) as failed:
                    urllib.request.urlopen(request, timeout=60)
                error = json.loads(failed.value.read())["error"]
                assert failed.value.code == 500 and error["code"] == "engine_error" and cause in error["message"]
        finally:
            door.stop()
    text = log.read_text("utf-8", "replace")
    assert "engine: ending" in text and "Traceback" in text and cause in text
    # The GPU layout's wrapper stub can hang at exit after a stream that ended in an error (docs/gpu.md, "Open"):
    # the launcher ends what tritonserver left behind.
    assert not [p.pid for p in stubs if alive(p)]
