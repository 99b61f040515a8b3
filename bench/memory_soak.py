"""Memory of the served ``llm`` after many mixed requests, against the goal RSS ≤ weights + KV pool + 250 MB.

Serves the default profile (builders/profiles/cpu.yaml: what ``make serve`` serves) from a real tritonserver and sends
``--requests`` requests from 16 concurrent gRPC clients, a seeded mix of what users send: short chats streamed,
~500-token documents answered in one response, ~2,500-token documents (long prompts, the KV pool's worst case),
two sampled answers at once (``n = 2``), and streams abandoned after a few tokens. The llm process's RSS is sampled
throughout; at the end its memory map is broken down (the weights and KV pool are anonymous memory; torch's
libraries are file-backed) so that what stands above the goal has a name.

    python -m bench.memory_soak                 # 1,000 requests, ~10 min on 2 cores: docs/benchmarks/memory.{md,json,png}
    python -m bench.memory_soak --requests 200  # a quicker look, report in build/bench/memory/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import threading
import time
from pathlib import Path

from tqdm import tqdm

from bench.engine_bench.models import say
from bench.engine_bench.noise import MONITOR

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILE = PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml"
LLM = "python stub: llm"
OVERHEAD_GOAL_MB = 250
KINDS = ("short chat, streamed", "500-token document", "2,500-token document", "n = 2 sampled", "abandoned stream")
WEIGHTS = (0.4, 0.25, 0.1, 0.15, 0.1)


def resident_weights_and_kv(engine_dir: Path, kv_tokens: int) -> tuple[float, float]:
    """MB of the loaded model's tensors (as the engine holds them, int8 head included) and of a full KV pool."""
    import torch

    from cpu_engine.engine_dir import load_engine

    loaded = load_engine(engine_dir)
    weights = sum(t.numel() * t.element_size() for t in loaded.model.state_dict().values())
    args = loaded.model.args
    element = torch.empty((), dtype=loaded.compute_dtype).element_size()
    per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * element
    return weights / 2**20, kv_tokens * per_token / 2**20


def memory_map(pid: int) -> dict:
    """RSS of the process split into anonymous memory and file-backed mappings (top files by RSS)."""
    files: dict[str, int] = {}
    anon = 0
    current = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", parts[0]):  # a mapping's header: address range, perms, ..., path
            current = parts[5] if len(parts) > 5 and parts[5].startswith("/") else None
        elif parts[0] == "Rss:":
            kb = int(parts[1])
            if current is None:
                anon += kb
            else:
                files[Path(current).name] = files.get(Path(current).name, 0) + kb
    top = sorted(files.items(), key=lambda kv: -kv[1])[:8]
    return {"anonymous_mb": anon / 1024, "file_backed_mb": sum(files.values()) / 1024,
            "top_files_mb": {name: kb / 1024 for name, kb in top}}


def settled_rss(quiet_s: float = 2.0, limit_s: float = 20.0) -> float | None:
    """The llm's RSS once it has not moved for ``quiet_s``: the engine has gone idle and handed its heap's free pages
    back (cpu_engine/memory.py), as a server between bursts is."""
    last, since, deadline = MONITOR.rss_mb(LLM), time.perf_counter(), time.perf_counter() + limit_s
    while time.perf_counter() - since < quiet_s and time.perf_counter() < deadline:
        time.sleep(0.25)
        rss = MONITOR.rss_mb(LLM)
        if rss != last:
            last, since = rss, time.perf_counter()
    return last


def llm_pid() -> int | None:
    return next((proc.pid for proc, label in MONITOR._tree() if label == LLM), None)


