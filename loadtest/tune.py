"""``python -m loadtest tune``: a bounded-time autotuner for the serving configuration.

For each candidate (a serving profile + engine limits): rebuild the CPU engine when its limits change (cached),
re-render the model repository, start tritonserver on free ports, measure the tune load profile, stop it.
A candidate's score is the highest throughput among its load levels that meet the profile's SLO (P99 latency /
TTFT / TPOT). Search: measure the base, then coordinate descent over ``loadtest/tune-space.yaml``; stop when
the next candidate would not fit in the time budget. Writes the chosen serving profile (YAML, usable with
``python -m builders repository --profile``), a report and the throughput-vs-P99 frontier plot.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from . import slo as slo_mod
from .results import LevelResult
from .spec import PACKAGE_DIR, PROJECT_ROOT, LoadProfile, level_str, load_profile
from .sweep import RESULTS_DIR, new_run_dir

DEFAULT_SPACE = PACKAGE_DIR / "tune-space.yaml"
ENGINE_CACHE = PROJECT_ROOT / "build" / "tune" / "engines"
ENGINE_KEYS = ("max_batch_size", "max_num_tokens")


@dataclass
class TuneOptions:
    profile: str = "tune"
    space: Path | None = None
    base_profile: Path = PROJECT_ROOT / "builders" / "profiles" / "cpu.yaml"
    checkpoint: Path | None = None
    budget_s: float = 900.0
    max_candidates: int = 12
    levels: list[float] | None = None
    out_dir: Path | None = None
    results_root: Path = RESULTS_DIR
    progress: bool = True
    first_estimate_s: float = 60.0  # cost guess before the first candidate was timed


@dataclass
class Candidate:
    index: int
    settings: dict  # dotted key -> value (the full point in the search space)
    changed: dict  # relative to the base
    results: list[LevelResult] = field(default_factory=list)
    score: float | None = None  # best throughput meeting the SLO (req/s); None = no level met it
    best_level: float | None = None
    seconds: float = 0.0
    error: str | None = None
    serving_profile: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"index": self.index, "settings": self.settings, "changed": self.changed, "score": self.score,
                "best_level": self.best_level, "seconds": self.seconds, "error": self.error,
                "results": [r.to_dict() for r in self.results], "serving_profile": self.serving_profile}


@dataclass
class TuneOutcome:
    out_dir: Path
    candidates: list[Candidate]
    chosen: Candidate | None
    exit_code: int
    stopped_because: str

    def text(self) -> str:
        lines = [f"tune: {len(self.candidates)} candidates measured ({self.stopped_because})"]
        for c in self.candidates:
            score = ("no level met the SLO" if c.score is None
                     else f"{c.score:.2f} req/s at {level_str(c.best_level)}")
            what = ", ".join(f"{k}={v}" for k, v in c.changed.items()) or "base"
            lines.append(f"  #{c.index:02d} {what}: {score}{' ERROR ' + c.error if c.error else ''}")
        if self.chosen is not None:
            lines.append(f"chosen: #{self.chosen.index:02d} ({', '.join(f'{k}={v}' for k, v in self.chosen.changed.items()) or 'base'})"
                         f" -> {self.out_dir / 'chosen-profile.yaml'}")
        else:
            lines.append("no configuration met the SLO")
        lines.append(f"report: {self.out_dir / 'report.md'}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- space


def load_space(path: Path | None) -> tuple[dict[str, list], float]:
    data = yaml.safe_load(Path(path or DEFAULT_SPACE).read_text()) or {}
    dims = data.get("dimensions") or {}
    if not isinstance(dims, dict) or not all(isinstance(v, list) and v for v in dims.values()):
        raise ValueError("tune space: 'dimensions' must map dotted keys to non-empty lists of values")
    return dims, float(data.get("min_gain", 0.03))


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def _set(d: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        d = d.setdefault(part, {})
    d[parts[-1]] = value


def base_point(serving: dict, engine: dict, dims: dict[str, list]) -> dict:
    point = {}
    for key in dims:
        if key.startswith("engine."):
            point[key] = engine.get(key.split(".", 1)[1])
        else:
            v = _get(serving, key)
            point[key] = v if v is not None else dims[key][0]
    return point


def apply_point(serving: dict, point: dict) -> dict:
    out = copy.deepcopy(serving)
    for key, value in point.items():
        if not key.startswith("engine."):
            _set(out, key, value)
    return out


def candidate_order(dims: dict[str, list], current: dict) -> list[tuple[str, object]]:
    return [(k, v) for k, values in dims.items() for v in values if v != current.get(k)]


def score_of(results: list[LevelResult], slo) -> tuple[float | None, float | None]:
    """Highest throughput among levels whose every SLO check passes (the SLO's ``at`` is ignored: each level
    is a candidate operating point)."""
    best, best_level = None, None
    free = slo.model_copy(update={"at": []})
    for r in results:
        checks, _ = slo_mod.check(free, [r])
        if r.ok and checks and all(c.ok for c in checks) and r.throughput_rps is not None:
            if best is None or r.throughput_rps > best:
                best, best_level = r.throughput_rps, r.level
    return best, best_level


# ---------------------------------------------------------------------------------------------- real evaluation


def engine_for(base_engine: Path, point: dict, checkpoint: Path | None) -> Path:
    """The base engine, or a cached rebuild with the candidate's slots / token budget."""
    from builders.cpu_build import BuildLimits, build_cpu_engine

    config = json.loads((base_engine / "config.json").read_text())
    build = config["build_config"]
    want = {k: point.get(f"engine.{k}", build[k]) for k in ENGINE_KEYS}
    want = {k: (build[k] if v is None else int(v)) for k, v in want.items()}
    if all(want[k] == build[k] for k in ENGINE_KEYS):
        return base_engine
    if want["max_num_tokens"] <= want["max_batch_size"]:
        raise ValueError(f"max_num_tokens {want['max_num_tokens']} must exceed max_batch_size {want['max_batch_size']}")
    ckpt = Path(checkpoint or config.get("source_checkpoint") or "")
    if not (ckpt / "config.json").exists():
        raise FileNotFoundError(f"checkpoint for engine rebuilds not found ({ckpt}); pass --checkpoint")
    name = f"{base_engine.name}-mbs{want['max_batch_size']}-tok{want['max_num_tokens']}"
    out = ENGINE_CACHE / name
    if (out / "config.json").exists():
        cached = json.loads((out / "config.json").read_text())
        if cached.get("source_checkpoint") == str(ckpt.resolve()) and all(
                cached["build_config"].get(k) == want[k] for k in ENGINE_KEYS):
            return out
    limits = BuildLimits(max_batch_size=want["max_batch_size"], max_input_len=build["max_input_len"],
                         max_seq_len=build["max_seq_len"], max_num_tokens=want["max_num_tokens"])
    return build_cpu_engine(ckpt, out, limits=limits)


