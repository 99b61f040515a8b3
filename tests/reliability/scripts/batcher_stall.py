"""Finding B12 (docs/reliability.md): how long requests wait in each model's queue under a burst, from Triton's trace.

A server with one KV slot and an llm queue of 1 gets ``--rounds`` bursts of ``--burst`` requests of 200 tokens (most
of each burst is refused by the llm's queue, as in test_serving_engine's full-queue test). Triton's trace
(level=TIMESTAMPS) gives every model request's QUEUE_START → COMPUTE_START; the table counts waits over 400 ms, the
signature of Triton 2.51's dynamic batcher stalling for its 500 ms idle timeout. Compare:

    python tests/reliability/scripts/batcher_stall.py --batcher-queue 128  # bounded, as the profiles have it
    python tests/reliability/scripts/batcher_stall.py --batcher-queue 0    # a dynamic batcher, unbounded queue
    python tests/reliability/scripts/batcher_stall.py                      # no batcher
"""

from __future__ import annotations

import asyncio
import collections
import json
import statistics

from _common import parser

from tests.reliability import relkit


async def burst(grpc_url: str, n: int) -> None:
    from client import AsyncLLMClient, GenerationError, SamplingParams

    async with AsyncLLMClient(grpc_url) as client:
        async def one():
            try:
                await client.generate("def f():", SamplingParams(max_tokens=200))
            except GenerationError:
                pass  # refused by the llm's full queue: the wait being measured is before that
        await asyncio.gather(*(one() for _ in range(n)))


def queue_waits_ms(trace_files) -> dict[str, list[float]]:
    """Per model: QUEUE_START → COMPUTE_START of every traced request (Triton writes an event per timestamp)."""
    spans: dict[int, dict] = collections.defaultdict(dict)
    for path in trace_files:
        for event in json.loads(path.read_text()):
            span = spans[event["id"]]
            span.update({k: event[k] for k in ("model_name",) if k in event})
            span.update({t["name"]: t["ns"] for t in event.get("timestamps", [])})
    waits: dict[str, list[float]] = collections.defaultdict(list)
    for span in spans.values():
        if "COMPUTE_START" in span and "QUEUE_START" in span:
            waits[span["model_name"]].append((span["COMPUTE_START"] - span["QUEUE_START"]) / 1e6)
    return waits


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--instances", type=int, default=1, help="preprocessing instances")
    ap.add_argument("--batcher-queue", type=int, default=None,
                    help="give preprocessing a dynamic batcher with this max_queue_size (0: unbounded)")
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    from builders.profile import DynamicBatcher, LLMStage, Stage
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer
    from tests.stack import stack_profile

    batcher = None if a.batcher_queue is None else DynamicBatcher(max_queue_size=a.batcher_queue)
    work = a.workdir / f"batcher-stall-{a.instances}-{a.batcher_queue}"
    checkpoint, engine = relkit.build_tiny_stack(a.workdir, {"max_batch_size": 1})
    profile = stack_profile(engine, checkpoint).model_copy(update={
        "preprocessing": Stage(instances=a.instances, batcher=batcher),
        "llm": LLMStage(max_queue_size=1, cpu_threads=1)})
    repo = render_repository(profile, work / "model_repository")
    trace = work / "trace.json"
    for old in work.glob("trace.json*"):
        old.unlink()
    flags = [f"--trace-config=triton,file={trace}", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
             "--trace-config=count=-1", "--trace-config=log_frequency=1"]
    config = ServerConfig(repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=work / "tritonserver.log", extra_args=flags)
    with TritonServer(config, ready_timeout=240) as server:
        for _ in range(a.rounds):
            asyncio.run(burst(server.urls.grpc, a.burst))
    waits = queue_waits_ms(sorted(work.glob("trace.json*")))
    print(f"preprocessing: {a.instances} instance(s), dynamic batcher {batcher}; {a.rounds} bursts of {a.burst}")
    print(f"{'model':>14} {'requests':>9} {'p50 ms':>8} {'max ms':>8} {'> 400 ms':>9}")
    for model in ("preprocessing", "llm"):
        w = waits.get(model, [])
        if w:
            print(f"{model:>14} {len(w):>9} {statistics.median(w):>8.1f} {max(w):>8.1f} {sum(x > 400 for x in w):>9}")


if __name__ == "__main__":
    main()
