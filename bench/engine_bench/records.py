"""The rows every peer writes (one dict per measurement; bench/engine_report.py reads them back from the JSON), and
greedy agreement between two peers' outputs."""

from __future__ import annotations

import statistics

from bench.engine_bench.noise import noise_fields
from bench.workload import pct


def streams_record(base: dict, c: int, reqs_ttft: list[float], tokens: int, wall: float, noise: dict) -> dict:
    return {**base, "mode": "streams", "streams": c, "agg_tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
            "ttft_p50_ms": 1e3 * pct(reqs_ttft, 0.5), "ttft_p90_ms": 1e3 * pct(reqs_ttft, 0.9),
            **noise_fields(noise)}



def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Exact-sequence matches and the mean matching prefix (fraction of tokens before the first difference)."""
    exact, prefix = 0, []
    for a, b in zip(reference, other):
        n = min(len(a), len(b))
        k = next((i for i in range(n) if a[i] != b[i]), n)
        exact += int(k == len(a) == len(b))
        prefix.append(k / max(len(a), 1))
    return {"exact": exact, "of": min(len(reference), len(other)),
            "mean_prefix": statistics.fmean(prefix) if prefix else float("nan")}


# ------------------------------------------------------------------------------------------------ models


def summary_line(r: dict) -> str:
    head = f"{r['model']:>10} {r['peer']:>9} {r['variant']:>7}"
    if r["mode"] == "b1":
        return f"{head}  b1: TTFT {r['ttft_ms']:.1f} ms, decode {r['decode_tok_s']:.1f} tok/s  (foreign {r.get('foreign_cores', 0):.2f} cores)"
    return (f"{head}  {r['streams']:>2} streams: {r['agg_tok_s']:.1f} tok/s, TTFT p50 {r['ttft_p50_ms']:.0f} ms"
            f"  (foreign {r.get('foreign_cores', 0):.2f} cores)")
