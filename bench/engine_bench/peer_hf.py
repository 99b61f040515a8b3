"""Peer: Hugging Face ``generate``, one request at a time (fp32, and bf16 when bf16 is benchmarked)."""

from __future__ import annotations

import statistics
import time

from bench.engine_bench.models import BenchModel
from bench.engine_bench.noise import MONITOR, noise_fields
from bench.engine_bench.options import Options
from cpu_engine.threads import on_scratch_thread


class _Stamps:
    """A transformers streamer that only records when each new token arrives (first put() is the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def bench_hf(model: BenchModel, dtype_name: str, opts: Options) -> tuple[list[dict], list[list[int]]]:
    """On a scratch thread: an OpenMP pool left on this (main) thread would slow the in-process engine's thread
    measured after it (cpu_engine/threads.py)."""
    return on_scratch_thread(_bench_hf, model, dtype_name, opts)


def _bench_hf(model: BenchModel, dtype_name: str, opts: Options) -> tuple[list[dict], list[list[int]]]:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    t0 = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(str(model.checkpoint), local_files_only=True, dtype=dtype).eval()
    load_s = time.perf_counter() - t0
    n = opts.new_tokens

    def one(ids: list[int], new: int) -> tuple[list[int], dict]:
        x = torch.tensor([ids])
        stamps = _Stamps()
        start = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, streamer=stamps, pad_token_id=hf.config.pad_token_id)
        end = time.perf_counter()
        tokens = out[0, len(ids):].tolist()
        first, last = stamps.times[1], stamps.times[-1]
        return tokens, {"ttft_s": first - start, "decode_tok_s": (len(tokens) - 1) / (last - first),
                        "total_s": end - start, "tokens": len(tokens)}

    one(model.prompt_ids[-1], n)  # warm-up: a whole request (the first full-length one is slower)
    mark = MONITOR.start()
    runs, outputs = [], []
    for ids in model.prompt_ids[: opts.hf_requests]:
        tokens, r = one(ids, n)
        runs.append(r)
        outputs.append(tokens)
    noise = MONITOR.stop(mark)
    hf = None  # free the weights before the next peer
    base = {"model": model.name, "peer": "hf", "variant": dtype_name, "load_s": load_s, **noise_fields(noise)}
    total_tokens = sum(r["tokens"] for r in runs)
    total_s = sum(r["total_s"] for r in runs)
    records = [
        {**base, "mode": "b1", "ttft_ms": 1e3 * statistics.median(r["ttft_s"] for r in runs),
         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs), "reps": runs},
        # One request at a time: the aggregate rate is the same however many clients wait in line.
        {**base, "mode": "streams", "streams": 1, "agg_tok_s": total_tokens / total_s, "tokens": total_tokens,
         "wall_s": total_s, "ttft_p50_ms": 1e3 * statistics.median(r["ttft_s"] for r in runs)},
    ]
    return records, outputs
