"""``python -m loadtest diagnose``: where does a request's time go, which layer dominates, what to change.

Three sources, each used when available:

1. Triton's trace (per composing model, per request): exact per-stage times. Available when diagnose starts
   the server itself (``--repository``, the default without ``--url``: it adds ``--trace-config`` flags), or
   when a running server was started with a trace file (then diagnose turns tracing on through the trace
   extension, ``/v2/trace/setting``, and restores it afterwards).
2. perf_analyzer's server-side breakdown (queue / compute input / infer / output per composing model) and its
   client-side latency, TTFT and TPOT: always.
3. Prometheus metrics over the run: Triton's ``nv_inference_*`` and ``nv_cpu_utilization`` always; the CPU
   engine's ``llm_*`` series when it exports them (queued requests, active slots, server-side TTFT).

The method (as in the seed): low utilisation with little queueing -> the feeding path (the client offers too
little); high queue time -> batching/instances of that stage; a compute stage dominating -> that stage;
the engine dominating -> split prefill (slots, token budget, prompt length) from decode (the engine itself).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import trace as tracing
from .commands import Endpoints
from .results import LevelResult
from .spec import DEFAULT_TOKENIZER, PROJECT_ROOT, Inputs, Load, LoadProfile, Measurement, TokenDist, load_profile
from .sweep import RESULTS_DIR, new_run_dir, run_sweep

LAYERS = ("client/network", "queue", "preprocessing", "engine: wait + prefill", "engine: decode", "triton (other)")


@dataclass
class DiagnoseOptions:
    url: str | None = None  # gRPC of a running server; None = start one from ``repository``
    metrics_url: str | None = None
    http_url: str | None = None
    repository: Path | None = None
    profile: str | None = None
    concurrency: int = 4
    requests: int = 32
    max_tokens: int = 32
    prompt_tokens: int = 64
    tokenizer: Path | None = None
    out_dir: Path | None = None
    results_root: Path = RESULTS_DIR
    server_ready_timeout_s: float = 300.0


@dataclass
class Diagnosis:
    out_dir: Path
    source: str  # "trace" or "perf_analyzer"
    stages: dict[str, float]  # ms per request
    layers: dict[str, float]  # ms per request
    dominant_layer: str
    dominant_stage: str
    advice: list[str]
    client: dict = field(default_factory=dict)
    gauges: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        total = sum(self.layers.values()) or 1.0
        lines = [f"diagnose ({self.source}): a request spends {total:.1f} ms on average"]
        for name in LAYERS:
            if name in self.layers:
                v = self.layers[name]
                mark = "  <== dominant" if name == self.dominant_layer else ""
                lines.append(f"  {name:24s} {v:9.2f} ms  {100 * v / total:5.1f}%{mark}")
        lines.append(f"dominant layer: {self.dominant_layer}  (largest stage: {self.dominant_stage})")
        lines += [f"advice: {a}" for a in self.advice]
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"report: {self.out_dir / 'diagnose.md'}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


# ---------------------------------------------------------------------------------------------- config


def read_repository(repo: Path | None) -> dict[str, dict]:
    """Per model: instances, dynamic batcher settings and string parameters, from config.pbtxt files."""
    if repo is None or not Path(repo).is_dir():
        return {}
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    out = {}
    for cfg_path in sorted(Path(repo).glob("*/config.pbtxt")):
        cfg = mc.ModelConfig()
        try:
            text_format.Parse(cfg_path.read_text(), cfg)
        except text_format.ParseError:
            continue
        name = cfg.name or cfg_path.parent.name
        db = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
        out[name] = {
            "instances": sum(g.count or 1 for g in cfg.instance_group) or 1,
            "max_batch_size": cfg.max_batch_size,
            "max_queue_delay_us": db.max_queue_delay_microseconds if db else None,
            "preferred_batch_sizes": list(db.preferred_batch_size) if db else [],
            "parameters": {k: v.string_value for k, v in cfg.parameters.items()},
        }
    return out


def engine_build(config: dict) -> dict:
    llm = next((m for m in config.values() if "engine_dir" in m.get("parameters", {})), None)
    if not llm:
        return {}
    path = Path(llm["parameters"]["engine_dir"]) / "config.json"
    try:
        return json.loads(path.read_text()).get("build_config", {})
    except (OSError, json.JSONDecodeError):
        return {}


# ---------------------------------------------------------------------------------------------- trace API


def _http_json(url: str, payload: dict | None = None, timeout: float = 5.0) -> dict:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode() or "{}")


class RemoteTrace:
    """Turn on timestamp tracing of a running server that has a trace file; restore settings afterwards."""

    def __init__(self, http_url: str | None):
        self.http_url = http_url
        self.previous: dict | None = None
        self.base: Path | None = None
        self.before: set[Path] = set()
        self.problem = ""

    def __enter__(self) -> "RemoteTrace":
        if not self.http_url:
            self.problem = "no HTTP URL for the trace extension"
            return self
        try:
            self.previous = _http_json(f"{self.http_url}/v2/trace/setting")
        except (OSError, ValueError) as exc:
            self.problem = f"trace settings unavailable ({exc})"
            return self
        file = self.previous.get("trace_file") or ""
        if not file:
            self.problem = ("the server has no trace file (Triton refuses to set one over the network): start it "
                            "with `-- --trace-config triton,file=/tmp/trace.json`, or let diagnose start its own "
                            "server (--repository)")
            self.previous = None
            return self
        self.base = Path(file)
        self.before = set(tracing.trace_files(self.base))
        try:
            _http_json(f"{self.http_url}/v2/trace/setting",
                       {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "1"})
        except (OSError, ValueError) as exc:
            self.problem = f"could not enable tracing ({exc})"
            self.base = None
        return self

    def files(self) -> list[Path]:
        if self.base is None:
            return []
        time.sleep(0.5)
        return [p for p in tracing.trace_files(self.base) if p not in self.before and p != self.base]

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None and self.http_url:
            keep = {k: self.previous[k] for k in ("trace_level", "trace_rate", "trace_count", "log_frequency")
                    if k in self.previous}
            try:
                _http_json(f"{self.http_url}/v2/trace/setting", keep)
            except (OSError, ValueError):
                pass


# ---------------------------------------------------------------------------------------------- analysis


def _stages_from_trace(mean: dict[str, float], client_latency: float | None) -> dict[str, float]:
    stages = {
        "ensemble queue": mean["ensemble_queue"],
        "preprocessing queue": mean["pre_queue"],
        "preprocessing compute": mean["pre_compute"],
        "llm queue": mean["llm_queue"],
        "llm enqueue (execute)": mean["llm_compute"],
        "engine wait + prefill": mean["engine_prefill"],
        "engine decode": mean["engine_decode"],
        "gRPC send (last response)": mean["send_last"],
        "triton other (hand-offs)": mean["other"],
    }
    if client_latency is not None:
        stages["client/network"] = max(client_latency - mean["server_total"], 0.0)
    return stages


def _stages_from_pa(r: LevelResult) -> tuple[dict[str, float], list[str]]:
    """Without a trace: per-invocation server times from perf_analyzer + client TTFT/latency."""
    notes = ["no Triton trace: stages estimated from perf_analyzer's per-model breakdown and client timings; "
             "client/network time cannot be separated from the engine's"]
    comp = r.composing
    ms = lambda m, k: (comp.get(m, {}).get(k) or 0.0) / 1000  # noqa: E731
    pre_q, pre_c = ms("preprocessing", "queue_us"), sum(ms("preprocessing", k) for k in
                                                        ("compute_input_us", "compute_infer_us", "compute_output_us"))
    llm_q, llm_c = ms("llm", "queue_us"), sum(ms("llm", k) for k in
                                              ("compute_input_us", "compute_infer_us", "compute_output_us"))
    latency = r.latency.avg or 0.0
    ttft = r.ttft.avg or latency
    prefill = max(ttft - pre_q - pre_c - llm_q - llm_c, 0.0)
    decode = max(latency - ttft, 0.0)
    stages = {"ensemble queue": (r.server.get("queue_us") or 0.0) / 1000, "preprocessing queue": pre_q,
              "preprocessing compute": pre_c, "llm queue": llm_q, "llm enqueue (execute)": llm_c,
              "engine wait + prefill": prefill, "engine decode": decode}
    return stages, notes


def layers_of(stages: dict[str, float]) -> dict[str, float]:
    g = stages.get
    layers = {
        "client/network": g("client/network", 0.0),
        "queue": g("ensemble queue", 0.0) + g("preprocessing queue", 0.0) + g("llm queue", 0.0),
        "preprocessing": g("preprocessing compute", 0.0),
        "engine: wait + prefill": g("engine wait + prefill", 0.0) + g("llm enqueue (execute)", 0.0),
        "engine: decode": g("engine decode", 0.0),
        "triton (other)": g("triton other (hand-offs)", 0.0) + g("gRPC send (last response)", 0.0),
    }
    if "client/network" not in stages:
        layers.pop("client/network")
    if "triton other (hand-offs)" not in stages:  # only a trace separates it from the engine's time
        layers.pop("triton (other)")
    return layers


def advise(layers: dict[str, float], stages: dict[str, float], r: LevelResult, gauges: dict, config: dict,
           build: dict, concurrency: int) -> list[str]:
    total = sum(layers.values()) or 1.0
    dominant = max(layers, key=layers.get)
    advice: list[str] = []
    cpu = (gauges.get("nv_cpu_utilization") or {}).get("mean")
    queued = (gauges.get("llm_engine_queued_requests") or {}).get("mean")
    active = (gauges.get("llm_engine_active_slots") or {}).get("max")
    slots = build.get("max_batch_size")
    budget = build.get("max_num_tokens")

    def share(name: str) -> float:
        return layers.get(name, 0.0) / total

    if dominant == "queue":
        worst = max(("preprocessing queue", "llm queue", "ensemble queue"), key=lambda k: stages.get(k, 0.0))
        model = worst.split()[0]
        cfg = config.get(model, {})
        delay, preferred = cfg.get("max_queue_delay_us"), cfg.get("preferred_batch_sizes")
        text = (f"requests wait {stages.get(worst, 0):.1f} ms in the {model} queue ({100 * share('queue'):.0f}% of "
                f"the request).")
        if delay:
            text += (f" Its dynamic batcher holds requests up to max_queue_delay_us={delay} "
                     f"({delay / 1000:g} ms) to fill preferred_batch_sizes={preferred or '[max_batch_size]'}: "
                     f"lower max_queue_delay_us (0-1000) or the preferred sizes in the serving profile.")
        else:
            text += (f" It has {cfg.get('instances', '?')} instance(s): add instances (serving profile "
                     f"{model}.instances) or let its dynamic batcher batch (preferred_batch_sizes, a small "
                     "max_queue_delay_us).")
        advice.append(text)
    elif dominant == "preprocessing":
        advice.append(f"tokenisation dominates ({stages.get('preprocessing compute', 0):.1f} ms/request): add "
                      "preprocessing instances, batch it (preferred_batch_sizes), or send shorter prompts.")
    elif dominant == "engine: wait + prefill":
        if queued and queued >= 0.5:
            advice.append(f"requests wait for a KV-cache slot (on average {queued:.1f} queued; "
                          f"{slots} slots): build the engine with more slots (max_batch_size) or lower concurrency.")
        elif slots and concurrency > slots:
            advice.append(f"concurrency {concurrency} exceeds the engine's {slots} slots: requests wait for a slot "
                          "before prefill; build with more slots (max_batch_size).")
        else:
            advice.append(f"prefill (TTFT) dominates: a larger per-step token budget (max_num_tokens={budget}) "
                          "prefills in fewer chunks; shorter prompts or a faster engine variant (int8 weights) help.")
    elif dominant == "engine: decode":
        tpot = r.tpot.p50
        advice.append(f"the engine's decoding dominates (TPOT P50 {tpot:.1f} ms): the serving path is not the "
                      "bottleneck. Faster per-token compute (quantised engine: int8_wo / int8_sq), more cpu_threads, "
                      "or more slots (max_batch_size) for throughput at the cost of TPOT." if tpot else
                      "the engine's decoding dominates: the serving path is not the bottleneck.")
    elif dominant == "client/network":
        advice.append("time is lost outside the server (client or network): run the load generator on another "
                      "machine or with more threads, and check the client's CPU.")
    else:
        advice.append("Triton's own time dominates (the ensemble's hand-off from preprocessing to the llm, and the "
                      "last response's way out through the ensemble and its gRPC write), not the models: a BLS model "
                      "instead of the ensemble saves the hand-offs.")
    if cpu is not None and cpu < 0.5 and share("queue") < 0.1:
        advice.append(f"CPU utilisation is low ({100 * cpu:.0f}%) and little is queued: the feeding path limits "
                      f"throughput; offer more load (concurrency > {concurrency}) before tuning the server.")
    if cpu is not None and cpu > 0.9:
        advice.append(f"CPU utilisation is {100 * cpu:.0f}%: the machine is saturated (other processes count too); "
                      "more instances or threads will not help, less work per token will.")
    if active is not None and slots and active >= slots and dominant != "engine: wait + prefill":
        advice.append(f"all {slots} engine slots were busy at times: more slots may raise throughput.")
    return advice


def markdown(d: Diagnosis, r: LevelResult, concurrency: int) -> str:
    total = sum(d.layers.values()) or 1.0
    lines = [f"# Diagnosis: {d.dominant_layer} dominates", "",
             f"Source of the per-stage times: **{d.source}**. Load: {concurrency} concurrent streams, "
             f"{r.requests} requests, latency P50 {r.latency.p50 or 0:.1f} ms, TTFT P50 {r.ttft.p50 or 0:.1f} ms, "
             f"TPOT P50 {r.tpot.p50 or 0:.2f} ms, {r.throughput_rps or 0:.2f} req/s.", "",
             "## Where a request's time goes (mean per request)", "",
             "| layer | ms | share |", "| --- | ---: | ---: |"]
    for name in LAYERS:
        if name in d.layers:
            v = d.layers[name]
            bold = "**" if name == d.dominant_layer else ""
            lines.append(f"| {bold}{name}{bold} | {v:.2f} | {100 * v / total:.1f}% |")
    lines += ["", "| stage | ms |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in d.stages.items()]
    lines += ["", "## Advice", ""] + [f"- {a}" for a in d.advice]
    if d.gauges:
        lines += ["", "## Metrics sampled during the run", "", "| gauge | mean | max |", "| --- | ---: | ---: |"]
        lines += [f"| {k} | {v['mean']:.3g} | {v['max']:.3g} |" for k, v in d.gauges.items()]
    if d.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in d.notes]
    lines += ["", "Load-test report of the run: [load/report.md](load/report.md)", ""]
    return "\n".join(lines)


def _tokenizer_from_config(config: dict) -> Path | None:
    for m in config.values():
        if tok := m.get("parameters", {}).get("tokenizer_dir"):
            return Path(tok)
    return None


def _load_profile(opts: DiagnoseOptions) -> LoadProfile:
    if opts.profile:
        base = load_profile(opts.profile)
        return base.with_overrides(levels=[float(opts.concurrency)], request_count=opts.requests)
    return LoadProfile(
        name="diagnose", description="diagnose load", load=Load(mode="concurrency", levels=[opts.concurrency]),
        inputs=Inputs(prompt_tokens=TokenDist(mean=opts.prompt_tokens), output_tokens=TokenDist(mean=opts.max_tokens),
                      num_prompts=16),
        measurement=Measurement(request_count=opts.requests, requests_per_stream=2, timeout_s=600,
                                warmup_requests=2))


def run_diagnose(opts: DiagnoseOptions) -> Diagnosis:
    from serving.launcher import ServerConfig, TritonServer

    out = Path(opts.out_dir) if opts.out_dir else new_run_dir("diagnose", opts.results_root)
    out.mkdir(parents=True, exist_ok=True)
    profile = _load_profile(opts)
    notes: list[str] = []
    server = None
    trace_base = out / "trace" / "trace.json"
    repo = opts.repository
    if opts.url is None:
        repo = Path(repo or PROJECT_ROOT / "build" / "model_repository")
        trace_base.parent.mkdir(parents=True, exist_ok=True)
        extra = ["--trace-config", "mode=triton", "--trace-config", f"triton,file={trace_base}",
                 "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                 "--trace-config", "triton,log-frequency=1"]
        cfg = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                           log_file=out / "tritonserver.log", extra_args=extra)
        server = TritonServer(cfg, ready_timeout=opts.server_ready_timeout_s)
        server.start()
        server.wait_ready()
        url, metrics_url, http_url = server.urls.grpc, server.urls.metrics, server.urls.http
    else:
        url = opts.url
        ep = Endpoints.from_grpc(url)
        metrics_url = opts.metrics_url or ep.metrics
        http_url = opts.http_url or ep.http
    config = read_repository(repo)
    tokenizer = opts.tokenizer or _tokenizer_from_config(config) or DEFAULT_TOKENIZER
    try:
        if server is None:
            with RemoteTrace(http_url) as remote:
                outcome = run_sweep(profile, url=url, metrics_url=metrics_url, tokenizer=tokenizer,
                                    out_dir=out / "load", progress=False)
                files = remote.files()
            if remote.problem:
                notes.append(remote.problem)
        else:
            outcome = run_sweep(profile, url=url, metrics_url=metrics_url, tokenizer=tokenizer,
                                out_dir=out / "load", progress=False)
            time.sleep(0.3)
            files = tracing.trace_files(trace_base)
    finally:
        if server is not None:
            server.stop()
    if server is not None:
        files = tracing.trace_files(trace_base)  # everything, now that the server has flushed at exit
    r = outcome.results[0]
    if not r.ok:
        raise RuntimeError(f"the diagnose load failed: {r.error}")
    spans = tracing.load_spans(files) if files else {}
    per_request = tracing.request_stages(spans)
    # The warm-up requests are traced too: keep the last ones (the measured requests).
    per_request = per_request[-r.requests:] if r.requests else per_request
    mean = tracing.mean_stages(per_request)
    if mean:
        source = f"Triton trace ({len(per_request)} requests)"
        stages = _stages_from_trace(mean, r.latency.avg)
        notes.append(f"{mean['responses']:.1f} responses per request; first/last token = when Triton's gRPC frontend "
                     "started writing the first/last response (GRPC_SEND_START), which includes each response's way "
                     "from the llm through the ensemble")
        if mean["responses"] <= 1:
            notes.append("one response per request (not streamed): the trace has no first-token time, so 'engine "
                         "wait + prefill' holds the whole generation and 'engine decode' is 0")
    else:
        source = "perf_analyzer"
        stages, more = _stages_from_pa(r)
        notes += more
    layers = layers_of(stages)
    gauges = (r.metrics or {}).get("gauges", {})
    build = engine_build(config)
    dominant_layer = max(layers, key=layers.get)
    dominant_stage = max(stages, key=stages.get)
    advice = advise(layers, stages, r, gauges, config, build, int(profile.load.levels[0]))
    if not (r.metrics or {}).get("engine_histograms"):
        notes.append("the engine's llm_* histograms are absent on this server (older engine): server-side TTFT "
                     "and slot gauges were not used")
    diagnosis = Diagnosis(out, source, stages, layers, dominant_layer, dominant_stage, advice,
                          client={"latency_ms": r.latency.__dict__, "ttft_ms": r.ttft.__dict__,
                                  "tpot_ms": r.tpot.__dict__, "throughput_rps": r.throughput_rps},
                          gauges=gauges, config=config, notes=notes)
    (out / "diagnose.json").write_text(json.dumps({**diagnosis.to_dict(), "engine_build": build,
                                                   "per_request": [s.as_dict() for s in per_request],
                                                   "metrics": r.metrics}, indent=1, default=str) + "\n")
    (out / "diagnose.md").write_text(markdown(diagnosis, r, int(profile.load.levels[0])))
    return diagnosis
