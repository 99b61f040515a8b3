"""Peer: ``cpu_engine.LLMEngine`` in this process (in-flight batching), closed-loop clients."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine_bench.models import BenchModel
from bench.engine_bench.noise import MONITOR, noise_fields
from bench.engine_bench.options import Options
from bench.engine_bench.records import streams_record


@dataclass
class _Req:
    stream: int
    submitted: float
    times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    end: float = 0.0


class EngineDriver:
    """Closed-loop clients over an in-process LLMEngine: each stream submits its next request when one ends."""

    def __init__(self, engine_dir: Path):
        from cpu_engine import EngineLimits, LLMEngine, load_engine

        loaded = load_engine(engine_dir)
        self.load_s = loaded.load_seconds
        self.decode = loaded.decode.split(" (")[0].split(":")[0]  # "compiled" or "eager"
        limits = EngineLimits.from_build(loaded.build_config, max_queue_size=256)
        self.engine = LLMEngine(loaded.model, limits, on_event=self._on_event, dtype=loaded.compute_dtype).start()
        self.eos = json.loads((Path(loaded.config["source_checkpoint"]) / "config.json").read_text()).get(
            "eos_token_id", 1)
        self._reqs: dict[str, _Req] = {}
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._plan: list[list[list[int]]] = []
        self._left = 0
        self._new = 0
        self._next_id = 0

    def close(self) -> None:
        self.engine.shutdown(timeout=30)

    def _submit(self, stream: int, ids: list[int]) -> None:
        from cpu_engine import GenerationRequest, SamplingParams

        with self._lock:
            rid = f"r{self._next_id}"
            self._next_id += 1
            self._reqs[rid] = _Req(stream, time.perf_counter())
        self.engine.submit(GenerationRequest(rid, list(ids), self._new, SamplingParams(min_tokens=self._new),
                                             end_id=self.eos))

    def _on_event(self, ev) -> None:
        now = time.perf_counter()
        req = self._reqs[ev.request_id]
        if ev.token_id is not None:
            req.times.append(now)
            req.tokens.append(ev.token_id)
        if ev.finish_reason is None:
            return
        req.end = now
        plan = self._plan[req.stream]
        if plan:
            self._submit(req.stream, plan.pop(0))
        else:
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._done.set()

    def run(self, streams: int, requests_per_stream: int, prompts: list[list[int]], new: int) -> tuple[list[_Req], float]:
        self._reqs, self._new, self._done = {}, new, threading.Event()
        k = 0
        self._plan = []
        for _ in range(streams):
            mine = [prompts[(k + r) % len(prompts)] for r in range(requests_per_stream)]
            k += requests_per_stream
            self._plan.append(mine)
        self._left = streams
        start = time.perf_counter()
        for s in range(streams):
            self._submit(s, self._plan[s].pop(0))
        if not self._done.wait(timeout=1800):
            raise RuntimeError("engine run did not finish in 30 min")
        return list(self._reqs.values()), time.perf_counter() - start


def bench_engine(model: BenchModel, variant: str, engine_dir: Path, opts: Options) -> tuple[list[dict], list[list[int]]]:
    driver = EngineDriver(engine_dir)
    try:
        n, prompts = opts.new_tokens, model.prompt_ids
        driver.run(1, 1, prompts[-1:], n)  # warm-up: one whole request, then every batch shape once
        for c in sorted(set(opts.streams) | {1}):
            driver.run(c, 1, prompts, 4)
        base = {"model": model.name, "peer": "engine", "variant": variant, "load_s": driver.load_s,
                "decode": driver.decode}
        records, outputs = [], []
        mark = MONITOR.start()
        reps = []
        for i in range(opts.b1_reps):
            (req,), _ = driver.run(1, 1, [prompts[i % len(prompts)]], n)
            reps.append({"ttft_s": req.times[0] - req.submitted,
                         "decode_tok_s": (len(req.times) - 1) / (req.times[-1] - req.times[0]),
                         "tokens": len(req.tokens)})
            outputs.append(req.tokens)
        records.append({**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in reps),
                        "decode_tok_s": statistics.median(r["decode_tok_s"] for r in reps), "reps": reps,
                        **noise_fields(MONITOR.stop(mark))})
        for c in opts.streams:
            mark = MONITOR.start()
            reqs, wall = driver.run(c, opts.requests_per_stream, prompts, n)
            records.append(streams_record(base, c, reqs_ttft=[r.times[0] - r.submitted for r in reqs],
                                          tokens=sum(len(r.tokens) for r in reqs), wall=wall,
                                          noise=MONITOR.stop(mark)))
        return records, outputs
    finally:
        driver.close()
