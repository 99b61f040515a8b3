"""The chart's monitoring and autoscaling queries, evaluated by a real Prometheus (issue 20).

Offline, for every values profile that renders them: `promtool check rules` on the PrometheusRule's groups, and
`promtool test rules` unit tests that make every alert fire on synthetic series and stay quiet on healthy ones.

Live, once per target (one module-scoped run each, ~1.5 min): Prometheus (scripts/prometheus-tools.sh) scrapes a
tritonserver and an OpenAI front door through the scrape endpoints the rendered ServiceMonitor declares, with the
labels its relabelling gives them in Kubernetes (tests/prometheus_harness.py), and loads the rendered rules; then
32 concurrent streams (8 slots + 24 queued) for 30 s.
- cpu: the CPU profile rendered with KEDA (every trigger on) against the session server (CPU layout);
- gpu: the GPU profile ci/keda-autoscaling (every trigger on) against the GPU layout with the ``tensorrt_llm``
  stand-in over the same CPU engine, which exports TensorRT-LLM's own metric families (serving/trtllm_metrics.py),
  started with the container's metrics flags from the rendered Deployment.
Thresholds are sized to the test engine's 8 slots, alert `for:` 10 s. Checked for each:
- every KEDA query, HPA metric, recording rule, alert expression and dashboard expression parses, KEDA's return
  exactly one series, and each returns data once traffic has flowed (but the series only a GPU node or
  kube-state-metrics has: NOT_FROM_THE_SERVER);
- each trigger crosses its threshold under the overload and falls back below it after the load stops;
- cpu: TritonLLMQueueBacklog goes pending, then firing.
The runs' series are kept in build/prometheus/overload-run[-gpu].json (scripts/autoscaling_plot.py draws the cpu one).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import yaml

from tests.epp_scrape import EndpointPickerScrape, shipped_path
from tests.prometheus_harness import (FULLNAME, NAMESPACE, POD, RELEASE, ROOT, Prometheus, finite, pod_labels,
                                      promtool, rule_groups, scrape_targets, tools)

CHART = ROOT / "helm" / "triton-llm"
CRD_APIS = ["monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor",
            "monitoring.coreos.com/v1/PrometheusRule", "keda.sh/v1alpha1/ScaledObject"]
# Profiles whose render has a PrometheusRule (helm/triton-llm/ci/*; cpu models a cluster without the CRDs).
RULE_PROFILES = ["gpu-fp8-h100", "gpu-int8-a10", "keda-autoscaling", "hardened-readonly"]
SLOTS = 8  # tests/stack.py TEST_LIMITS max_batch_size; the engine queue holds 32 (llm max_queue_size)
STREAMS = 32  # 8 in slots + 24 waiting: overload without rejections
LOAD_S = 45.0
MAX_TOKENS = 96
GPU_STEP_MS = 20.0  # the GPU target's decode iteration (8 rows of a 7B model): 400 tokens/s, the whole engine
# The live profiles: KEDA with every trigger on, thresholds for one test pod of 8 slots (the backlog alert's too:
# the closed-loop queue hovers between ~16 and 24, and one evaluation below the chart's 16 would reset it), alerts
# that hold 10 s instead of 10 min, rules evaluated every 2 s. On GPU the engine-queue trigger reads the llm's own
# backlog gauge (TensorRT-LLM's backend exports no backlog beyond its batch slots).
LIVE_VALUES = {
    "autoscaling": {"mode": "keda", "keda": {"triggers": {
        "engineQueue": {"enabled": True, "thresholdPerReplica": "4"},
        "activeSlots": {"enabled": True, "thresholdPerReplica": "6"},
        "kvCacheOccupancy": {"enabled": True, "threshold": "0.1"},
        "ttft": {"enabled": True, "thresholdSeconds": "0.3"}}}},
    "metrics": {"prometheusRule": {"for": "10s", "interval": "2s", "queueThreshold": 8}},
    # The front door also relays the engine gauges for an inference gateway's endpoint picker (scraped below).
    "inferenceGateway": {"enabled": True},
}
#: target -> (values profile, server layout, values over LIVE_VALUES, the KEDA triggers that renders)
LIVE = {"cpu": ("cpu", "cpu", {}, {"engine-queue", "active-slots", "kv-cache-occupancy", "ttft"}),
        # ttft off: it reads Triton's first-response histogram, which this Triton (2.51) does not export
        # (FIRST_RESPONSE_ON_GPU_ONLY).
        "gpu": ("keda-autoscaling", "trtllm-standin",
                {"autoscaling": {"keda": {"triggers": {"ttft": {"enabled": False}}}}},
                {"engine-queue", "active-slots", "kv-cache-occupancy"})}
# GPU has no HPA default (helm/triton-llm hpa.yaml): busy slots, as the docs suggest.
HPA_GPU_METRICS = [{"name": "nv_trt_llm_request_metrics", "averageValue": "6",
                    "matchLabels": {"request_type": "scheduled"}}]
# Series no test server exports: kube-state-metrics (pod restarts; the promtool unit tests cover that alert), and
# what only a GPU node has — Triton's GPU metrics (NVML) and the DCGM exporter's.
NOT_FROM_THE_SERVER = ("kube_pod_container_status_restarts_total", "nv_gpu_utilization", "nv_gpu_memory_used_bytes",
                       "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")
# The GPU profiles' time to first token: Triton's own histogram (metrics.histogramLatencies). The 2.51 tritonserver
# of the pytriton wheel registers no such family with --metrics-config=histogram_latencies=true (checked: none on its
# metrics port after traffic through the GPU layout); the pinned 26.07 server's own tests read it for ensembles.
FIRST_RESPONSE_ON_GPU_ONLY = "nv_inference_first_response_histogram_ms"


SCRAPE_KEY = "prometheus-test-key"


def run_json(target: str) -> Path:
    return ROOT / "build" / "prometheus" / ("overload-run.json" if target == "cpu" else f"overload-run-{target}.json")


# ------------------------------------------------------------------------------------------- render


@pytest.fixture(scope="session")
def helm_tools():
    proc = __import__("subprocess").run(["bash", str(ROOT / "scripts" / "helm-tools.sh")], capture_output=True,
                                        text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/helm-tools.sh: {proc.stderr[-2000:]}", pytrace=False)
    return ROOT / "build" / "tools" / "bin" / "helm"


@pytest.fixture(scope="session")
def prom_tools():
    try:
        return tools()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


def render(helm: Path, tmp: Path, profile: str, values: dict | None = None, apis: list[str] = CRD_APIS) -> list[dict]:
    import subprocess

    args = [str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", "1.33.0",
            "-f", str(CHART / "ci" / f"{profile}-values.yaml")]
    if values:
        extra = tmp / f"extra-{len(list(tmp.glob('extra-*')))}.yaml"
        extra.write_text(yaml.safe_dump(values))
        args += ["-f", str(extra)]
    for a in apis:
        args += ["--api-versions", a]
    env = {"HELM_CACHE_HOME": str(tmp / "c"), "HELM_CONFIG_HOME": str(tmp / "g"), "HELM_DATA_HOME": str(tmp / "d"),
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def kind(docs: list[dict], k: str) -> dict | None:
    found = [d for d in docs if d["kind"] == k]
    return found[0] if found else None


def rendered_queries(docs: list[dict]) -> dict[str, dict[str, str]]:
    """{"keda": {trigger: query}, "hpa": {metric: query}, "record": {...}, "alert": {...}, "panel": {...}}."""
    out: dict[str, dict[str, str]] = {"keda": {}, "hpa": {}, "record": {}, "alert": {}, "panel": {}}
    if so := kind(docs, "ScaledObject"):
        out["keda"] = {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"]}
    if hpa := kind(docs, "HorizontalPodAutoscaler"):
        for m in hpa["spec"]["metrics"]:
            if m["type"] == "Pods":
                labels = ",".join(f'{k}="{v}"' for k, v in (m["pods"]["metric"].get("selector", {})
                                                             .get("matchLabels", {})).items())
                # What a metrics adapter serves per pod: the series of that name on the release's pods.
                sel = f'namespace="{NAMESPACE}",pod=~"{FULLNAME}-.*"' + (f",{labels}" if labels else "")
                out["hpa"][m["pods"]["metric"]["name"]] = f'sum by (pod) ({m["pods"]["metric"]["name"]}{{{sel}}})'
    if rule := kind(docs, "PrometheusRule"):
        for g in rule["spec"]["groups"]:
            for r in g["rules"]:
                out["record" if "record" in r else "alert"][r.get("record") or r["alert"]] = r["expr"]
    for cm in (d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")):
        (raw,) = cm["data"].values()
        for p in json.loads(raw)["panels"]:
            for t in p["targets"]:
                out["panel"][f'{p["title"]} / {t["legendFormat"]}'] = t["expr"]
    return out


# ------------------------------------------------------------------------------------------- promtool, offline


@pytest.mark.parametrize("profile", [*RULE_PROFILES, "cpu-live"])
def test_promtool_check_rules(helm_tools, prom_tools, tmp_path, profile):
    docs = (render(helm_tools, tmp_path, "cpu", LIVE_VALUES) if profile == "cpu-live"
            else render(helm_tools, tmp_path, profile))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(kind(docs, "PrometheusRule"))))
    proc = promtool("check", "rules", str(rules), binary=prom_tools["promtool"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def _dur_s(d: str) -> int:
    n, unit = re.fullmatch(r"(\d+)(s|m|h)", d).groups()
    return int(n) * {"s": 1, "m": 60, "h": 3600}[unit]


def _series(name: str, labels: dict[str, str], values: str) -> dict:
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def alert_unit_tests(docs: list[dict], gpu: bool) -> dict:
    """promtool test rules cases: each alert fires on a bad synthetic pod and stays quiet on a healthy one."""
    rule = kind(docs, "PrometheusRule")
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    pod = pod_labels("triton", "metrics")
    job = {**pod, "job": FULLNAME, "instance": "10.0.0.7:8002"}
    ens = {**job, "model": "ensemble", "version": "1"}
    llm = {**job, "model": "llm", "version": "1"}
    minutes = 40
    n = minutes * 4  # one sample per 15 s

    def ramp(step: float) -> str:
        return f"0+{step}x{n}"

    def const(v: float) -> str:
        return f"{v}x{n}"

    def ttft(slow: bool) -> list[dict]:
        # 10 requests per 15 s, all in one bucket: above the P99 threshold (slow) or well below it.
        if gpu:
            name, les, hit = "nv_inference_first_response_histogram_ms_bucket", ["100", "1000", "5000", "+Inf"], (
                "5000" if slow else "100")
            base = ens
        else:
            name, les, hit = "llm_time_to_first_token_seconds_bucket", ["0.1", "1", "5", "+Inf"], "5" if slow else "0.1"
            base = job | {"model": "llm", "version": "1"}
        return [_series(name, {**base, "le": le}, ramp(10) if float(le) >= float(hit) else const(0)) for le in les]

    def queued(v: float) -> list[dict]:  # the llm's backlog gauge, both targets
        return [_series("llm_engine_queued_requests", llm, const(v))]

    def requests(fail_per_step: float) -> list[dict]:
        return [_series("nv_inference_request_success", ens, ramp(100)),
                _series("nv_inference_request_failure", ens, ramp(fail_per_step))]

    ksm = {"namespace": NAMESPACE, "pod": POD, "container": "triton", "job": "kube-state-metrics"}

    def restarts(step: float) -> list[dict]:
        return [_series("kube_pod_container_status_restarts_total", ksm, ramp(step))]

    healthy = ttft(False) + queued(0) + requests(0) + restarts(0)
    bad = {
        "TritonLLMTimeToFirstTokenHigh": ttft(True) + queued(0) + requests(0) + restarts(0),
        "TritonLLMQueueBacklog": ttft(False) + queued(40) + requests(0) + restarts(0),
        "TritonLLMErrorRateHigh": ttft(False) + queued(0) + requests(5) + restarts(0),
        "TritonLLMPodRestarting": ttft(False) + queued(0) + requests(0) + restarts(1 / 5),  # 1 per 75 s
        "TritonLLMMetricsAbsent": ttft(False) + queued(0) + restarts(0),
    }
    assert set(bad) == set(alerts), f"alerts without a unit test: {set(alerts) - set(bad)}"
    at = f"{minutes - 5}m"
    tests = []
    for name, series in bad.items():
        tests.append({"interval": "15s", "input_series": series,
                      "alert_rule_test": [{"eval_time": at, "alertname": name,
                                           "exp_alerts": [{"exp_labels": _expected_labels(name, alerts[name])}]}]})
        tests.append({"interval": "15s", "input_series": healthy,
                      "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": []}]})
    return {"tests": tests}


def _expected_labels(name: str, alert: dict) -> dict:
    labels = dict(alert["labels"])
    if name == "TritonLLMPodRestarting":
        labels["pod"] = POD
    elif name != "TritonLLMMetricsAbsent":
        labels.update(namespace=NAMESPACE, release=RELEASE)
    else:  # absent() keeps the selector's equality matchers
        labels.update(namespace=NAMESPACE)
    return labels


@pytest.mark.parametrize("profile", [*RULE_PROFILES, "cpu-live"])
def test_promtool_alert_unit_tests(helm_tools, prom_tools, tmp_path, profile):
    docs = (render(helm_tools, tmp_path, "cpu", LIVE_VALUES) if profile == "cpu-live"
            else render(helm_tools, tmp_path, profile))
    gpu = "nv_trt_llm_request_metrics" in json.dumps(kind(docs, "PrometheusRule"))
    groups = rule_groups(kind(docs, "PrometheusRule"))
    for g in groups["groups"]:  # annotations are templates of $value: the subject here is expr, for and labels
        for r in g["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    cases = alert_unit_tests(docs, gpu)
    cases["rule_files"] = ["rules.yaml"]
    cases["evaluation_interval"] = "15s"
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(cases, sort_keys=False))
    proc = promtool("test", "rules", "tests.yaml", cwd=tmp_path, binary=prom_tools["promtool"])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ------------------------------------------------------------------------------------------- live


class Run:
    """What the overload run observed (filled by the module fixture)."""

    def __init__(self):
        self.before: dict[str, dict] = {}  # query -> API answer before traffic
        self.during: dict[str, dict] = {}  # query -> API answer at the end of the load
        self.crossed: dict[str, float] = {}  # trigger -> seconds from load start to value > threshold
        self.fell: dict[str, float] = {}  # trigger -> seconds from load end to value <= threshold
        self.peaks: dict[str, float] = {}
        self.alert_states: list[tuple[float, str]] = []  # (t from load start, state) of TritonLLMQueueBacklog
        self.outcomes: dict[str, int] = {}
        self.picker: list[tuple[float, dict[str, float]]] = []  # the endpoint picker's scrapes under load
        self.picker_after: dict[str, float] = {}  # and its scrape once the triggers fell back


@pytest.fixture(scope="module", params=sorted(LIVE))
def live(request, triton, helm_tools, prom_tools, tmp_path_factory, test_profile):
    target = request.param
    profile, layout, overrides, _ = LIVE[target]
    tmp = tmp_path_factory.mktemp(f"prometheus-{target}")
    keda_docs = render(helm_tools, tmp, profile, _merged(LIVE_VALUES, overrides))
    hpa = {"cpuUtilization": 80, **({"podsMetrics": HPA_GPU_METRICS} if target == "gpu" else {})}
    hpa_docs = render(helm_tools, tmp, profile, {"autoscaling": {"mode": "hpa", "hpa": hpa}})
    with ExitStack() as stack:
        server = triton if layout == triton.layout else stack.enter_context(
            _layout_server(layout, test_profile, keda_docs, tmp))
        yield _overload_run(target, server, keda_docs, hpa_docs, prom_tools, tmp)


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(base.get(k, {}), v) if isinstance(v, dict) else v
    return out


@contextmanager
def _layout_server(layout: str, test_profile, docs: list[dict], tmp: Path):
    """A tritonserver over the session engine in ``layout``, with the metrics flags of the rendered container.

    The GPU layout's stand-in gives ``null`` tokens at a GPU's pace (``GPU_STEP_MS`` a decode iteration), not the
    tiny CPU model's: that model finishes 96 tokens long before the Python serving path on 2 cores has delivered
    them, so its slots sat mostly empty under 32 streams (1-3 of 8; a CI run never saw 6) while the requests waited
    downstream. On a GPU, as here, the engine holds a request until it has generated its tokens."""
    from serving.launcher import ServerConfig, TritonServer
    from tests.stack import render_layout

    (container,) = [c for c in kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "triton"]
    flags = [a for a in container.get("command", []) + container.get("args", []) if a.startswith("--metrics-config")]
    paced = {"token_source": "null", "null_step_ms": GPU_STEP_MS} if layout == "trtllm-standin" else {}
    repo = render_layout(layout, test_profile, tmp / "model_repository", **paced)
    config = ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_secs=10,
                          log_file=tmp / "tritonserver.log", extra_args=flags)
    with TritonServer(config, ready_timeout=240) as server:
        yield server


def _overload_run(target: str, triton, keda_docs: list[dict], hpa_docs: list[dict], prom_tools, tmp: Path) -> "Run":
    from tests.openai_front import FrontDoorProcess
    from tests.reliability.relkit import closed_loop

    queries = rendered_queries(keda_docs)
    queries["hpa"] = rendered_queries(hpa_docs)["hpa"]
    # The recording rules' outputs, as the alerts read them.
    queries["recorded"] = {r: f'{r}{{namespace="{NAMESPACE}",release="{RELEASE}"}}' for r in queries["record"]}
    so = kind(keda_docs, "ScaledObject")
    triggers = {t["name"]: (t["metadata"]["query"], float(t["metadata"]["threshold"]), t["metricType"])
                for t in so["spec"]["triggers"]}
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_groups(kind(keda_docs, "PrometheusRule"))))

    # The front door with an API key and the engine-metrics path, as the chart runs it: the rendered endpoint must send
    # the key to be scraped; the endpoint picker's scrape of the relayed gauges sends none.
    (front_container,) = [c for c in kind(keda_docs, "Deployment")["spec"]["template"]["spec"]["containers"]
                          if c["name"] == "openai"]
    relay = [a for a in front_container["command"] if a.startswith("--engine-metrics-path=")]
    front = FrontDoorProcess(triton.urls.grpc, api_keys=SCRAPE_KEY, extra_args=(
        *relay, "--triton-metrics-url", triton.urls.metrics.replace("localhost", "127.0.0.1")))
    assert relay == [f"--engine-metrics-path={shipped_path()}"], relay  # the chart and the picker agree on the path
    picker = EndpointPickerScrape(front.url + shipped_path())
    servers = {"metrics": triton.urls.metrics.replace("localhost", "127.0.0.1"), "openai": front.url}
    secret = f"{FULLNAME}-openai-api-key"
    prom = Prometheus(tmp, scrape_targets(keda_docs, servers, {secret: SCRAPE_KEY}), rule_files=[rules],
                      binary=prom_tools["prometheus"])
    run = Run()
    run.target, run.queries, run.triggers = target, queries, triggers
    try:
        prom.start()
        prom.wait_for_data(f'up{{namespace="{NAMESPACE}",container="openai"}} == 1')
        run.front_series = prom.query(f'count({{namespace="{NAMESPACE}",pod="{POD}",container="openai"}})')
        # rate() needs two scrapes in its window: give a fresh Prometheus a few before judging "before traffic".
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(len(prom.query(q)["data"]["result"]) == 1
                                                      for q in queries["keda"].values()):
            time.sleep(0.5)
        for group in queries.values():
            for q in group.values():
                run.before[q] = prom.query(q)

        result: dict = {}
        t0 = time.time()
        loader = threading.Thread(target=lambda: result.update(
            run=asyncio.run(closed_loop(triton.urls.grpc, STREAMS, LOAD_S, MAX_TOKENS, timeout_s=120)))
        )
        loader.start()
        state_seen = set()
        while loader.is_alive():
            _poll(prom, run, triggers, t0, state_seen)
            run.picker.append((round(time.time() - t0, 1), picker.read()))
            time.sleep(1.0)
        loader.join()
        t1 = time.time()
        run.outcomes = result["run"].kinds()
        for group in queries.values():
            for q in group.values():
                run.during[q] = prom.query(q)
        # After the load: each trigger back at or below its threshold (KEDA's scale-in signal).
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(run.fell) < len(triggers):
            for name, (q, thr, _) in triggers.items():
                v = prom.value(q)
                if name not in run.fell and finite(v) and v <= thr:
                    run.fell[name] = round(time.time() - t1, 1)
            time.sleep(1.0)
        t2 = time.time()
        run.picker_after = picker.read()
        _save(prom, run, triggers, t0, t1, t2)
        return run
    finally:
        prom.stop()
        front.stop()


def _poll(prom, run, triggers, t0, state_seen):
    now = time.time() - t0
    for name, (q, thr, _) in triggers.items():
        v = prom.value(q)
        if finite(v):
            run.peaks[name] = max(run.peaks.get(name, v), v)
            if name not in run.crossed and v > thr:
                run.crossed[name] = round(now, 1)
    for r in prom.query('ALERTS{alertname="TritonLLMQueueBacklog"}')["data"]["result"]:
        state = r["metric"]["alertstate"]
        if state not in state_seen:
            state_seen.add(state)
            run.alert_states.append((round(now, 1), state))


def _save(prom, run, triggers, t0, t1, t2):
    start, end = t0 - 10, t2
    data = {"load": {"start": t0, "end": t1, "streams": STREAMS, "slots": SLOTS, "max_tokens": MAX_TOKENS,
                     "outcomes": run.outcomes},
            "triggers": {}, "alerts": {},
            "crossed_s": run.crossed, "fell_s": run.fell, "peaks": run.peaks, "alert_states": run.alert_states,
            "endpoint_picker": {"under_load": run.picker, "after": run.picker_after}}
    for name, (q, thr, mtype) in triggers.items():
        rows = prom.series(q, start, end, 1.0)
        data["triggers"][name] = {"query": q, "threshold": thr, "metricType": mtype,
                                  "values": [(float(t), float(v)) for t, v in rows[0]["values"]] if rows else []}
    for r in prom.series('ALERTS{alertname=~"TritonLLM.*"}', start, end, 1.0):
        key = f'{r["metric"]["alertname"]} {r["metric"]["alertstate"]}'
        data["alerts"][key] = [float(t) for t, _ in r["values"]]
    out = run_json(run.target)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))


def _needs_server_data(expr: str) -> bool:
    return (not any(m in expr for m in (*NOT_FROM_THE_SERVER, FIRST_RESPONSE_ON_GPU_ONLY))
            and not expr.startswith("absent("))


def test_every_rendered_query_parses(live):
    assert set(live.queries["keda"]) == LIVE[live.target][3]
    assert live.queries["hpa"] and live.queries["record"] and live.queries["alert"] and live.queries["panel"]
    bad = {q: a for q, a in live.before.items() if a["status"] != "success"}
    assert not bad, json.dumps(bad, indent=1)


def test_keda_queries_return_exactly_one_series(live):
    for name, q in live.queries["keda"].items():
        for when, answers in (("before traffic", live.before), ("under load", live.during)):
            result = answers[q]["data"]["result"]
            assert len(result) == 1, f"{name} {when}: {len(result)} series for {q}: {result}"
            assert finite(float(result[0]["value"][1])), f"{name} {when}: {result}"


def test_every_query_returns_data_after_traffic(live):
    empty = {}
    for kind_, group in live.queries.items():
        for name, q in group.items():
            if kind_ == "alert":
                # Empty while it does not fire (the promtool unit tests fire each one): every recorded series it
                # reads must exist; TritonLLMQueueBacklog fires for real below.
                for record in re.findall(r"triton_llm:[a-z0-9_]+", q):
                    assert record in live.queries["recorded"], f"{name} reads {record}, which no rule records"
                    if (_needs_server_data(live.queries["record"][record])
                            and not live.during[live.queries["recorded"][record]]["data"]["result"]):
                        empty[f"{kind_} {name} ({record})"] = q
                continue
            source = live.queries["record"][name] if kind_ == "recorded" else q  # what the recorded series reads
            if _needs_server_data(source) and not live.during[q]["data"]["result"]:
                empty[f"{kind_} {name}"] = q
    assert not empty, "no data under load:\n" + "\n".join(f"{k}: {v}" for k, v in empty.items())


def test_front_door_is_scraped_with_the_pod_labels(live):
    """The OpenAI front door's own /metrics, scraped through the rendered ServiceMonitor's `openai` endpoint with its
    API key (no chart query reads it)."""
    result = live.front_series["data"]["result"]
    assert result and float(result[0]["value"][1]) >= 1, live.front_series


def test_each_trigger_crosses_its_threshold_under_overload(live):
    assert live.outcomes.get("ok", 0) > 0 and not live.outcomes.get("rejected"), live.outcomes
    report = {n: {"crossed_s": live.crossed.get(n), "peak": live.peaks.get(n), "threshold": live.triggers[n][1]}
              for n in live.triggers}
    missing = [n for n in live.triggers if n not in live.crossed]
    assert not missing, f"never crossed under {STREAMS} streams vs {SLOTS} slots: {report}"
    slow = {n: s for n, s in live.crossed.items() if s > 30}
    assert not slow, f"crossed later than 30 s into the load: {report}"


def test_each_trigger_falls_back_after_the_load(live):
    missing = [n for n in live.triggers if n not in live.fell]
    assert not missing, f"still above threshold 90 s after the load: {missing} (fell: {live.fell})"


def test_endpoint_picker_reads_the_load_on_the_routed_port(live):
    """The engine gauges relayed on the front door's port (no API key), read as an inference gateway's endpoint
    picker reads them with the metric specs we ship for this layout: each signal moves with the overload (32 streams
    against 8 slots) and is back to idle once the load has gone."""
    peaks = {signal: max(v[signal] for _, v in live.picker) for signal in live.picker[0][1]}
    report = {"peaks": peaks, "after": live.picker_after, "scrapes": len(live.picker)}
    assert all(not math.isnan(v) for _, scrape in live.picker for v in scrape.values()), report
    assert peaks["queued"] >= SLOTS and peaks["running"] >= SLOTS - 1 and peaks["kvUsage"] > 0, report
    assert live.picker_after == {"queued": 0.0, "running": 0.0, "kvUsage": 0.0}, report


def test_queue_alert_goes_pending_then_firing(live):
    expr = live.queries["alert"]["TritonLLMQueueBacklog"]  # the test-sized threshold is the one Prometheus ran
    assert expr.endswith(f"> {LIVE_VALUES['metrics']['prometheusRule']['queueThreshold']}"), expr
    states = [s for _, s in live.alert_states]
    assert "pending" in states and "firing" in states, live.alert_states
    assert states.index("pending") < states.index("firing"), live.alert_states
