"""The run: plan the groups (one per model × peer × variant), measure each as one unit after a wait for quiet and a
canary, re-measure the noisy ones while the time budget lasts, compare every peer's greedy output with Hugging Face
fp32, and write the JSON and the Markdown report."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

import bench.engine_bench
from bench.engine_bench.machine import machine_info
from bench.engine_bench.models import build_engine, prepare_model, say
from bench.engine_bench.noise import canary, wait_quiet
from bench.engine_bench.options import PROJECT_ROOT, Options, parse_args
from bench.engine_bench.peer_engine import bench_engine
from bench.engine_bench.peer_hf import bench_hf
from bench.engine_bench.peer_llama_cpp import bench_llama_cpp, llama_cpp_python, prepare_ggufs
from bench.engine_bench.peer_llama_server import bench_llama_server, llama_server_binary
from bench.engine_bench.peer_triton import bench_triton
from bench.engine_bench.records import agreement, summary_line
from cpu_engine.threads import on_scratch_thread


@dataclass
class State:
    opts: Options
    meta: dict
    records: list[dict] = field(default_factory=list)
    superseded: list[dict] = field(default_factory=list)
    agreements: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    models: dict = field(default_factory=dict)
    llama_cpp: dict = field(default_factory=dict)

    def save(self) -> None:
        from bench.engine_report import compute_targets

        self.opts.out_json.parent.mkdir(parents=True, exist_ok=True)
        data = {"meta": self.meta, "models": self.models, "records": self.records,
                "superseded_noisy_attempts": self.superseded, "agreement": self.agreements,
                "skipped": self.skipped, "llama_cpp": self.llama_cpp,
                "targets": compute_targets(self.records, self.meta)}
        self.opts.out_json.write_text(json.dumps(data, indent=1, default=str) + "\n")


#: One measured unit: a label for the progress bar, the key of its rows, and the call that measures it.
Group = tuple[str, dict, Callable[[], tuple]]


def main(argv: list[str] | None = None) -> None:
    opts = parse_args(argv, bench.engine_bench.__doc__)
    import torch

    torch.set_num_threads(opts.threads)  # once, before any model exists (changing it later slows models down)
    from bench.engine_report import default_variant, write_markdown

    opts.work_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    meta = {"command": opts.command, "options": {k: str(v) if isinstance(v, Path) else v
                                                 for k, v in dataclasses.asdict(opts).items()},
            "started": dt.datetime.now().isoformat(timespec="seconds"), "load_start": os.getloadavg(),
            "machine": machine_info(opts.threads), "default_variant": default_variant()}
    state = State(opts, meta)
    groups = plan(state)
    outputs: dict[tuple, list[list[int]]] = {}
    bar = tqdm(groups, desc="benchmark", unit="group", dynamic_ncols=True)
    for label, key, fn in bar:
        bar.set_postfix_str(label)
        recs = run_group(state, outputs, label, key, fn)
        state.records.extend(recs)
        for r in recs:
            say(summary_line(r))
        state.save()
    if opts.rerun_noisy:
        remeasure_noisy(state, outputs, groups, started)
    compare_outputs(state, outputs)
    meta.update({"finished": dt.datetime.now().isoformat(timespec="seconds"), "load_end": os.getloadavg(),
                 "duration_s": round(time.time() - started, 1)})
    state.save()
    write_markdown(json.loads(opts.out_json.read_text()), opts.out_md)
    say(f"wrote {opts.out_md} and {opts.out_json} in {meta['duration_s'] / 60:.1f} min")


def plan(state: State) -> list[Group]:
    """Every (model, peer, variant) group to measure, each as one unit (and re-measured as one when noisy); builds
    what they need first (checkpoints, engines, GGUF files) and records the peers that cannot run."""
    opts = state.opts
    py, server = None, None
    gguf_peers = [p for p in ("llama.cpp", "llama-server") if p in opts.peers]
    if gguf_peers:  # llama-cpp-python writes the GGUFs both llama.cpp peers run
        py, why = llama_cpp_python()
        if py is None:
            for peer in gguf_peers:
                state.skipped.append({"peer": peer, "reason": why})
                say(f"{peer} peer skipped: {why}")
    if "llama-server" in opts.peers and py is not None:
        server, why = llama_server_binary()
        if server is None:
            if opts.peers_explicit:
                raise SystemExit(f"llama-server peer: {why}")
            state.skipped.append({"peer": "llama-server", "reason": why})
            say(f"llama-server peer skipped: {why}")

    groups: list[Group] = []
    for name in opts.models:
        model = prepare_model(name, opts)
        state.models[name] = {"checkpoint": str(model.checkpoint.relative_to(PROJECT_ROOT)
                                                if model.checkpoint.is_relative_to(PROJECT_ROOT) else model.checkpoint),
                              "params": model.params, "random_weights": model.random_weights,
                              "prompts": len(model.prompts),
                              "prompt_tokens_mean": statistics.fmean(len(p) for p in model.prompt_ids),
                              "config": {k: v for k, v in json.loads((model.checkpoint / "config.json").read_text()).items()
                                         if k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                  "num_key_value_heads", "intermediate_size", "vocab_size")}}
        say(f"model {name}: {model.params / 1e6:.1f}M params, {len(model.prompts)} prompts of "
            f"~{state.models[name]['prompt_tokens_mean']:.0f} tokens")
        engines = {v: build_engine(model, v, opts) for v in opts.variants}
        ggufs = prepare_ggufs(model, py, opts) if py is not None else {}
        if "hf" in opts.peers:
            for d in [v for v in ("fp32", "bf16") if v in opts.variants] or ["fp32"]:
                groups.append((f"{name} hf {d}", {"model": name, "peer": "hf", "variant": d},
                               lambda m=model, d=d: bench_hf(m, d, opts)))
        for t, path in ggufs.items():
            if "llama.cpp" in opts.peers:
                groups.append((f"{name} llama.cpp {t}", {"model": name, "peer": "llama.cpp", "variant": t.upper()},
                               lambda m=model, t=t, p=path: bench_llama_cpp(m, t, p, py, opts)))
            if server is not None:
                groups.append((f"{name} llama-server {t}",
                               {"model": name, "peer": "llama-server", "variant": t.upper()},
                               lambda m=model, t=t, p=path: bench_llama_server(m, t, p, server, opts)))
        for v in opts.variants:
            if "engine" in opts.peers:
                groups.append((f"{name} engine {v}", {"model": name, "peer": "engine", "variant": v},
                               lambda m=model, v=v, e=engines[v]: bench_engine(m, v, e, opts)))
            if "triton" in opts.peers and v in opts.triton_variants:
                groups.append((f"{name} triton {v}", {"model": name, "peer": "triton", "variant": v},
                               lambda m=model, v=v, e=engines[v]: (bench_triton(m, v, e, opts), None)))
    return groups


def run_group(state: State, outputs: dict, label: str, key: dict, fn, again: bool = False) -> list[dict]:
    """Measure one group after a wait for quiet and a canary; a peer that cannot run is reported, not fatal."""
    opts, meta = state.opts, state.meta
    if opts.wait_quiet > 0:
        waited = wait_quiet(opts.wait_quiet, opts.noise_threshold)
        if waited > 2.5:
            say(f"{label}: waited {waited:.0f} s for other processes to go quiet")
    probe = on_scratch_thread(canary)  # its matmul would leave an OpenMP pool on this thread
    try:
        result = fn()
    except Exception as exc:
        say(f"{label}: FAILED: {type(exc).__name__}: {exc}")
        reason = f"{type(exc).__name__}: {str(exc)[:500]}"
        if again:  # the first attempt stands; say why the second is missing
            meta.setdefault("failed_remeasurements", []).append({**key, "reason": reason})
        else:
            state.skipped.append({**key, "reason": reason})
        return []
    records, toks = [{**r, "canary": probe} for r in result[0]], result[1]
    if len(result) > 2:
        state.llama_cpp.setdefault(key["model"], {})[key["variant"]] = result[2]
    if toks is not None:
        outputs[(key["model"], key["peer"], key["variant"])] = toks
    return records


def remeasure_noisy(state: State, outputs: dict, groups: list[Group], started: float) -> None:
    """Measure again the groups that ran while other processes used the CPU, or while the canary said the
    machine itself was slow, while the time budget lasts; keep the quieter attempt."""
    opts, meta = state.opts, state.meta
    probes = [r["canary"]["matmul_gflops"] for r in state.records if r.get("canary")]
    slow = 0.5 * statistics.median(probes) if probes else 0.0  # the machine itself was slow (canary)

    def is_noisy(key: dict) -> bool:
        rows = [r for r in state.records if all(r[k] == key[k] for k in key)]
        return any(r.get("foreign_cores", 0) > opts.noise_threshold
                   or (r.get("canary") or {}).get("matmul_gflops", slow) < slow for r in rows)

    def noise(rows: list[dict]) -> float:  # foreign cores, plus one when the canary says the machine was slow
        return (max(r.get("foreign_cores", 0) for r in rows)
                + any((r.get("canary") or {}).get("matmul_gflops", slow) < slow for r in rows))

    noisy = [(label, key, fn) for label, key, fn in groups if is_noisy(key)]
    for label, key, fn in tqdm(noisy, desc="re-measuring noisy groups", unit="group", dynamic_ncols=True):
        if time.time() - started > 60 * opts.budget_minutes:
            say(f"time budget ({opts.budget_minutes:.0f} min) spent: {label} stays as first measured")
            meta.setdefault("noisy_not_remeasured", []).append(label)
            continue
        old = [r for r in state.records if all(r[k] == key[k] for k in key)]
        new = run_group(state, outputs, label + " (again)", key, fn, again=True)
        if new and noise(new) < noise(old):
            state.records = [r for r in state.records if r not in old] + [{**r, "attempt": 2} for r in new]
            state.superseded.extend({**r, "attempt": 1} for r in old)
        else:
            state.superseded.extend({**r, "attempt": 2} for r in new)
        state.save()


def compare_outputs(state: State, outputs: dict) -> None:
    """Greedy agreement of every peer with Hugging Face fp32 on the same prompts, and the first prompt's
    continuation from every peer as text, side by side in the report."""
    for name in state.opts.models:
        ref = outputs.get((name, "hf", "fp32"))
        if ref is None:
            continue
        for (m, peer, variant), toks in outputs.items():
            if m == name and (peer, variant) != ("hf", "fp32"):
                state.agreements.append({"model": name, "peer": peer, "variant": variant, "reference": "hf fp32",
                                         **agreement(ref, toks)})
    from transformers import AutoTokenizer

    for name, info in state.models.items():
        tok = AutoTokenizer.from_pretrained(str(PROJECT_ROOT / info["checkpoint"]), local_files_only=True)
        info["greedy_text"] = {f"{peer} {variant}": tok.decode(toks[0][:32])
                               for (m, peer, variant), toks in outputs.items() if m == name and toks}
