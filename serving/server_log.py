"""Why tritonserver did not start, read from its log: the busy port, the model that failed and its error.

Triton prints a few hundred lines while it loads; a user needs the two that say what went wrong.
"""

from __future__ import annotations

import re

_ESCAPE = re.compile(r"\\(.)")
_QUOTED = re.compile(r'^[IWE]\d{4} [\d:.]+\s+\d+ \S+\] "(.*)"\s*$')
_SOCKET_BUSY = re.compile(r"failed to start (\w+) service: .*?Socket '(.*):(\d+)' already in use")
_MODEL_ERRORS = [
    re.compile(r"failed to load '(?P<model>[^']+)' version \d+: (?P<msg>.*)", re.S),
    re.compile(r"failed to load model '(?P<model>[^']+)': (?P<msg>.*)", re.S),
    re.compile(r"Poll failed for model directory '(?P<model>[^']+)': (?P<msg>.*)", re.S),
    re.compile(r"ensemble '(?P<model>[^']+)' (?P<msg>depends on '[^']+' which has no loaded version)"),
]
_PROTO_ERROR = re.compile(r"Error parsing text-format inference\.ModelConfig: (.*)")
# How a Python stub that embedded another interpreter than the environment's fails before any model code runs:
# a C extension built for another libpython, or the environment's packages (the project) not on sys.path.
_FOREIGN_PYTHON = re.compile(r"undefined symbol: _?Py|No module named '(serving|cpu_engine|builders)'")
FOREIGN_PYTHON_HINT = ("Triton's Python stub did not run this environment's Python; start the server with "
                       "`make serve` or `python -m serving serve` from the project's venv (serving/stub_python.py)")


def _message(line: str) -> str:
    """Triton logs most messages as one C-escaped quoted string; return it unescaped."""
    m = _QUOTED.match(line)
    if not m:
        return line
    return _ESCAPE.sub(lambda e: {"n": "\n", "t": "\t"}.get(e.group(1), e.group(1)), m.group(1))


def _short(msg: str) -> str:
    """First line of an error plus the innermost Python frame (pybind lists it first after 'At:')."""
    lines = [ln.strip() for ln in msg.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    out = lines[0]
    if "At:" in lines:
        frames = lines[lines.index("At:") + 1:]
        if frames:
            out += f" (at {frames[0]})"
    return out


def _status_table(lines: list[str]) -> dict[str, str]:
    """The 'Model | Version | Status' table Triton prints after loading; multi-line cells are joined."""
    rows: dict[str, list[str]] = {}
    inside, current = False, None
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[:3] == ["Model", "Version", "Status"]:
            inside, rows = True, {}
        elif inside and cells is None and not line.startswith("+"):
            inside = False
        elif inside and cells and len(cells) == 3:
            if cells[0]:
                current = cells[0]
                rows[current] = [cells[2]]
            elif current:
                rows[current].append(cells[2])
    return {k: "\n".join(v) for k, v in rows.items()}


def diagnose(log: str, port_names: dict[int, str] | None = None) -> str:
    """A short explanation of why the server did not come up, from its log. ``port_names``: port → the
    variable that sets it (HTTP_PORT…), so a busy port names the knob to turn."""
    lines = log.splitlines()
    reasons: list[str] = []
    models: dict[str, str] = {}
    loading: dict[str, None] = {}
    proto_error: str | None = None
    generic_busy: str | None = None
    for line in lines:
        msg = _message(line)
        if m := _PROTO_ERROR.search(line):
            proto_error = m.group(1).strip()
        if m := _SOCKET_BUSY.search(msg):
            port = int(m.group(3))
            env = (port_names or {}).get(port)
            reasons.append(f"port {port}" + (f" ({env})" if env else "") + f" is already in use "
                           f"({m.group(1)} service could not bind {m.group(2)}:{port})")
        elif "Address already in use" in msg and generic_busy is None:
            generic_busy = "a port is already in use: " + msg.strip()[:200]
        if m := re.match(r"loading: (.+):\d+$", msg):
            loading[m.group(1)] = None
        if m := re.match(r"successfully loaded '([^']+)'", msg):
            loading.pop(m.group(1), None)
        for pattern in _MODEL_ERRORS:
            if (m := pattern.search(msg)) and m.group("model") not in models:
                text = _short(m.group("msg"))
                if pattern is _MODEL_ERRORS[2] and proto_error:
                    text += f": {proto_error}"
                models[m.group("model")] = text
                loading.pop(m.group("model"), None)
                break
    for model, status in _status_table(lines).items():
        if status != "READY" and model not in models:
            models[model] = _short(status)
    if generic_busy and not reasons:
        reasons.append(generic_busy)
    reasons += [f"model '{name}': {text}" for name, text in models.items()]
    if any(_FOREIGN_PYTHON.search(text) for text in models.values()):
        reasons.append(FOREIGN_PYTHON_HINT)
    if loading and not models:
        reasons.append("still loading: " + ", ".join(loading))
    final = [ln.strip() for ln in lines if ln.startswith("error: ")]
    if final:
        reasons.append(final[-1])
    if not reasons:  # unknown failure: show the error-level lines, or the tail of the log
        errors = [ln for ln in lines if ln[:1] == "E" and "CudaDriverHelper" not in ln]
        reasons = (errors or lines)[-10:]
    return "\n".join(f"  - {r}" for r in reasons)