class ServerEvaluator:
    """Measure a candidate against a real server (render, start, sweep, stop)."""

    def __init__(self, load: LoadProfile, base_engine: Path, checkpoint: Path | None, tokenizer: Path,
                 ready_timeout_s: float = 300.0):
        self.load, self.base_engine, self.checkpoint = load, base_engine, checkpoint
        self.tokenizer, self.ready_timeout_s = tokenizer, ready_timeout_s

    def __call__(self, candidate: Candidate, serving: dict, work: Path) -> list[LevelResult]:
        from builders.profile import ServingProfile
        from builders.repository import render_repository
        from serving.launcher import ServerConfig, TritonServer

        from .sweep import run_sweep

        engine = engine_for(self.base_engine, candidate.settings, self.checkpoint)
        serving = dict(serving, engine_dir=str(engine))
        candidate.serving_profile = serving
        profile = ServingProfile.model_validate(serving)
        repo = render_repository(profile, work / "model_repository")
        cfg = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                           log_file=work / "tritonserver.log")
        with TritonServer(cfg, ready_timeout=self.ready_timeout_s) as server:
            outcome = run_sweep(self.load, url=server.urls.grpc, metrics_url=server.urls.metrics,
                                tokenizer=self.tokenizer, out_dir=work / "load", progress=False, plots=False)
        return outcome.results


# ---------------------------------------------------------------------------------------------- search


Evaluator = Callable[[Candidate, dict, Path], list[LevelResult]]


