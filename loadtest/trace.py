"""Triton trace files (``--trace-config triton,file=F --trace-config level=TIMESTAMPS``) -> per-request stages.

A trace file is a JSON list of records keyed by trace ``id``: one record names the model (and ``parent_id``
for a composing model's trace), the others carry ``timestamps`` (REQUEST_START, QUEUE_START, COMPUTE_START,
COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END; the ensemble's also GRPC_* and
INFER_RESPONSE_COMPLETE). With ``log-frequency=N`` Triton writes ``F.0``, ``F.1``, ... every N traces; the
rest goes to ``F`` at exit.

For one streamed ensemble request over gRPC the composing traces are preprocessing and llm, once each (the
llm's execute() only enqueues into the CPU engine; its sender thread streams the responses). The token times
come from the ensemble's own trace: Triton 2.51's gRPC stream handler records a GRPC_SEND_START/GRPC_SEND_END
pair for every response it writes (INFER_RESPONSE_COMPLETE only for the first one). So:

* engine wait + prefill = first response's GRPC_SEND_START - llm REQUEST_END
* engine decode         = last response's GRPC_SEND_START - first response's GRPC_SEND_START
* gRPC send (last)      = the last response's write, on the critical path

Both token times are when Triton's gRPC frontend starts writing a response, so they include the response's
way from the llm's sender thread through the ensemble, and a write also waits for the previous write on the
same stream. A request answered in one response (stream=false) has no first-token time in the trace: its
whole generation counts as wait + prefill and decode is 0.
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
    ensemble_queue: float  # the ensemble scheduler: its QUEUE_START until preprocessing starts
    pre_queue: float
    pre_compute: float
    llm_queue: float
    llm_compute: float
    engine_prefill: float  # waiting for a slot + prefill + first token (until the first response is written)
    engine_decode: float
    send_last: float  # the last response's gRPC write
    responses: int
    grpc_send_total: float  # every response's write (most overlap decoding)
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
                if name == "REQUEST_END":
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
        sends = sorted(root.grpc_sends)
        total = root.d("REQUEST_START", "REQUEST_END")
        if (pre is None or mid is None or not sends or total is None or "REQUEST_START" not in pre.ts
                or "REQUEST_END" not in mid.ts):
            continue  # incomplete (cut by a flush boundary, a failed request) or not a gRPC request
        q = lambda s: s.d("QUEUE_START", "COMPUTE_START") or 0.0  # noqa: E731
        c = lambda s: s.d("COMPUTE_START", "COMPUTE_END") or 0.0  # noqa: E731
        prefill = (sends[0][0] - mid.ts["REQUEST_END"]) / 1e6
        decode = (sends[-1][0] - sends[0][0]) / 1e6
        send_last = (sends[-1][1] - sends[-1][0]) / 1e6
        ens_queue = max((pre.ts["REQUEST_START"] - root.ts.get("QUEUE_START", root.ts["REQUEST_START"])) / 1e6, 0.0)
        pre_total = pre.d("REQUEST_START", "REQUEST_END") or (q(pre) + c(pre))
        llm_total = mid.d("REQUEST_START", "REQUEST_END") or (q(mid) + c(mid))
        accounted = ens_queue + pre_total + llm_total + max(prefill, 0.0) + decode + send_last
        out.append(RequestStages(
            server_total=total, ensemble_queue=ens_queue, pre_queue=q(pre), pre_compute=c(pre),
            llm_queue=q(mid), llm_compute=c(mid), engine_prefill=max(prefill, 0.0), engine_decode=decode,
            send_last=send_last, responses=len(sends), grpc_send_total=sum((b - a) / 1e6 for a, b in sends),
            other=max(total - accounted, 0.0)))
    return out


def mean_stages(stages: list[RequestStages]) -> dict[str, float]:
    if not stages:
        return {}
    keys = stages[0].as_dict().keys()
    return {k: float(np.mean([getattr(s, k) for s in stages])) for k in keys}
