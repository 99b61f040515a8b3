"""Which of the ``llm`` model's requests their clients cancelled, asked off the engine's thread.

A response sender's ``is_cancelled()`` is an IPC round trip to tritonserver. The CPU engine polled it for every live
request every 20 ms on its own thread, between two steps: at 16 streams a poll took 2.5 ms of the engine's wall time,
during which its OpenMP workers had nothing to run (5 % of a 45 ms step). Here one thread of the model asks, and the
engines' ``is_cancelled`` reads a set.

A sender is never asked after its request's final response: tritonserver may have freed the response factory the
question names (it crashed 2.51 in ``TRITONBACKEND_ResponseFactoryIsCancelled``). The model calls ``forget`` before
it sends a final response, and ``forget`` waits for a question in flight about that request.
"""

from __future__ import annotations

import threading

POLL_S = 0.02  # as the engines' own polls of is_cancelled: how stale a cancellation may be here


class CancelWatch:
    def __init__(self, every_s: float = POLL_S):
        self.every_s = every_s
        self._senders: dict[str, object] = {}  # request id → its response sender, until forgotten
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()  # held while a sender is asked: forget() waits for the answer
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llm-cancellations", daemon=True)

    def start(self) -> CancelWatch:
        self._thread.start()
        return self

    def watch(self, request_id: str, sender) -> None:
        with self._lock:
            self._senders[request_id] = sender

    def forget(self, request_id: str) -> None:
        """Before the request's final response: its sender is not asked again."""
        with self._lock:
            self._senders.pop(request_id, None)
            self._cancelled.discard(request_id)

    def is_cancelled(self, request_id: str) -> bool:
        return request_id in self._cancelled

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._closing.wait(self.every_s):
            for request_id, sender in list(self._senders.items()):
                if request_id in self._cancelled:  # a cancellation is final: no need to ask again
                    continue
                with self._lock:  # one question at a time: the others' forget() waits at most one round trip
                    if self._senders.get(request_id) is not sender:  # forgotten meanwhile: it may be answered
                        continue
                    if sender.is_cancelled():  # releases the GIL while it waits for tritonserver
                        self._cancelled.add(request_id)
