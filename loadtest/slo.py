"""SLO checks: each limit of the profile at each load level it applies to; any violation fails the run."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .results import LevelResult
from .spec import SLO, level_str

EXIT_OK = 0
EXIT_SLO_FAILED = 1
EXIT_ERROR = 2  # the measurement itself failed (tool missing, server unreachable, bad profile)


@dataclass
class Check:
    level: float
    metric: str
    limit: float | None
    value: float | None
    ok: bool
    note: str = ""

    def line(self) -> str:
        sign = "<=" if self.metric != "min_throughput_rps" else ">="
        value = "n/a" if self.value is None else f"{self.value:.3g}"
        verdict = "PASS" if self.ok else "FAIL"
        limit = "" if self.limit is None else f" {sign} {self.limit:g}"
        extra = f" ({self.note})" if self.note else ""
        return f"{verdict} at {level_str(self.level)}: {self.metric} = {value}{limit}{extra}"

    def to_dict(self) -> dict:
        return asdict(self)


_VALUE = {
    "ttft_p99_ms": lambda r: r.ttft.p99,
    "ttft_p50_ms": lambda r: r.ttft.p50,
    "tpot_p99_ms": lambda r: r.tpot.p99,
    "tpot_p50_ms": lambda r: r.tpot.p50,
    "latency_p99_ms": lambda r: r.latency.p99,
}


def check(slo: SLO, results: list[LevelResult]) -> tuple[list[Check], list[float]]:
    """(checks, levels named in ``slo.at`` that were not measured)."""
    by_level = {float(r.level): r for r in results}
    levels = [float(v) for v in slo.at] if slo.at else list(by_level)
    missing = [v for v in levels if v not in by_level]
    checks: list[Check] = []
    for level in levels:
        r = by_level.get(level)
        if r is None:
            continue
        if not r.ok:
            checks.append(Check(level, "measurement", None, None, False, r.error or "failed"))
            continue
        for metric, limit in slo.limits().items():
            value = _VALUE[metric](r)
            ok = value is not None and value <= limit
            note = "" if value is not None else "not measured (non-streaming responses have no TPOT)"
            checks.append(Check(level, metric, limit, value, ok, note))
        if slo.min_throughput_rps is not None:
            v = r.throughput_rps
            checks.append(Check(level, "min_throughput_rps", slo.min_throughput_rps, v,
                                v is not None and v >= slo.min_throughput_rps))
        checks.append(Check(level, "error_rate", slo.max_error_rate, r.error_rate, r.error_rate <= slo.max_error_rate))
    return checks, missing


def exit_code(checks: list[Check], results: list[LevelResult]) -> int:
    if not results or all(not r.ok for r in results):
        return EXIT_ERROR
    return EXIT_OK if all(c.ok for c in checks) else EXIT_SLO_FAILED


def miss_ratio(c: Check) -> str:
    """How far a failed latency check is from its limit ("2.3x the limit")."""
    if c.ok or c.value is None or c.limit in (None, 0):
        return ""
    if c.metric == "min_throughput_rps":
        return f"{c.value / c.limit:.2f}x the minimum"
    return f"{c.value / c.limit:.2f}x the limit"
