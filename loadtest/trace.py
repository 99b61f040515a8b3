"""Triton trace files (``--trace-config triton,file=F --trace-config level=TIMESTAMPS``) -> per-request stages.

A trace file is a JSON list of records keyed by trace ``id``: one record names the model (and ``parent_id``
for a composing model's trace), the others carry ``timestamps`` (REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END; the ensemble's also GRPC_* and
INFER_RESPONSE_COMPLETE). With ``log-frequency=N`` Triton writes ``F.0``, ``F.1``, ... every N traces; the
rest goes to ``F`` at exit.

For one streamed ensemble request the composing traces are: preprocessing (once), llm (once: its execute()
only enqueues into the CPU engine), postprocessing (once per response). So:

* engine wait + prefill = first postprocessing REQUEST_START - llm REQUEST_END
* engine decode         = last postprocessing REQUEST_START - first postprocessing REQUEST_START
* postprocessing on the critical path = the last postprocessing call (queue + compute)
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Span:
    model: str
    parent: int | None
    ts: dict[str, int] = field(default_factory=dict)  # first occurrence of each timestamp name
    grpc_sends: list[tuple[int, int]] = field(default_factory=list)

    def d(self, a: str, b: str) -> float | None:
        if a in self.ts and b in self.ts:
            return (self.ts[b] - self.ts[a]) / 1e6  # ms
        return None


@dataclass
class RequestStages:
    """One ensemble request, in ms."""

    server_total: float
    ensemble_queue: float
    pre_queue: float
    pre_compute: float
    llm_queue: float
    llm_compute: float
    engine_prefill: float  # waiting for a slot + prefill + first token (until postprocessing starts)
    engine_decode: float
    post_queue_last: float
    post_compute_last: float
    post_calls: int
    post_busy_total: float  # compute of every postprocessing call (CPU cost, not all on the critical path)
    post_queue_total: float
    grpc_send_total: float
    other: float  # ensemble hand-offs and everything not attributed above

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def trace_files(base: Path) -> list[Path]:
    """``F`` and ``F.<n>`` for a configured trace file ``F``."""
    base = Path(base)
    files = [p for p in base.parent.glob(base.name + ".*") if p.suffix[1:].isdigit()]
    files.sort(key=lambda p: int(p.suffix[1:]))
    if base.exists():
        files.append(base)
    return files


def load_spans(files: list[Path]) -> dict[int, Span]:
    """Spans by trace id. Ids are unique within one server run, and a request's traces may be spread over
    several files, so the files of one run are read together (use a fresh trace file per server start)."""
    spans: dict[int, Span] = {}
    pending_send: dict[int, int] = {}
    for path in files:
        try:
            records = json.loads(path.read_text() or "[]")
        except json.JSONDecodeError:
            continue  # a file still being written
        for rec in records:
            key = int(rec["id"])
            span = spans.get(key)
            if span is None:
                span = spans[key] = Span(model="", parent=None)
            if "model_name" in rec:
                span.model = rec["model_name"]
                if "parent_id" in rec:
                    span.parent = int(rec["parent_id"])
            for t in rec.get("timestamps", []):
                name, ns = t["name"], int(t["ns"])
                if name == "GRPC_SEND_START":
                    pending_send[key] = ns
                elif name == "GRPC_SEND_END" and key in pending_send:
                    span.grpc_sends.append((pending_send.pop(key), ns))
                span.ts.setdefault(name, ns)
                if name in ("REQUEST_END", "GRPC_SEND_END"):
                    span.ts[name] = max(span.ts[name], ns)  # keep the last end
    return spans


def request_stages(spans: dict[int, Span], ensemble: str = "ensemble", llm: str = "llm") -> list[RequestStages]:
    children: dict[int, list[Span]] = defaultdict(list)
    for span in spans.values():
        if span.parent is not None:
            children[span.parent].append(span)
    out = []
    for key, root in spans.items():
        if root.model != ensemble or root.parent is not None:
            continue
        kids = children.get(key, [])
        pre = next((s for s in kids if s.model == "preprocessing"), None)
        mid = next((s for s in kids if s.model == llm), None)
        posts = sorted((s for s in kids if s.model == "postprocessing"), key=lambda s: s.ts.get("REQUEST_START", 0))
        total = root.d("REQUEST_START", "REQUEST_END")
        if pre is None or mid is None or not posts or total is None:
            continue  # incomplete (cut by a flush boundary, or a failed request)
        first, last = posts[0], posts[-1]
        q = lambda s: s.d("QUEUE_START", "COMPUTE_START") or 0.0  # noqa: E731
        c = lambda s: s.d("COMPUTE_START", "COMPUTE_END") or 0.0  # noqa: E731
        prefill = (first.ts["REQUEST_START"] - mid.ts["REQUEST_END"]) / 1e6
        decode = (last.ts["REQUEST_START"] - first.ts["REQUEST_START"]) / 1e6
        pre_total = pre.d("REQUEST_START", "REQUEST_END") or (q(pre) + c(pre))
        llm_total = mid.d("REQUEST_START", "REQUEST_END") or (q(mid) + c(mid))
        last_total = last.d("REQUEST_START", "REQUEST_END") or (q(last) + c(last))
        ens_queue = root.d("QUEUE_START", "REQUEST_START") or 0.0
        accounted = pre_total + llm_total + max(prefill, 0) + decode + last_total
        out.append(RequestStages(
            server_total=total, ensemble_queue=max(ens_queue, 0.0), pre_queue=q(pre), pre_compute=c(pre),
            llm_queue=q(mid), llm_compute=c(mid), engine_prefill=max(prefill, 0.0), engine_decode=decode,
            post_queue_last=q(last), post_compute_last=c(last), post_calls=len(posts),
            post_busy_total=sum(c(s) for s in posts), post_queue_total=sum(q(s) for s in posts),
            grpc_send_total=sum((b - a) / 1e6 for a, b in root.grpc_sends), other=max(total - accounted, 0.0)))
    return out


def mean_stages(stages: list[RequestStages]) -> dict[str, float]:
    if not stages:
        return {}
    keys = stages[0].as_dict().keys()
    return {k: float(np.mean([getattr(s, k) for s in stages])) for k in keys}
