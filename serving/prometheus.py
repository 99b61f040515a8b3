"""Read Triton's Prometheus text exposition (the launcher's drain, the load-test reports and the tests share it)."""

from __future__ import annotations

import re
import urllib.request

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(3) or "")))
        try:
            out[(m.group(1), labels)] = float(m.group(4))
        except ValueError:
            continue
    return out


def fetch(url: str, timeout: float = 10.0) -> Samples:
    """Samples from a metrics URL; raises OSError when it does not answer (tests: a dead port is not "0")."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return parse(r.read().decode("utf-8", "replace"))


def scrape(url: str | None, timeout: float = 3.0) -> Samples:
    """Samples from a metrics URL; empty when there is no URL or it does not answer (metrics are optional)."""
    if not url:
        return {}
    try:
        return fetch(url, timeout)
    except (OSError, ValueError):
        return {}


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (none given: every label set)."""
    want = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and want <= set(have))
