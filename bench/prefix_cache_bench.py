"""Prefix caching, served: a ~1,000-token system prompt shared by every request, cache on vs off, side by side.

Each setting serves the default profile (builders/profiles/cpu.yaml: the default engine) from a real tritonserver,
with only ``llm.enable_kv_cache_reuse`` changed, and is driven over gRPC by the project's client:

* ``single``: one client, one request after another, each the system prompt and a short question (the first
  request fills the cache; the others are the repeated-prefix requests);
* ``concurrent``: 16 clients at once, 3 such requests each: aggregate output tokens/s and TTFT;
* ``chat``: one 10-turn chat that resends its history each turn (``python -m client chat`` does), TTFT per turn.

The peer is llama.cpp on the same weights (an F32 GGUF written from the same checkpoint), one slot with and without
``cache_prompt`` (bench/llama_cpp_peer.py, ``prefix``: llama-server's slot reuse, as llama-cpp-python runs it).
Greedy answers with the cache must equal those without it; the table says whether they did.

    python -m bench.prefix_cache_bench            # ~10 min on 2 cores: docs/benchmarks/prefix_cache.{md,json,png}
    python -m bench.prefix_cache_bench --quick    # ~3 min, report in build/bench/prefix_cache/
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
import urllib.request
from pathlib import Path

from bench.engine_bench.models import cached, file_digest, say, write_stamp
from bench.engine_bench.noise import MONITOR
from bench.engine_bench.peer_llama_cpp import LLAMA_CPP_VENV, llama_job

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PROFILE = PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml"
CHECKPOINT = PROJECT_ROOT / "build" / "models" / "smollm2"
QUESTIONS = ["What is the main topic above?", "Summarise the first paragraph.", "Name one module mentioned.",
             "What does the text say about errors?", "Give a title for this text.", "Which word appears most?",
             "Is the text about Python?", "What would you ask the author?", "List two facts from it.",
             "Explain it to a child.", "What is missing from it?", "Write one question about it."]
ANSWER_TOKENS = 16
CHAT_ANSWER_TOKENS = 32


def system_prompt(tokenizer, target_tokens: int = 1000) -> str:
    """Instructions and reference text (the project's English evaluation texts) of about ``target_tokens``."""
    from builders.english_text import evaluation_texts

    text = "You are a careful assistant. Answer in one short sentence, using only the reference text below.\n\n"
    for paragraph in evaluation_texts():
        if len(tokenizer(text + paragraph).input_ids) <= target_tokens:
            text += paragraph + "\n\n"
    return text


def messages(system: str, turns: list[tuple[str, str | None]]) -> list[dict]:
    out = [{"role": "system", "content": system}]
    for question, answer in turns:
        out.append({"role": "user", "content": question})
        if answer is not None:
            out.append({"role": "assistant", "content": answer})
    return out


async def _chat(client, msgs: list[dict], max_tokens: int):
    from client.core import SamplingParams

    stream = client.stream_chat(msgs, SamplingParams(max_tokens=max_tokens))
    async for _ in stream:
        pass
    return stream.completion


async def drive(url: str, system: str, quick: bool) -> dict:
    from client import AsyncLLMClient

    out = {}
    async with AsyncLLMClient(url, timeout=1800) as client:
        single = []
        for q in QUESTIONS[:4 if quick else 8]:
            c = await _chat(client, messages(system, [(q, None)]), ANSWER_TOKENS)
            single.append({"ttft_s": c.timings.ttft_s, "text": c.text, "prompt_tokens": c.num_input_tokens,
                           "cached_tokens": c.num_cached_tokens})
        out["single"] = single

        clients, per_client = (8, 2) if quick else (16, 3)

        async def worker(k: int):
            done = []
            for r in range(per_client):
                q = QUESTIONS[(k * per_client + r) % len(QUESTIONS)] + f" (reader {k})"
                done.append(await _chat(client, messages(system, [(q, None)]), ANSWER_TOKENS))
            return done

        start = time.perf_counter()
        done = [c for per in await asyncio.gather(*(worker(k) for k in range(clients))) for c in per]
        wall = time.perf_counter() - start
        out["concurrent"] = {"clients": clients, "requests": len(done), "wall_s": wall,
                             "agg_tok_s": sum(c.num_output_tokens for c in done) / wall,
                             "ttft_p50_s": statistics.median(c.timings.ttft_s for c in done),
                             "cached_tokens_mean": statistics.mean(c.num_cached_tokens for c in done)}

        turns: list[tuple[str, str | None]] = []
        chat = []
        for q in QUESTIONS[:5 if quick else 10]:
            c = await _chat(client, messages(system, turns + [(q, None)]), CHAT_ANSWER_TOKENS)
            turns.append((q, c.text))
            chat.append({"ttft_s": c.timings.ttft_s, "prompt_tokens": c.num_input_tokens,
                         "cached_tokens": c.num_cached_tokens, "text": c.text})
        out["chat"] = chat
    return out


def scrape(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    names = ("llm_prefix_cache_hit_tokens_total", "llm_prefix_cache_missed_tokens_total",
             "llm_engine_kv_cache_capacity_tokens", "llm_engine_kv_cache_cached_tokens")
    return {n: float(m.group(1)) for n in names if (m := re.search(rf"^{n}{{[^}}]*}} (\S+)$", text, re.M))}


def serve_and_drive(reuse: bool, system: str, work: Path, quick: bool) -> dict:
    from builders.profile import LLMStage, ServingProfile
    from builders.repository import render_repository
    from serving.launcher import ServerConfig, TritonServer

    profile = ServingProfile.from_yaml(PROFILE)
    profile = profile.model_copy(update={"llm": LLMStage(**{**profile.llm.model_dump(),
                                                            "enable_kv_cache_reuse": reuse})})
    repo = render_repository(profile, work / f"repo-reuse-{reuse}")
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=work / f"triton-reuse-{reuse}.log")
    with TritonServer(config, ready_timeout=600) as server:
        say(f"cache {'on' if reuse else 'off'}: serving; driving")
        result = asyncio.run(drive(server.urls.grpc, system, quick))
        result["metrics"] = scrape(server.urls.metrics)
        result["llm_rss_mb"] = MONITOR.rss_mb("python stub: llm")
    return result


def llama_cpp_peer(system: str, tokenizer, work: Path, quick: bool) -> dict | None:
    from bench.gguf_export import export_gguf

    py = LLAMA_CPP_VENV / "bin" / "python"
    if not py.exists():
        say("llama.cpp peer skipped: no build/tools/llama-cpp (make llama-cpp)")
        return None
    gguf = work / "smollm2-f32.gguf"
    stamp = {"inputs": file_digest(CHECKPOINT / "model.safetensors", PROJECT_ROOT / "bench" / "gguf_export.py")}
    if not (gguf.exists() and cached(gguf, stamp)):
        export_gguf(CHECKPOINT, gguf, "f32", name="smollm2")
        write_stamp(gguf, stamp)
    texts = [tokenizer.apply_chat_template(messages(system, [(q, None)]), add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS[:4 if quick else 8]]
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    out = {}
    for cache in (False, True):
        res = llama_job(py, {"op": "prefix", "gguf": str(gguf), "threads": 2, "n_ctx": 4096,
                              "new_tokens": ANSWER_TOKENS, "cache_prompt": cache,
                              "requests": [{"ids": i} for i in ids]})
        out["on" if cache else "off"] = {"ttft_s": [r["times"][0] - r["start"] for r in res["results"]],
                                         "reused": [r["reused"] for r in res["results"]], "rss_mb": res["rss_mb"],
                                         "version": res["version"]}
    return out


def p50(values: list[float]) -> float:
    return statistics.median(values)


def report(results: dict, out_dir: Path, command: str) -> None:
    off, on, peer = results["off"], results["on"], results.get("llama.cpp")
    rep_off = [r["ttft_s"] for r in off["single"][1:]]
    rep_on = [r["ttft_s"] for r in on["single"][1:]]
    same = [a["text"] == b["text"] for a, b in zip(off["single"] + off["chat"], on["single"] + on["chat"])]
    rows = [
        ("1 client: TTFT P50 of repeated-prefix requests", f"{1e3 * p50(rep_off):.0f} ms", f"{1e3 * p50(rep_on):.0f} ms",
         f"{p50(rep_off) / p50(rep_on):.1f}× sooner", "≥ 5×"),
        ("1 client: first request (cache empty)", f"{1e3 * off['single'][0]['ttft_s']:.0f} ms",
         f"{1e3 * on['single'][0]['ttft_s']:.0f} ms", "", ""),
        ("1 client: second request vs the first (cache on)", "", f"{1e3 * on['single'][1]['ttft_s']:.0f} ms",
         f"{on['single'][0]['ttft_s'] / on['single'][1]['ttft_s']:.1f}× sooner", "≥ 5×"),
        (f"{on['concurrent']['clients']} clients: aggregate output tok/s", f"{off['concurrent']['agg_tok_s']:.1f}",
         f"{on['concurrent']['agg_tok_s']:.1f}",
         f"{on['concurrent']['agg_tok_s'] / off['concurrent']['agg_tok_s']:.2f}×", "≥ 1.5×"),
        (f"{on['concurrent']['clients']} clients: TTFT P50", f"{1e3 * off['concurrent']['ttft_p50_s']:.0f} ms",
         f"{1e3 * on['concurrent']['ttft_p50_s']:.0f} ms", "", ""),
        ("chat: TTFT of turn 1 → last turn",
         f"{1e3 * off['chat'][0]['ttft_s']:.0f} → {1e3 * off['chat'][-1]['ttft_s']:.0f} ms",
         f"{1e3 * on['chat'][0]['ttft_s']:.0f} → {1e3 * on['chat'][-1]['ttft_s']:.0f} ms", "", "flat"),
        ("llm process RSS after the run", f"{off['llm_rss_mb']} MB", f"{on['llm_rss_mb']} MB", "", ""),
        ("greedy answers equal with and without the cache", "", f"{sum(same)} of {len(same)}", "", "all"),
    ]
    if peer:
        rows.append(("llama.cpp one slot, TTFT P50 of repeated-prefix requests (cache_prompt off → on)",
                     f"{1e3 * p50(peer['off']['ttft_s'][1:]):.0f} ms", f"{1e3 * p50(peer['on']['ttft_s'][1:]):.0f} ms",
                     f"{p50(peer['off']['ttft_s'][1:]) / p50(peer['on']['ttft_s'][1:]):.1f}× sooner", ""))
        rows.append(("ours vs llama.cpp, repeated-prefix TTFT P50 (cache on)", "", "",
                     f"{p50(peer['on']['ttft_s'][1:]) / p50(rep_on):.2f}× llama.cpp's speed", ""))
    prompt = on["single"][0]["prompt_tokens"]
    lines = [
        "# Prefix caching, served (issue 30)", "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M')}, {results['machine']}). Default profile "
        f"(builders/profiles/cpu.yaml: SmolLM2-135M-Instruct fp32 engine, paged KV cache of "
        f"{int(on['metrics'].get('llm_engine_kv_cache_capacity_tokens', 0)):,} tokens), served by tritonserver, "
        f"driven over gRPC; only `llm.enable_kv_cache_reuse` differs. Prompts: a {prompt}-token chat (system "
        f"prompt + one question), {ANSWER_TOKENS} greedy output tokens; the chat turns add {CHAT_ANSWER_TOKENS}-token "
        f"answers. Bench source: bench/prefix_cache_bench.py.", "",
        "| | cache off | cache on | ratio | goal |", "| --- | --- | --- | --- | --- |",
        *[f"| {' | '.join(r)} |" for r in rows], "",
        "Chat turns (prompt tokens, cached tokens, TTFT off / on):", "",
        "| turn | prompt tokens | cached (on) | TTFT off | TTFT on |", "| --- | --- | --- | --- | --- |",
        *[f"| {i + 1} | {b['prompt_tokens']} | {b['cached_tokens']} | {1e3 * a['ttft_s']:.0f} ms | "
          f"{1e3 * b['ttft_s']:.0f} ms |" for i, (a, b) in enumerate(zip(off["chat"], on["chat"]))], "",
        f"Prefix-cache metrics after the cache-on run: {json.dumps(on['metrics'])}.", "",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "prefix_cache.md").write_text("\n".join(lines))
    (out_dir / "prefix_cache.json").write_text(json.dumps(results, indent=1))
    plot(results, out_dir / "prefix_cache.png")
    print("\n".join(lines))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("off", "o-"), ("on", "s-")):
        chat = results[key]["chat"]
        left.plot(range(1, len(chat) + 1), [1e3 * c["ttft_s"] for c in chat], style, label=f"cache {key}")
        single = results[key]["single"]
        right.plot(range(1, len(single) + 1), [1e3 * c["ttft_s"] for c in single], style, label=f"cache {key}")
    if results.get("llama.cpp"):
        for key, style in (("off", "x--"), ("on", "+--")):
            ttft = results["llama.cpp"][key]["ttft_s"]
            right.plot(range(1, len(ttft) + 1), [1e3 * t for t in ttft], style, label=f"llama.cpp cache_prompt {key}")
    left.set(title="10-turn chat: time to first token", xlabel="turn", ylabel="ms")
    right.set(title="Shared ~1,000-token system prompt, 1 client", xlabel="request", ylabel="ms", yscale="log")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    import platform

    from transformers import AutoTokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer requests; report in build/bench/prefix_cache/")
    p.add_argument("--out", type=Path, help="report folder (default: docs/benchmarks, or build/... with --quick)")
    a = p.parse_args(argv)
    work = PROJECT_ROOT / "build" / "bench" / "prefix_cache"
    work.mkdir(parents=True, exist_ok=True)
    out_dir = a.out or (work if a.quick else PROJECT_ROOT / "docs" / "benchmarks")
    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT, local_files_only=True)
    system = system_prompt(tokenizer)
    results = {"machine": f"{platform.processor() or platform.machine()}, {__import__('os').cpu_count()} CPUs"}
    for reuse in (False, True):
        results["on" if reuse else "off"] = serve_and_drive(reuse, system, work, a.quick)
    say("llama.cpp peer")
    results["llama.cpp"] = llama_cpp_peer(system, tokenizer, work, a.quick)
    report(results, out_dir, "python -m bench.prefix_cache_bench" + (" --quick" if a.quick else ""))


if __name__ == "__main__":
    main()
