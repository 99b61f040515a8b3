"""Markdown report, CSV summary and PNG plots of a sweep."""

from __future__ import annotations

import csv
from pathlib import Path

from .results import LevelResult
from .slo import Check, miss_ratio
from .spec import LoadProfile, level_str

PLOTS = {
    "throughput_vs_p99": "throughput_vs_p99_latency.png",
    "ttft": "ttft_percentiles.png",
    "tpot": "tpot_percentiles.png",
}


def _f(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}"


def summary_rows(results: list[LevelResult]) -> list[dict]:
    rows = []
    for r in results:
        rows.append({
            "level": r.level, "ok": r.ok, "requests": r.requests, "failed": r.failed_requests,
            "throughput_rps": r.throughput_rps, "output_tokens_per_s": r.output_tokens_per_s,
            "prompt_tokens_mean": r.prompt_tokens_mean, "output_tokens_mean": r.output_tokens_mean,
            **{f"latency_{k}_ms": getattr(r.latency, k) for k in ("avg", "p50", "p90", "p99")},
            **{f"ttft_{k}_ms": getattr(r.ttft, k) for k in ("avg", "p50", "p90", "p99")},
            **{f"tpot_{k}_ms": getattr(r.tpot, k) for k in ("avg", "p50", "p90", "p99")},
            "pa_latency_p99_ms": r.pa_latency_p99_ms,
            **{f"server_{k}": v for k, v in r.server.items()},
            "error": r.error or "",
        })
    return rows


def write_csv(results: list[LevelResult], path: Path) -> None:
    rows = summary_rows(results)
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def _slo_line(ax, limit: float | None, values: list[float], label: str, vertical: bool = False) -> None:
    """Draw the SLO limit when it is on the plot's scale; otherwise say where it is (keeps the data readable)."""
    if not limit:
        return
    if values and limit > 3 * max(values):
        ax.text(0.98, 0.96, f"{label}: {limit:g} ms (off scale)", transform=ax.transAxes, ha="right", va="top",
                fontsize=8, color="tab:red")
        return
    (ax.axvline if vertical else ax.axhline)(limit, color="tab:red", ls="--", lw=1, label=label)
    ax.legend(fontsize=8)


