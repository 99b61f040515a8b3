"""Section 5 — soak: ~70% of the measured capacity for 10 minutes (streamed requests, Poisson arrivals).

Pass criteria: 0 errors, RSS growth < 10% (median of the last tenth vs the first tenth of the run), latency
percentiles stable (per-10 s-window P99 of the last window within 2x of the median window). Writes
soak.json and soak.png (RSS and P99 over time) to --out.

    .venv/bin/python tests/reliability/scripts/soak.py                 # 600 s on the tiny test stack
    .venv/bin/python tests/reliability/scripts/soak.py --duration 60   # what CI-size means
"""

from __future__ import annotations

import math
import sys
import time

from _common import on_server, parser, publish, replot, repository

from tests.reliability import relkit


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result["report"]
    fig, ax1 = plt.subplots(figsize=(9, 4.5))
    t = [s["t"] for s in result["samples"]]
    ax1.plot(t, [s["rss_mib"] for s in result["samples"]], color="tab:blue", label="RSS, server process tree")
    ax1.set_xlabel("seconds")
    ax1.set_ylabel("RSS (MiB)", color="tab:blue")
    lo = min(s["rss_mib"] for s in result["samples"])
    ax1.set_ylim(lo * 0.95, lo * 1.15)
    ax2 = ax1.twinx()
    w = [x for x in result["windows"] if x["t"] <= r["duration_s"] and not math.isnan(x["p99_ms"])]
    ax2.plot([x["t"] for x in w], [x["p99_ms"] for x in w], color="tab:red", marker=".", label="P99 latency")
    ax2.plot([x["t"] for x in w], [x["p50_ms"] for x in w], color="tab:orange", marker=".", label="P50 latency")
    ax2.set_ylabel("end-to-end latency per 10 s window (ms)", color="tab:red")
    top = max((x["p99_ms"] for x in w), default=1.0) * 1.3  # no full window in a run shorter than one
    ax2.set_ylim(0, top)
    failed = [x for x in result["windows"] if x["n"] > x["ok"]]
    if failed:  # timeouts end 60 s after they started; rejections at once
        ax3 = ax1.twinx()
        ax3.bar([x["t"] - 5 for x in failed], [x["n"] - x["ok"] for x in failed], width=8, color="black",
                alpha=0.35, label="failed requests ending in the window (timeout: 60 s after its start)")
        ax3.set_ylim(0, max(x["n"] - x["ok"] for x in failed) * 4)
        ax3.set_yticks([])
    handles = [h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]]
    ax1.legend(handles, [h.get_label() for h in handles], loc="upper right", fontsize=8)
    bad = r.get("n_timeout", 0) + r.get("n_error", 0) + r.get("n_rejected", 0)
    ax1.set_title(f"{path.stem}: {r['offered_rps']} req/s ({r['offered_rps'] / r['capacity_rps']:.0%} of capacity), "
                  f"{r['max_tokens']} tokens, {r['requests']} requests, {bad} failed, "
                  f"RSS {r['rss_growth_pct']:+.1f}%", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = parser(__doc__, name="soak")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--fraction", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if replot(args, plot):
        return 0
    repo, slots = repository(args)

    def load(server) -> dict:
        started = time.time()
        result = relkit.soak(server, args.fraction, args.duration, args.max_tokens, slots, progress=True)
        result["report"].update(wall_s=round(time.time() - started, 1), repository=str(repo))
        return result

    result = on_server(args, repo, load)
    r = result["report"]
    publish(args, {"report": r, "samples": result["samples"], "windows": result["windows"]}, result, plot)
    stable = r["window_p99_ms_last"] <= 2 * r["window_p99_ms_median"]
    ok = r.get("n_error", 0) == r.get("n_timeout", 0) == r.get("n_rejected", 0) == 0 and \
        r["rss_growth_pct"] < 10 and stable
    print({k: v for k, v in r.items()})
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
