"""Which of the ``llm`` model's requests their clients cancelled, asked off the engine's thread.

A response sender's ``is_cancelled()`` is an IPC round trip to tritonserver. The CPU engine polled it for every live
request every 20 ms on its own thread, between two steps: at 16 streams a poll took 2.5 ms of the engine's wall time,
during which its OpenMP workers had nothing to run. Here one thread of the model asks, and the engines'
``is_cancelled`` reads a set.

A sender is never asked after its request's final response: tritonserver may have freed the response factory the
question names (it crashed 2.51 in ``TRITONBACKEND_ResponseFactoryIsCancelled``). The model calls ``forget`` before
it sends a final response, and ``forget`` waits for a question in flight about that request (each request has its own
lock, as serving/executor_engine.py's watch: a round trip for one request never holds up another's response).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

POLL_S = 0.02  # as the engines' own polls of is_cancelled: how stale a cancellation may be here

log = logging.getLogger(__name__)


@dataclass
class _Watched:
    sender: object
    guard: threading.Lock = field(default_factory=threading.Lock)  # held while its sender is asked
    forgotten: bool = False  # set under ``guard``: its final response may go out, its sender is not asked again


class CancelWatch:
    def __init__(self, every_s: float = POLL_S):
        self.every_s = every_s
        self._watched: dict[str, _Watched] = {}
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()  # the two collections only; never held while a sender is asked
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-cancellations", daemon=True)

    def start(self) -> CancelWatch:
        self._thread.start()
        return self

    def watch(self, request_id: str, sender) -> None:
        with self._lock:
            self._watched[request_id] = _Watched(sender)

    def forget(self, request_id: str) -> None:
        """Before the request's final response: its sender is not asked again once this returns."""
        with self._lock:
            watched = self._watched.pop(request_id, None)
            self._cancelled.discard(request_id)
        if watched is not None:
            with watched.guard:  # a question in flight about this request ends first
                watched.forgotten = True

    def is_cancelled(self, request_id: str) -> bool:
        return request_id in self._cancelled

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closing.wait(self.every_s):
            with self._lock:
                watched = [(rid, w) for rid, w in self._watched.items() if rid not in self._cancelled]
            for request_id, entry in watched:
                with entry.guard:
                    if entry.forgotten:  # its final response may be out
                        continue
                    try:
                        cancelled = entry.sender.is_cancelled()  # releases the GIL while tritonserver answers
                    except Exception as exc:  # noqa: BLE001 - this request's sender is broken: it alone ends
                        log.warning("asking whether request %s was cancelled failed (%s): ending it", request_id, exc)
                        cancelled = True
                if cancelled:
                    with self._lock:
                        if request_id in self._watched:  # not forgotten meanwhile
                            self._cancelled.add(request_id)
