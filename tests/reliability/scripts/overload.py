"""Section 2 — overload: 10x the measured capacity for 60 s against a server with 2 KV slots and an LLM
queue of 4 (the CI version in test_rel_overload.py runs 10 s). Writes overload.json and overload.png.

    .venv/bin/python tests/reliability/scripts/overload.py
    .venv/bin/python tests/reliability/scripts/overload.py --duration 60 --factor 10 --max-tokens 96
"""

from __future__ import annotations

import sys

from _common import on_server, parser, publish, replot, repository

from tests.reliability import relkit


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = result["report"]
    outcomes = [o if isinstance(o, relkit.Outcome) else relkit.Outcome(o[2], o[0], o[1])
                for o in result["outcomes"]]  # objects, or [start, latency, kind] rows from the JSON
    begin = min(o.start for o in outcomes)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    rej = [o for o in outcomes if o.kind == "rejected"]
    ok = [o for o in outcomes if o.kind == "ok"]
    ax1.scatter([o.start - begin for o in rej], [o.latency_s * 1000 for o in rej], s=2, color="tab:red",
                label=f"rejected ({len(rej)}): time to UNAVAILABLE")
    ax1.scatter([o.start - begin for o in ok], [o.latency_s * 1000 for o in ok], s=4, color="tab:green",
                label=f"accepted ({len(ok)}): end-to-end")
    hung = [o for o in outcomes if o.kind in ("timeout", "error")]
    if hung:
        ax1.scatter([o.start - begin for o in hung], [o.latency_s * 1000 for o in hung], s=18, marker="x",
                    color="black", label=f"no final response ({len(hung)}): client timeout")
    ax1.set_yscale("log")
    ax1.set_ylabel("ms")
    ax1.legend(fontsize=8, loc="center right")
    ax1.set_title(f"{path.stem}: {r['offered_rps']} req/s offered = {r['offered_rps'] / r['capacity_rps']:.0f}x "
                  f"capacity ({r['capacity_rps']} req/s), {r['max_tokens']} tokens, streamed", fontsize=9)
    t = [s["t"] for s in result["samples"]]
    ax2.plot(t, [s["rss_mib"] for s in result["samples"]], color="tab:blue", label="RSS, server tree (MiB)")
    ax2.set_ylabel("RSS (MiB)")
    ax3 = ax2.twinx()
    ax3.step(t, [s["active"] for s in result["samples"]], color="tab:gray", label="active slots", where="post")
    ax3.step(t, [s["queued"] for s in result["samples"]], color="tab:orange", label="queued", where="post")
    ax3.set_ylabel("engine gauges (1 s samples)")
    ax2.set_xlabel("seconds")
    ax2.legend(fontsize=8, loc="upper left")
    ax3.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = parser(__doc__, name="overload")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--factor", type=float, default=10.0)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--llm-queue", type=int, default=4)
    args = ap.parse_args(argv)
    if replot(args, plot):
        return 0
    repo, slots = repository(args, limits={"max_batch_size": args.slots or 2}, llm_queue=args.llm_queue)

    def load(server) -> dict:
        result = relkit.overload(server, args.factor, args.duration, args.max_tokens, slots, progress=True)
        result["report"]["idle_after"] = relkit.idle(server.urls.metrics, timeout=60).active == 0
        return result

    result = on_server(args, repo, load)
    r = result["report"]
    publish(args, {"report": r, "samples": result["samples"],
                   "outcomes": [[round(o.start, 4), round(o.latency_s, 4), o.kind] for o in result["outcomes"]]},
            result, plot)
    print(r)
    ok = r["live_after"] and r.get("n_error", 0) == r.get("n_timeout", 0) == 0 and r["reject_p50_ms"] < 50
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
