"""Graceful drain: stop taking new requests, let the accepted ones finish, *then* SIGTERM tritonserver.

Why not just SIGTERM: on SIGTERM Triton 2.51 stops every model's scheduler at once. A streamed ensemble
request that still needs a composing step then has it refused, and the ensemble never finishes the request
(docs/reliability.md, B1/B2; it was postprocessing, once per response, before the llm answered in text):
streams hang, the server waits the whole ``--exit-timeout-secs`` and exits 1.

So the launcher first creates a drain file (its path reaches the models' stubs in ``TRITON_LLM_DRAIN_FILE``).
Entry models see it and, after a short grace, refuse new work with UNAVAILABLE; the llm keeps serving the
streams in flight. The graces exist because a model cannot see when Triton received a request: one that
sat in preprocessing's queue when the drain began was already accepted and must still be served
(``PREPROCESSING_GRACE_S``), and an ensemble request preprocessing took just then is still on its way to
llm (``LLM_GRACE_S``). The launcher waits out both, then until the engine and Triton's queues have been
empty for a moment, and only then sends SIGTERM.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from serving.prometheus import scrape, total

DRAIN_FILE_ENV = "TRITON_LLM_DRAIN_FILE"
SHUTTING_DOWN = "the server is shutting down and accepts no new requests; retry on another replica"
PREPROCESSING_GRACE_S = 1.0
LLM_GRACE_S = 2 * PREPROCESSING_GRACE_S
# Work still somewhere in the server: requests in a slot or the engine's queue, or in Triton's queues
# (a request between two ensemble steps sits in the next model's queue).
IN_FLIGHT_SERIES = ("llm_engine_active_slots", "llm_engine_queued_requests", "nv_inference_pending_request_count")


class DrainGate:
    """What an entry model asks before it accepts a request. A stat() per execute(), no IPC."""

    def __init__(self, path: str | None = None):
        self.path = path if path is not None else os.environ.get(DRAIN_FILE_ENV) or None

    def closed_for(self, seconds: float) -> bool:
        """The drain began at least ``seconds`` ago (the file's mtime); False while there is none."""
        if self.path is None:
            return False
        try:
            return time.time() - os.stat(self.path).st_mtime >= seconds
        except FileNotFoundError:
            return False


def in_flight(metrics_url: str) -> float | None:
    """Requests still being worked on, from the metrics port; None when it does not answer."""
    samples = scrape(metrics_url, timeout=2.0)
    if not samples:
        return None
    return sum(total(samples, name) for name in IN_FLIGHT_SERIES)


def wait_until_idle(metrics_url: str, timeout_s: float, quiet_s: float = 0.5, every_s: float = 0.05) -> bool:
    """True once nothing was in flight for ``quiet_s`` (covers a last response on its way out after the
    engine's final token); False when ``timeout_s`` passed first or the metrics port stopped answering."""
    deadline = time.monotonic() + timeout_s
    idle_since: float | None = None
    while (now := time.monotonic()) < deadline:
        busy = in_flight(metrics_url)
        if busy is None:
            return False
        if busy > 0:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= quiet_s:
            return True
        time.sleep(every_s)
    return False


def drain(drain_file: Path, metrics_url: str, timeout_s: float) -> bool:
    """Close the gate, wait out the graces, then until idle; True when idle within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    drain_file.parent.mkdir(parents=True, exist_ok=True)
    drain_file.touch()
    time.sleep(min(LLM_GRACE_S, timeout_s))  # requests may still be accepted until then
    return wait_until_idle(metrics_url, max(deadline - time.monotonic(), 0.0))
