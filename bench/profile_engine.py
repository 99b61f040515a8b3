"""Where an engine step's time goes: model forward vs the Python around it, and which ops inside the forward.

    python -m bench.profile_engine build/bench/engines/llama-100m-int8_wo --streams 1 --new-tokens 64
    py-spy record -r 250 -f raw -o /tmp/engine.txt -- .venv/bin/python -m bench.profile_engine ENGINE_DIR

Measurement only: the engine is used as it is; its step and forward are timed by wrapping them from outside.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path


def kernel_bandwidth(engine_dir: Path, reps: int = 20) -> None:
    """Every decoder projection of the engine's model once per 'step', M = 1 row, weights cold (the whole set is
    larger than the caches), for fp32 / bf16 F.linear and int8 ``_weight_int8pack_mm``: effective GB/s of weights."""
    import torch
    import torch.nn.functional as F

    from cpu_engine import read_config

    pc = read_config(engine_dir)["pretrained_config"]
    h, i, kv = pc["hidden_size"], pc["intermediate_size"], pc["num_key_value_heads"] * pc["head_size"]
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * pc["num_hidden_layers"]
    params = sum(n * k for n, k in shapes)
    for rows in (1, 16):
        w32 = [torch.randn(n, k) * 0.02 for n, k in shapes]
        wbf = [w.bfloat16() for w in w32]
        wq = [(torch.randint(-127, 127, w.shape, dtype=torch.int8), torch.rand(w.shape[0], dtype=torch.bfloat16))
              for w in w32]
        xs = {k: torch.randn(rows, k) for k in (h, i)}
        xb = {k: v.bfloat16() for k, v in xs.items()}
        cases = {
            "fp32 F.linear": (lambda: [F.linear(xs[w.shape[1]], w) for w in w32], 4),
            "bf16 F.linear": (lambda: [F.linear(xb[w.shape[1]], w) for w in wbf], 2),
            "int8 _weight_int8pack_mm": (lambda: [torch._weight_int8pack_mm(xb[q.shape[1]], q, s) for q, s in wq], 1),
        }
        for name, (fn, nbytes) in cases.items():
            fn()
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            ms = 1e3 * (time.perf_counter() - t) / reps
            print(f"  {rows:>2} row(s), {name:<26} {len(shapes)} projections ({params / 1e6:.0f}M weights): "
                  f"{ms:6.2f} ms/step = {params * nbytes / ms / 1e6:5.1f} GB/s of weights")


def thread_ab(engine_dir: Path, rounds: int = 8) -> None:
    """The same M = 1 projections timed in the main thread and in a fresh worker thread (where the engine runs its
    model), alternating; min and median over rounds, so other processes' noise affects both sides alike."""
    import threading

    import torch
    import torch.nn.functional as F

    from cpu_engine import read_config

    pc = read_config(engine_dir)["pretrained_config"]
    h, i, kv = pc["hidden_size"], pc["intermediate_size"], pc["num_key_value_heads"] * pc["head_size"]
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)] * pc["num_hidden_layers"]
    wq = [(torch.randint(-127, 127, (n, k), dtype=torch.int8), torch.rand(n, dtype=torch.bfloat16)) for n, k in shapes]
    wb = [torch.randn(n, k).bfloat16() for n, k in shapes]
    w32 = [torch.randn(n, k) for n, k in shapes]
    xb = {k: torch.randn(1, k).bfloat16() for k in (h, i)}
    x32 = {k: v.float() for k, v in xb.items()}
    cases = {"int8 _weight_int8pack_mm": lambda: [torch._weight_int8pack_mm(xb[q.shape[1]], q, s) for q, s in wq],
             "bf16 F.linear": lambda: [F.linear(xb[w.shape[1]], w) for w in wb],
             "fp32 F.linear": lambda: [F.linear(x32[w.shape[1]], w) for w in w32]}
    times: dict[str, list[float]] = defaultdict(list)

    def run(key, fn):
        fn()
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times[key].append(1e3 * (time.perf_counter() - t))

    for _ in range(rounds):
        for name, fn in cases.items():
            run((name, "main thread"), fn)
            th = threading.Thread(target=run, args=((name, "worker thread"), fn))
            th.start()
            th.join()
    for (name, where), v in times.items():
        v.sort()
        print(f"  {name:<26} {where:<13} min {v[0]:6.2f} ms  median {v[len(v) // 2]:6.2f} ms per step of projections")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.profile_engine")
    p.add_argument("engine_dir", type=Path)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--torch-profile", action="store_true", help="also profile ops of a few decode steps")
    p.add_argument("--kernels", action="store_true", help="also time the projections' kernels alone (cold weights)")
    p.add_argument("--thread-ab", action="store_true",
                   help="also time the projections in the main thread vs a worker thread (where the engine runs)")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    from bench.engine_bench.peer_engine import EngineDriver
    from bench.workload import make_prompts
    from cpu_engine import load_engine, read_config
    from cpu_engine.engine import LLMEngine

    ckpt = Path(read_config(a.engine_dir)["source_checkpoint"])
    _, prompt_ids = make_prompts(ckpt, 48, 16)
    driver = EngineDriver(a.engine_dir)
    engine: LLMEngine = driver.engine
    steps: list[float] = []
    forwards: dict[int, list[float]] = defaultdict(list)  # rows in the call → seconds
    orig_step, orig_forward = engine._step, engine.model.forward

    prof = {"on": False, "left": 0, "ctx": None}

    def step():
        if prof["on"] and prof["ctx"] is None:  # the profiler runs in the engine thread, around whole steps
            from torch.profiler import ProfilerActivity, profile

            prof["ctx"] = profile(activities=[ProfilerActivity.CPU])
            prof["ctx"].__enter__()
        t = time.perf_counter()
        orig_step()
        steps.append(time.perf_counter() - t)
        if prof["ctx"] is not None:
            prof["left"] -= 1
            if prof["left"] == 0:
                prof["ctx"].__exit__(None, None, None)
                prof["on"] = False

    def forward(tokens, *args, **kw):
        t = time.perf_counter()
        out = orig_forward(tokens, *args, **kw)
        forwards[tokens.shape[0] * tokens.shape[1]].append(time.perf_counter() - t)
        return out

    class TimedCompiled:  # decode batches the compiled step fits go to it, not to forward
        def __init__(self, inner):
            self.inner, self.max_rows = inner, inner.max_rows

        def __call__(self, tokens, *args):
            t = time.perf_counter()
            out = self.inner(tokens, *args)
            forwards[tokens.shape[0] * tokens.shape[1]].append(time.perf_counter() - t)
            return out

    engine._step = step
    engine.model.forward = forward
    if engine.model.compiled_decode is not None:
        engine.model.compiled_decode = TimedCompiled(engine.model.compiled_decode)
    driver.run(a.streams, 1, prompt_ids, 8)  # warm-up
    steps.clear()
    forwards.clear()
    reqs, wall = driver.run(a.streams, 1, prompt_ids, a.new_tokens)
    tokens = sum(len(r.tokens) for r in reqs)
    decode_rows = a.streams
    dec = forwards.get(decode_rows, [])
    total_fwd = sum(sum(v) for v in forwards.values())
    print(f"engine {a.engine_dir.name} (decode step {driver.decode}): {a.streams} stream(s) x {a.new_tokens} "
          f"tokens: {tokens / wall:.1f} tok/s, {len(steps)} steps, wall {wall:.2f} s")
    print(f"  step   mean {1e3 * statistics.fmean(steps):.2f} ms   (sum {sum(steps):.2f} s)")
    print(f"  forward calls {sum(len(v) for v in forwards.values())}, sum {total_fwd:.2f} s "
          f"= {100 * total_fwd / sum(steps):.0f}% of step time; outside forward: "
          f"{1e3 * (sum(steps) - total_fwd) / len(steps):.2f} ms/step")
    if dec:
        print(f"  decode forward ({decode_rows} rows): median {1e3 * statistics.median(dec):.2f} ms over {len(dec)} calls")
    loaded = load_engine(a.engine_dir)
    weight_bytes = sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
    print(f"  weights in memory: {weight_bytes / 1e6:.0f} MB -> at 45 GB/s a decode step reads them in "
          f"{1e3 * weight_bytes / 45e9:.2f} ms (upper bound {45e9 / weight_bytes:.0f} steps/s)")
    del loaded

    if a.torch_profile:
        prof.update(on=True, left=10)  # 10 steps, after the prompts are in: decode steps only
        steps.clear()
        driver.run(a.streams, 1, [ids[:2] for ids in prompt_ids], 12)
        step_ms = 1e3 * sum(steps[:10])
        table = prof["ctx"].key_averages()
        gemm_keys = {"aten::mm", "aten::addmm", "aten::bmm", "aten::_weight_int8pack_mm", "aten::_int_mm"}
        gemm = sum(e.self_cpu_time_total for e in table if e.key in gemm_keys) / 1e3
        in_ops = sum(e.self_cpu_time_total for e in table) / 1e3
        calls = sum(e.count for e in table)
        print(f"torch profiler, 10 decode steps ({step_ms:.1f} ms of steps): matmul kernels {gemm:.1f} ms, "
              f"all other aten ops {in_ops - gemm:.1f} ms, outside any op (Python, dispatch) "
              f"{step_ms - in_ops:.1f} ms; {calls / 10:.0f} aten calls per step")
        print(table.table(sort_by="self_cpu_time_total", row_limit=16))
    driver.close()
    if a.kernels:
        print("kernels alone:")
        kernel_bandwidth(a.engine_dir)
    if a.thread_ab:
        print("main thread vs worker thread, 1 row:")
        thread_ab(a.engine_dir)


if __name__ == "__main__":
    main()
