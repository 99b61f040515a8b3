"""An inference gateway's endpoint picker (EPP) reading a pod's engine gauges, as the picker does: a GET of
``<pod>:<routed port><metrics path>`` with no credentials, the text exposition parsed with an independent parser
(prometheus_client's), and each signal taken from the series its metric spec (``name{label=value,…}``) names.

The specs are those of the endpoint-picker config this project ships (helm/endpoint-picker/values.yaml), one
mapping for both layouts.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PICKER_VALUES = ROOT / "helm" / "endpoint-picker" / "values.yaml"
_SPEC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``name{label=value,…}`` (values quoted or not) → (name, labels)."""
    m = _SPEC.match(spec.strip())
    if not m:
        raise ValueError(f"not a metric spec: {spec!r}")
    labels = {}
    for pair in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
        key, _, value = pair.partition("=")
        labels[key.strip()] = value.strip().strip('"')
    return m.group(1), labels


def shipped_specs(engine: str = "triton-llm") -> dict[str, str]:
    """signal (queued, running, kvUsage) → metric spec of ``engine``, from the endpoint-picker config we ship
    (helm/endpoint-picker/values.yaml: the core-metrics-extractor's engineConfigs)."""
    values = yaml.safe_load(PICKER_VALUES.read_text())
    epp = values["router"]["epp"]
    config = yaml.safe_load(epp["pluginsCustomConfig"][epp["pluginsConfigFile"]])
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (spec,) = [e for e in extractor["parameters"]["engineConfigs"] if e["name"] == engine]
    return {"queued": spec["queuedRequestsSpec"], "running": spec["runningRequestsSpec"], "kvUsage": spec["kvUsageSpec"]}


def shipped_path() -> str:
    """The metrics path the shipped config scrapes."""
    values = yaml.safe_load(PICKER_VALUES.read_text())
    return values["router"]["epp"]["metricsDataSource"]["path"]


class EndpointPickerScrape:
    def __init__(self, url: str):
        self.url = url
        self.specs = {signal: parse_spec(spec) for signal, spec in shipped_specs().items()}

    def read(self) -> dict[str, float]:
        """signal → value (NaN when the series is missing: the picker would treat the pod as unknown)."""
        from prometheus_client.parser import text_string_to_metric_families

        request = urllib.request.Request(self.url)  # no Authorization header
        with urllib.request.urlopen(request, timeout=5) as answer:
            text = answer.read().decode()
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        out = {}
        for signal, (name, labels) in self.specs.items():
            found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
            out[signal] = found[0] if len(found) == 1 else float("nan")
        return out
