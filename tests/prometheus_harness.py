"""A real Prometheus (Debian's 2.42 .deb, pinned by sha256: scripts/prometheus-tools.sh) scraping the test servers,
for the chart's queries to run unchanged (tests/test_prometheus.py, scripts/autoscaling_plot.py).

In Kubernetes the chart's ServiceMonitor / PodMonitor (ports ``metrics``, ``openai``) make the Prometheus Operator add
``namespace``, ``pod``, ``service``, ``endpoint``, ``container`` and ``job`` to every series; a static scrape
config with the same labels reproduces that, so a query rendered for release ``llm`` in namespace ``serving``
(``pod=~"llm-triton-llm-[a-z0-9]{5,10}-[a-z0-9]{5}"``) selects the test server's series as it would the pod's.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from serving.launcher import free_port
from serving.parent_death import stop_with_parent

ROOT = Path(__file__).resolve().parent.parent
RELEASE, NAMESPACE = "llm", "serving"
FULLNAME = f"{RELEASE}-triton-llm"
#: A pod name the chart's default selector matches: <fullname>-<replicaset hash>-<pod suffix>.
POD = f"{FULLNAME}-7d9c5b6f4d-x2k9q"


def tools() -> dict[str, str]:
    """{"prometheus": path, "promtool": path}: installed by scripts/prometheus-tools.sh when missing."""
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "prometheus-tools.sh")], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/prometheus-tools.sh could not provide prometheus/promtool "
                           f"(exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}")
    found = dict(kv.split("=", 1) for kv in proc.stdout.split())
    return {"prometheus": found["prometheus"], "promtool": found["promtool"]}


def pod_labels(container: str, endpoint: str) -> dict[str, str]:
    """The labels the ServiceMonitor's relabelling gives a series scraped from ``container``'s ``endpoint`` port."""
    return {"namespace": NAMESPACE, "pod": POD, "service": FULLNAME, "endpoint": endpoint, "container": container}


@dataclass
class Target:
    url: str  # http://host:port/path
    labels: dict[str, str]
    job: str = FULLNAME
    bearer: str = ""  # the API key Prometheus sends (a monitor endpoint's `authorization` credentials)


def scrape_targets(docs: list[dict], servers: dict[str, str], secrets: dict[str, str]) -> list[Target]:
    """The rendered ServiceMonitor's endpoints as scrape targets: each endpoint's named port is served here by
    ``servers[port]`` (``http://host:port``), scraped at the endpoint's path with the labels of the container that
    declares that port in the rendered Deployment, sending ``secrets[<secret name>]`` where the endpoint names a
    bearer credential. A port the chart does not scrape is not scraped here either."""
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    owner = {p["name"]: c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])}
    targets = []
    for endpoint in monitor["spec"]["endpoints"]:
        port = endpoint["port"]
        if port not in servers:
            raise KeyError(f"the ServiceMonitor scrapes port {port!r}; the test servers provide {sorted(servers)}")
        base = urllib.parse.urlsplit(servers[port])
        credentials = endpoint.get("authorization", {}).get("credentials")
        targets.append(Target(f"{base.scheme}://{base.netloc}{endpoint.get('path', '/metrics')}",
                              pod_labels(owner[port], port),
                              bearer=secrets[credentials["name"]] if credentials else ""))
    return targets


def rule_groups(prometheus_rule: dict) -> dict:
    """A PrometheusRule object's groups as a Prometheus rule file."""
    return {"groups": prometheus_rule["spec"]["groups"]}


@dataclass
class Prometheus:
    workdir: Path
    targets: list[Target]
    rule_files: list[Path] = field(default_factory=list)
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    binary: str = ""
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        jobs: dict[tuple[str, str, str], list[Target]] = {}
        for t in self.targets:
            jobs.setdefault((t.job, urllib.parse.urlsplit(t.url).path, t.bearer), []).append(t)
        scrape = []
        for i, ((job, path, bearer), ts) in enumerate(jobs.items()):
            scrape.append({"job_name": job if i == 0 else f"{job}-{i}", "metrics_path": path,
                           "scrape_interval": self.scrape_interval, "scrape_timeout": self.scrape_interval,
                           **({"authorization": {"type": "Bearer", "credentials": bearer}} if bearer else {}),
                           "static_configs": [{"targets": [urllib.parse.urlsplit(t.url).netloc],
                                               "labels": {**t.labels, "job": job}} for t in ts]})
        return {"global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.evaluation_interval},
                "rule_files": [str(p) for p in self.rule_files], "scrape_configs": scrape}

    def start(self, timeout: float = 60.0) -> "Prometheus":
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.binary = self.binary or tools()["prometheus"]
        self.port = self.port or free_port()
        cfg = self.workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        data = self.workdir / "data"
        shutil.rmtree(data, ignore_errors=True)
        self.log = (self.workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d"],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=stop_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("prometheus exited:\n" + (self.workdir / "prometheus.log").read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus not ready:\n" + (self.workdir / "prometheus.log").read_text()[-3000:])

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if getattr(self, "log", None):
            self.log.close()

    def __enter__(self) -> "Prometheus":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- HTTP API ----------------------------------------------------------------------------------------
    def api(self, path: str, **params) -> dict:
        """GET /api/v1/<path>; returns the whole answer (status "success" or "error" with errorType/error)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return json.load(r)
        except urllib.error.HTTPError as exc:  # 400 bad_data (parse errors), 422 execution errors
            return json.load(exc)

    def query(self, expr: str, at: float | None = None) -> dict:
        return self.api("query", query=expr, **({"time": f"{at:.3f}"} if at is not None else {}))

    def value(self, expr: str, at: float | None = None) -> float | None:
        """The single value of a one-series query (None: no series)."""
        ans = self.query(expr, at)
        assert ans["status"] == "success", (expr, ans)
        result = ans["data"]["result"]
        if not result:
            return None
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])

    def series(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        ans = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step))
        assert ans["status"] == "success", (expr, ans)
        return ans["data"]["result"]

    def targets_up(self) -> dict[str, float]:
        return {r["metric"].get("container", r["metric"]["job"]): float(r["value"][1])
                for r in self.query("up")["data"]["result"]}

    def wait_for_data(self, expr: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.query(expr)["data"]["result"]:
                return
            time.sleep(0.5)
        raise AssertionError(f"no data for {expr} after {timeout} s; targets: {self.api('targets')}")


def finite(v: float | None) -> bool:
    return v is not None and not math.isnan(v) and not math.isinf(v)


def promtool(*args: str, cwd: Path | None = None, binary: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([binary or tools()["promtool"], *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=dict(os.environ))