def search(load: LoadProfile, serving: dict, engine_build: dict, dims: dict[str, list], min_gain: float,
           evaluate: Evaluator, out: Path, budget_s: float, max_candidates: int, first_estimate_s: float = 60.0,
           say: Callable[[str], None] = print) -> tuple[list[Candidate], Candidate | None, str]:
    t0 = time.monotonic()
    current = base_point(serving, engine_build, dims)
    base = dict(current)
    candidates: list[Candidate] = []
    best: Candidate | None = None
    stopped = "search space exhausted"

    def run(point: dict) -> Candidate | None:
        nonlocal stopped
        spent = time.monotonic() - t0
        estimate = (sum(c.seconds for c in candidates) / len(candidates)) if candidates else first_estimate_s
        if len(candidates) >= max_candidates:
            stopped = f"candidate limit {max_candidates} reached"
            return None
        if candidates and spent + estimate > budget_s:
            stopped = f"time budget {budget_s:.0f} s reached after {spent:.0f} s"
            return None
        c = Candidate(len(candidates), dict(point), {k: v for k, v in point.items() if v != base.get(k)})
        work = out / "candidates" / f"{c.index:02d}"
        work.mkdir(parents=True, exist_ok=True)
        what = ", ".join(f"{k}={v}" for k, v in c.changed.items()) or "base"
        say(f"[tune {spent:5.0f}s] #{c.index:02d} {what} ...")
        start = time.monotonic()
        try:
            c.results = evaluate(c, apply_point(serving, point), work)
            c.score, c.best_level = score_of(c.results, load.slo)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is recorded, the search goes on
            c.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        c.seconds = time.monotonic() - start
        score = "error" if c.error else ("no level met the SLO" if c.score is None else
                                         f"{c.score:.2f} req/s at {level_str(c.best_level)}")
        say(f"[tune {time.monotonic() - t0:5.0f}s] #{c.index:02d} {what}: {score} ({c.seconds:.0f} s)")
        candidates.append(c)
        return c

    first = run(current)
    if first is not None and first.score is not None:
        best = first
    for key, value in candidate_order(dims, current):
        if value == current.get(key):
            continue  # adopted meanwhile
        point = dict(current, **{key: value})
        c = run(point)
        if c is None:
            break
        if c.score is not None and (best is None or c.score > best.score * (1 + min_gain)):
            best, current = c, point
    return candidates, best, stopped


# ---------------------------------------------------------------------------------------------- outputs


