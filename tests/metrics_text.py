"""Read Prometheus text exposition from Triton's metrics port (enough for our tests)."""

from __future__ import annotations

import re

import requests

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    samples = {}
    for line in requests.get(url, timeout=10).text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group("labels") or ""))
            samples[(match.group("name"), labels)] = float(match.group("value"))
    return samples


def value(samples, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))