async def drive(url: str, requests: int, texts: list[str], milestones: list, seed: int) -> dict[str, int]:
    from client import AsyncLLMClient
    from client.core import SamplingParams

    rng = random.Random(seed)
    plan = rng.choices(range(len(KINDS)), weights=WEIGHTS, k=requests)
    counts = dict.fromkeys(KINDS, 0)
    queue = list(enumerate(plan))

    def document(chars: int) -> str:
        text = rng.choice(texts)
        while len(text) < chars:
            text += "\n\n" + rng.choice(texts)
        start = rng.randrange(0, max(1, len(text) - chars))
        return text[start:start + chars]

    progress = tqdm(total=requests, desc="mixed requests", unit="req")
    async with AsyncLLMClient(url, timeout=1800) as client:
        async def one(kind: int) -> None:
            if kind == 0:
                msgs = [{"role": "user", "content": f"Say something about {rng.choice(texts)[:60]!r}."}]
                async for _ in client.stream_chat(msgs, SamplingParams(max_tokens=rng.randint(1, 64))):
                    pass
            elif kind in (1, 2):
                doc = document(2_000 if kind == 1 else 10_000)  # ~4 characters a token
                await client.chat([{"role": "user", "content": doc + "\n\nSummarise this."}],
                                  SamplingParams(max_tokens=32 if kind == 1 else 16))
            elif kind == 3:
                await client.chat_n([{"role": "user", "content": "Write a line about " + document(200)}],
                                    SamplingParams(max_tokens=32, temperature=0.8, n=2, seed=rng.randrange(1 << 30)))
            else:
                stream = client.stream_chat([{"role": "user", "content": document(1_000)}],
                                            SamplingParams(max_tokens=128))
                async with stream:
                    got = 0
                    async for _ in stream:
                        got += 1
                        if got >= 3:
                            break  # leaving the stream cancels the request
            counts[KINDS[kind]] += 1
            progress.update()

        async def worker() -> None:
            while queue:
                index, kind = queue.pop(0)
                await one(kind)
                if (index + 1) % max(1, requests // 10) == 0:
                    milestones.append((index + 1, MONITOR.rss_mb(LLM)))

        await asyncio.gather(*(worker() for _ in range(16)))
    progress.close()
    return counts


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.memory_soak")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, help="default docs/benchmarks (1,000 requests) or build/bench/memory")
    a = p.parse_args(argv)
    out_dir = a.out_dir or (PROJECT_ROOT / ("docs/benchmarks" if a.requests >= 1000 else "build/bench/memory"))
    out_dir.mkdir(parents=True, exist_ok=True)

    from builders.english_text import evaluation_texts
    from builders.profile import ServingProfile
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    profile = ServingProfile.from_yaml(PROFILE)
    weights_mb, kv_mb = resident_weights_and_kv(Path(profile.engine_dir), profile.llm.max_tokens_in_paged_kv_cache)
    work = PROJECT_ROOT / "build" / "bench" / "memory"
    repo = render_repository(profile, work / "repository")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=work / "triton.log")
    samples: list[tuple[float, float]] = []
    milestones: list[tuple[int, float | None]] = []
    with TritonServer(config, ready_timeout=600) as server:
        pid = llm_pid()
        after_load = MONITOR.rss_mb(LLM)
        milestones.append((0, after_load))
        say(f"serving {profile.engine_dir}: llm RSS after load {after_load} MB; sending {a.requests} mixed requests")
        stop = threading.Event()
        start = time.perf_counter()

        def sample() -> None:
            while not stop.wait(0.5):
                rss = MONITOR.rss_mb(LLM)
                if rss is not None:
                    samples.append((time.perf_counter() - start, rss))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        counts = asyncio.run(drive(server.urls.grpc, a.requests, evaluation_texts(), milestones, a.seed))
        stop.set()
        sampler.join()
        wall = time.perf_counter() - start
        final = MONITOR.rss_mb(LLM)
        at_rest = settled_rss()
        breakdown = memory_map(pid) if pid else {}
    goal = weights_mb + kv_mb + OVERHEAD_GOAL_MB
    result = {"engine_dir": str(profile.engine_dir), "requests": a.requests, "counts": counts, "wall_s": wall,
              "weights_mb": weights_mb, "kv_pool_mb": kv_mb, "goal_mb": goal, "rss_after_load_mb": after_load,
              "rss_final_mb": final, "rss_at_rest_mb": at_rest,
              "rss_peak_mb": max((r for _, r in samples), default=final),
              "milestones": milestones, "samples": samples, "memory_map": breakdown, "seed": a.seed}
    (out_dir / "memory.json").write_text(json.dumps(result, indent=1) + "\n")
    report(result, out_dir / "memory.md", " ".join(["python -m bench.memory_soak", *(argv or [])]).strip())
    plot(result, out_dir / "memory.png")
    print((out_dir / "memory.md").read_text())


def report(r: dict, path: Path, command: str) -> None:
    def verdict(rss: float | None) -> str:
        return f"{rss} ({'met' if rss is not None and rss <= r['goal_mb'] else '**missed**'})"

    mm = r["memory_map"]
    lines = [
        "# Memory of the served llm after mixed requests", "",
        f"Generated by `{command}` (bench/memory_soak.py); raw numbers: [memory.json](memory.json), plot: "
        "[memory.png](memory.png). Regenerate rather than edit.", "",
        f"Engine `{r['engine_dir']}` (the default profile), {r['requests']} requests from 16 concurrent gRPC clients "
        f"in {r['wall_s']:.0f} s: " + ", ".join(f"{n} {k}" for k, n in r["counts"].items()) + ".", "",
        "| measure | MB |", "| --- | ---: |",
        f"| weights as loaded (int8 head included) | {r['weights_mb']:.0f} |",
        f"| KV pool (`llm.max_tokens_in_paged_kv_cache`) | {r['kv_pool_mb']:.0f} |",
        f"| goal: weights + KV + {OVERHEAD_GOAL_MB} | {r['goal_mb']:.0f} |",
        f"| llm RSS after load | {r['rss_after_load_mb']} |",
        f"| llm RSS peak | {r['rss_peak_mb']} |",
        f"| llm RSS after the last request | {verdict(r['rss_final_mb'])} |",
        f"| llm RSS at rest (unchanged for 2 s after it) | {verdict(r.get('rss_at_rest_mb'))} |", "",
        "RSS after every tenth of the requests: " + ", ".join(f"{n}: {rss}" for n, rss in r["milestones"]) + " MB.",
    ]
    if mm:
        lines += ["", f"Where it is, from `/proc/PID/smaps` at rest: anonymous {mm['anonymous_mb']:.0f} MB "
                  f"(weights, KV pool, Python and torch heaps), file-backed {mm['file_backed_mb']:.0f} MB; the largest "
                  "files: " + ", ".join(f"{k} {v:.0f}" for k, v in mm["top_files_mb"].items()) + " MB."]
    path.write_text("\n".join(lines) + "\n")


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    if r["samples"]:
        ts, rss = zip(*r["samples"])
        ax.plot(ts, rss, label="llm RSS")
    ax.axhline(r["goal_mb"], color="red", linestyle="--", label=f"goal: weights + KV + {OVERHEAD_GOAL_MB} MB")
    ax.axhline(r["weights_mb"] + r["kv_pool_mb"], color="grey", linestyle=":", label="weights + KV pool")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB")
    ax.set_title(f"llm process memory over {r['requests']} mixed requests")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