def frontier_plot(candidates: list[Candidate], chosen: Candidate | None, load: LoadProfile, path: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(r.latency.p99, r.throughput_rps, c.index, r.level) for c in candidates for r in c.results
           if r.ok and r.latency.p99 and r.throughput_rps]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.8), dpi=110)
    ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color="tab:gray", alpha=0.7, label="candidate x level")
    frontier, best_y = [], -1.0
    for p in sorted(pts):  # Pareto: lower latency and higher throughput
        if p[1] > best_y:
            frontier.append(p)
            best_y = p[1]
    ax.plot([p[0] for p in frontier], [p[1] for p in frontier], "-o", color="tab:blue", ms=4, label="frontier")
    if chosen is not None:
        r = next((r for r in chosen.results if r.level == chosen.best_level), None)
        if r is not None:
            ax.scatter([r.latency.p99], [r.throughput_rps], s=120, marker="*", color="tab:orange", zorder=5,
                       label=f"chosen #{chosen.index:02d} at {level_str(r.level)}")
    for x, y, idx, lv in pts:
        ax.annotate(f"#{idx}@{level_str(lv)}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    if load.slo.latency_p99_ms:
        ax.axvline(load.slo.latency_p99_ms, color="tab:red", ls="--", lw=1, label="P99 latency SLO")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("P99 request latency (ms)")
    ax.set_ylabel("throughput (requests/s)")
    ax.set_title("autotuner: throughput vs P99 latency (#candidate@concurrency)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def chosen_yaml(chosen: Candidate, base_path: Path) -> str:
    header = (f"# Chosen by `python -m loadtest tune` (candidate #{chosen.index:02d}, {chosen.score:.2f} req/s at "
              f"{level_str(chosen.best_level)} streams within the SLO), from {base_path}.\n"
              f"# Changed: {', '.join(f'{k}={v}' for k, v in chosen.changed.items()) or 'nothing (the base won)'}\n"
              "# Use: python -m builders repository --profile <this file> --out build/model_repository\n")
    profile = dict(chosen.serving_profile)
    for key in ("engine_dir", "tokenizer_dir"):  # project-relative where possible, like builders/profiles/*.yaml
        path = Path(str(profile.get(key, "")))
        if path.is_absolute() and path.is_relative_to(PROJECT_ROOT):
            profile[key] = str(path.relative_to(PROJECT_ROOT))
    return header + yaml.safe_dump(profile, sort_keys=False)


def report(candidates: list[Candidate], chosen: Candidate | None, load: LoadProfile, stopped: str, plot: Path | None,
           base_path: Path, budget_s: float) -> str:
    slo = ", ".join(f"{k} {v:g}" for k, v in load.slo.limits().items()) or "none"
    lines = [f"# Autotuner: {'chose #%02d' % chosen.index if chosen else 'no configuration met the SLO'}", "",
             f"Base serving profile `{base_path}`; load profile `{load.name}` (levels "
             f"{', '.join(level_str(v) for v in load.load.levels)}); SLO per level: {slo}. Budget {budget_s:.0f} s; "
             f"stopped: {stopped}. Score = highest throughput at a level meeting the SLO.", "",
             "| # | changed from base | score (req/s) | at | per level: req/s / P99 ms / TTFT P99 ms | time (s) |",
             "| ---: | --- | ---: | ---: | --- | ---: |"]
    for c in candidates:
        per = "; ".join(f"{level_str(r.level)}: {r.throughput_rps or 0:.2f} / {r.latency.p99 or 0:.0f} / "
                        f"{r.ttft.p99 or 0:.0f}" if r.ok else f"{level_str(r.level)}: failed" for r in c.results)
        what = ", ".join(f"`{k}={v}`" for k, v in c.changed.items()) or "base"
        mark = " **chosen**" if chosen is not None and c.index == chosen.index else ""
        score = c.error and f"error: {c.error}" or ("–" if c.score is None else f"{c.score:.2f}")
        lines.append(f"| {c.index:02d}{mark} | {what} | {score} | {level_str(c.best_level) if c.best_level else '–'} | "
                     f"{per} | {c.seconds:.0f} |")
    if plot is not None:
        lines += ["", f"![frontier]({plot.name})"]
    if chosen is not None:
        lines += ["", "Chosen profile: [chosen-profile.yaml](chosen-profile.yaml)"]
    lines.append("")
    return "\n".join(lines)


def run_tune(opts: TuneOptions, evaluate: Evaluator | None = None) -> TuneOutcome:
    from builders.profile import ServingProfile

    load = load_profile(opts.profile).with_overrides(levels=opts.levels)
    dims, min_gain = load_space(opts.space)
    base_path = Path(opts.base_profile)
    serving_profile = ServingProfile.from_yaml(base_path).resolved()
    serving = serving_profile.model_dump(mode="json")
    engine_dir = Path(serving_profile.engine_dir)
    engine_build = json.loads((engine_dir / "config.json").read_text())["build_config"] if (
        engine_dir / "config.json").exists() else {}
    out = Path(opts.out_dir) if opts.out_dir else new_run_dir("tune", opts.results_root)
    out.mkdir(parents=True, exist_ok=True)
    if evaluate is None:
        evaluate = ServerEvaluator(load, engine_dir, opts.checkpoint, Path(serving_profile.tokenizer_dir))
    say = print if opts.progress else (lambda _s: None)
    candidates, chosen, stopped = search(load, serving, engine_build, dims, min_gain, evaluate, out, opts.budget_s,
                                         opts.max_candidates, opts.first_estimate_s, say)
    plot = frontier_plot(candidates, chosen, load, out / "frontier.png")
    if chosen is not None:
        if not chosen.serving_profile:
            chosen.serving_profile = apply_point(serving, chosen.settings)
        (out / "chosen-profile.yaml").write_text(chosen_yaml(chosen, base_path))
    (out / "report.md").write_text(report(candidates, chosen, load, stopped, plot, base_path, opts.budget_s))
    (out / "tune.json").write_text(json.dumps({"stopped": stopped, "chosen": chosen.index if chosen else None,
                                               "candidates": [c.to_dict() for c in candidates]}, indent=1,
                                              default=str) + "\n")
    code = slo_mod.EXIT_OK if chosen is not None else (
        slo_mod.EXIT_ERROR if all(c.error for c in candidates) else slo_mod.EXIT_SLO_FAILED)
    return TuneOutcome(out, candidates, chosen, code, stopped)