def plot(profile: LoadProfile, results: list[LevelResult], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.ok and r.requests]
    if not ok:
        return []
    written = []
    xs = [r.level for r in ok]
    axis = profile.load.axis_label

    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    pts = [(r.latency.p99, r.throughput_rps, r.level) for r in ok if r.latency.p99 and r.throughput_rps]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:blue")
        for x, y, lv in pts:
            ax.annotate(level_str(lv), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if pts:
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0, top=max(p[1] for p in pts) * 1.15)
    _slo_line(ax, profile.slo.latency_p99_ms, [p[0] for p in pts], "P99 latency SLO", vertical=True)
    ax.set_xlabel("P99 request latency (ms)")
    ax.set_ylabel("throughput (requests/s)")
    ax.set_title(f"{profile.name}: throughput vs P99 latency\n(labels: {axis})", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    written.append(out_dir / PLOTS["throughput_vs_p99"])
    fig.savefig(written[-1])
    plt.close(fig)

    for key, stats_of, slo_p99, title in (
        ("ttft", lambda r: r.ttft, profile.slo.ttft_p99_ms, "time to first token"),
        ("tpot", lambda r: r.tpot, profile.slo.tpot_p99_ms, "time per output token"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
        any_data = False
        for pct, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^-")):
            ys = [getattr(stats_of(r), pct) for r in ok]
            if any(y is not None for y in ys):
                any_data = True
                ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], style,
                        label=pct.upper())
        values = [v for r in ok for v in (stats_of(r).p99, stats_of(r).p50) if v is not None]
        if values:
            ax.set_ylim(bottom=0)
        _slo_line(ax, slo_p99, values, "P99 SLO")
        if not any_data:
            ax.text(0.5, 0.5, "not measured (non-streaming)", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(axis)
        ax.set_ylabel(f"{key.upper()} (ms)")
        ax.set_title(f"{profile.name}: {title} percentiles", fontsize=10)
        if len(xs) > 2 and max(xs) / min(xs) >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [level_str(x) for x in xs])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        if any_data:
            ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(out_dir / PLOTS[key])
        fig.savefig(written[-1])
        plt.close(fig)
    return written


def results_table(profile: LoadProfile, results: list[LevelResult]) -> list[str]:
    head = "concurrency" if profile.load.mode == "concurrency" else "req/s offered"
    lines = [
        f"| {head} | requests | throughput (req/s) | output tok/s | latency P50 / P99 (ms) | "
        "TTFT P50 / P90 / P99 (ms) | TPOT P50 / P90 / P99 (ms) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        if not r.ok:
            lines.append(f"| {level_str(r.level)} | failed: {r.error} | | | | | |")
            continue
        lines.append(
            f"| {level_str(r.level)} | {r.requests} | {_f(r.throughput_rps, 2)} | {_f(r.output_tokens_per_s, 0)} | "
            f"{_f(r.latency.p50)} / {_f(r.latency.p99)} | {_f(r.ttft.p50)} / {_f(r.ttft.p90)} / {_f(r.ttft.p99)} | "
            f"{_f(r.tpot.p50, 2)} / {_f(r.tpot.p90, 2)} / {_f(r.tpot.p99, 2)} |")
    return lines


def server_table(results: list[LevelResult]) -> list[str]:
    """Server-side time per request (perf_analyzer's breakdown), ensemble and per composing invocation."""
    models = sorted({m for r in results for m in r.composing})
    lines = ["| level | model | calls/request | queue (us) | compute input (us) | compute infer (us) | "
             "compute output (us) |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        if not r.ok or not r.server:
            continue
        s = r.server
        lines.append(f"| {level_str(r.level)} | ensemble (sum per request) | 1 | {_f(s.get('queue_us'), 0)} | "
                     f"{_f(s.get('compute_input_us'), 0)} | {_f(s.get('compute_infer_us'), 0)} | "
                     f"{_f(s.get('compute_output_us'), 0)} |")
        base = s.get("inferences_per_s") or 0
        for m in models:
            c = r.composing.get(m)
            if not c:
                continue
            calls = (c.get("inferences_per_s") or 0) / base if base else None
            lines.append(f"| | {m} | {_f(calls, 1)} | {_f(c.get('queue_us'), 0)} | {_f(c.get('compute_input_us'), 0)} "
                         f"| {_f(c.get('compute_infer_us'), 0)} | {_f(c.get('compute_output_us'), 0)} |")
    return lines


def slo_lines(checks: list[Check], missing: list[float]) -> list[str]:
    if not checks and not missing:
        return ["No SLO in this profile."]
    lines = ["| level | check | value | limit | verdict |", "| ---: | --- | ---: | ---: | --- |"]
    for c in checks:
        verdict = "pass" if c.ok else f"**FAIL** {miss_ratio(c)}".rstrip()
        lines.append(f"| {level_str(c.level)} | {c.metric} | {'–' if c.value is None else f'{c.value:.3g}'} | "
                     f"{'–' if c.limit is None else f'{c.limit:g}'} | {verdict} |")
    for v in missing:
        lines.append(f"| {level_str(v)} | (level not measured in this run) | | | skipped |")
    return lines


def markdown(profile: LoadProfile, results: list[LevelResult], checks: list[Check], missing: list[float],
             meta: dict, plots: list[Path]) -> str:
    passed = all(c.ok for c in checks)
    lines = [
        f"# Load test `{profile.name}`: {'SLO met' if passed else 'SLO NOT met'}",
        "",
        profile.description.strip() or "",
        "",
        f"- started: {meta.get('started')}  ·  wall time: {meta.get('wall_s', 0):.0f} s  ·  tool: {meta.get('tool')}",
        f"- server: gRPC `{meta.get('url')}`, model `{profile.model}`, "
        f"{'streaming' if profile.streaming else 'non-streaming'} responses",
        f"- requests: {meta.get('inputs', {}).get('count', '?')} prompts; prompt tokens mean "
        f"{_f(meta.get('inputs', {}).get('prompt_tokens_mean'))} "
        f"[{meta.get('inputs', {}).get('prompt_tokens_min')}–{meta.get('inputs', {}).get('prompt_tokens_max')}], "
        f"output tokens mean {_f(meta.get('inputs', {}).get('output_tokens_mean'))} "
        f"[{meta.get('inputs', {}).get('output_tokens_min')}–{meta.get('inputs', {}).get('output_tokens_max')}]"
        f"{' (exact: min_tokens = max_tokens)' if profile.inputs.exact_output else ''}",
        f"- machine: {meta.get('cpus')} CPUs; load average before/after: {meta.get('loadavg_before')} / "
        f"{meta.get('loadavg_after')} (other work on the machine inflates latencies)",
        f"- code: {meta.get('git', '?')}",
        "",
        "## Results",
        "",
        *results_table(profile, results),
        "",
        "TTFT: request sent → first response with text; TPOT: (last response − first) / (output tokens − 1); "
        "latency: request sent → last response; all measured by perf_analyzer on the client.",
        "",
        "## SLO",
        "",
        *slo_lines(checks, missing),
        "",
    ]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    st = server_table(results)
    if len(st) > 2:
        lines += ["## Server-side time per request (perf_analyzer)", "", *st, "",
                  "The ensemble row's compute columns sum its composing models' invocations for one request "
                  "(preprocessing and llm, once each: the llm streams every response itself, text included); its "
                  "queue column is the ensemble scheduler's own. The CPU engine's decoding happens outside Triton's "
                  "compute timers (the llm model's execute() only enqueues), so it shows up in the client latency.",
                  ""]
    lines += ["## Commands", "", "```", *meta.get("commands", []), "```", ""]
    return "\n".join(lines)
