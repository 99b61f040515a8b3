"""Draw the autoscaler's view of an overload run from real Prometheus data (docs/kubernetes.md).

Input: build/prometheus/overload-run.json, written by tests/test_prometheus.py's live run (a real Prometheus
scraping the test tritonserver with the chart's rendered KEDA queries and rules). Output: one panel per KEDA
trigger (its value against its threshold, the load shaded) and the alert timeline (pending / firing).

    .venv/bin/python -m pytest tests/test_prometheus.py          # the live run writes the JSON
    .venv/bin/python scripts/autoscaling_plot.py [--input JSON] [--output docs/kubernetes-autoscaling.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plot(data: dict, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0, t1 = data["load"]["start"], data["load"]["end"]
    triggers = data["triggers"]
    n = len(triggers) + 1
    fig, axes = plt.subplots(n, 1, figsize=(9, 1.9 * n + 0.6), sharex=True)
    for ax, (name, tr) in zip(axes, triggers.items()):
        xs = [t - t0 for t, _ in tr["values"]]
        ys = [v for _, v in tr["values"]]
        ax.plot(xs, ys, lw=1.6, label="query value")
        ax.axhline(tr["threshold"], color="tab:red", ls="--", lw=1.2,
                   label=f"threshold {tr['threshold']:g} ({tr['metricType']})")
        ax.axvspan(0, t1 - t0, color="0.9", zorder=0)
        crossed = data["crossed_s"].get(name)
        fell = data["fell_s"].get(name)
        note = []
        if crossed is not None:
            ax.axvline(crossed, color="tab:green", lw=0.8)
            note.append(f"crossed at +{crossed:g} s")
        if fell is not None:
            ax.axvline(t1 - t0 + fell, color="tab:purple", lw=0.8)
            note.append(f"back below {fell:g} s after the load")
        ax.set_title(f"KEDA trigger {name}: " + ", ".join(note), fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right")
        ax.tick_params(labelsize=8)
    ax = axes[-1]
    states = sorted(data["alerts"].items())
    colours = {"pending": "tab:orange", "firing": "tab:red"}
    for i, (key, times) in enumerate(states):
        alert, state = key.rsplit(" ", 1)
        xs = [t - t0 for t in times]
        ax.scatter(xs, [i] * len(xs), s=6, color=colours.get(state, "k"), marker="|")
    ax.set_yticks(range(len(states)), [k for k, _ in states], fontsize=7)
    ax.set_ylim(-0.8, max(len(states), 1) - 0.2)
    ax.axvspan(0, t1 - t0, color="0.9", zorder=0)
    ax.set_title("ALERTS (Prometheus rule evaluation)", fontsize=9, loc="left")
    ax.set_xlabel(f"seconds from the start of the load ({data['load']['streams']} streams, "
                  f"{data['load']['slots']} engine slots, shaded)", fontsize=8)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", type=Path, default=ROOT / "build" / "prometheus" / "overload-run.json")
    ap.add_argument("--output", type=Path, default=ROOT / "docs" / "kubernetes-autoscaling.png")
    args = ap.parse_args(argv)
    plot(json.loads(args.input.read_text()), args.output)
    print(args.output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
