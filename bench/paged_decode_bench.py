"""What the paged KV cache costs the decode step: the CPU engine in-process, batch-1 decode and 16 streams.

One process per measurement (as a user's server would be): ``--prompt`` tokens per request (distinct prompts), 64
greedy output tokens. Prints one JSON line; run it in two checkouts for an A/B (docs/benchmarks/prefix_cache.md,
"What paging costs", has the last pair and its command).

    python -m bench.paged_decode_bench ENGINE_DIR --prompt 700 [--label new]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.getcwd())  # the checkout it runs in, for an A/B against another one

from cpu_engine import EngineLimits, GenerationRequest, LLMEngine, SamplingParams, load_engine  # noqa: E402
from cpu_engine.threads import on_scratch_thread  # noqa: E402

NEW_TOKENS = 64


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("engine_dir")
    p.add_argument("--prompt", type=int, default=700, help="prompt tokens per request")
    p.add_argument("--label", default="this checkout")
    a = p.parse_args()
    loaded = on_scratch_thread(load_engine, a.engine_dir)  # no OpenMP pool left on this thread (threads.py)
    times: dict[str, list[float]] = {}
    done: set[str] = set()
    lock = threading.Lock()

    def on_event(event):
        with lock:
            times.setdefault(event.request_id, []).append(time.perf_counter())
            if event.finish_reason is not None:
                done.add(event.request_id)

    limits = EngineLimits.from_build(loaded.build_config, max_queue_size=256)
    engine = LLMEngine(loaded.model, limits, on_event, dtype=loaded.compute_dtype).start()

    def run(tag: str, n: int, seed: int) -> float:
        done.clear()
        times.clear()
        start = time.perf_counter()
        for i in range(n):  # distinct prompts: nothing is reused from the prefix cache across them
            prompt = [(1009 * seed + 17 * i + t) % 40000 + 100 for t in range(a.prompt)]
            engine.submit(GenerationRequest(f"{tag}{i}", prompt,
                                            max_new_tokens=NEW_TOKENS, sampling=SamplingParams(min_tokens=NEW_TOKENS)))
        while len(done) < n:
            time.sleep(0.002)
        return time.perf_counter() - start

    run("warm", 1, 0)
    b1 = []
    for r in range(5):
        run(f"b1-{r}-", 1, r + 1)
        ts = times[f"b1-{r}-0"]
        b1.append((len(ts) - 2) / (ts[-1] - ts[1]))
    wall = run("s", 16, 100)
    firsts = [v[0] for v in times.values()]
    ends = [v[-1] for v in times.values()]
    print(json.dumps({"label": a.label, "prompt": a.prompt, "b1_decode_tok_s": round(statistics.median(b1), 2),
                      "streams16_tok_s": round(16 * NEW_TOKENS / wall, 2),
                      "streams16_prefill_s": round(max(firsts) - min(firsts), 2),
                      "streams16_decode_ms_per_step": round(1e3 * (max(ends) - max(firsts)) / NEW_TOKENS, 1)}))
    engine.shutdown(10)


if __name__ == "__main__":
    main()
