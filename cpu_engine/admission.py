"""Bounded, thread-safe admission: what every token source (the CPU engine, the stand-in's null source) does
when a request arrives — refuse fast when shutting down or when the wait queue is full, else count it waiting
until it holds a slot. Overload is a quick QueueFullError (→ UNAVAILABLE), never an unbounded queue.

Liveness probes (serving/health.py) are counted apart, outside that bound: an engine whose queue is full still
answers them. A few may wait at once (a probe of a stuck engine times out and the next one comes).

``on_full`` hears each time the queue fills or stops being full, so that a request can be refused before it reaches
the engine's process (serving/queue_full.py)."""

from __future__ import annotations

import threading
from typing import Callable


class QueueFullError(RuntimeError):
    pass


MAX_WAITING_PROBES = 4


class Admission:
    def __init__(self, max_waiting: int, on_full: Callable[[bool], None] | None = None):
        self.max_waiting = max_waiting
        self._waiting = 0  # admitted, not yet holding a slot (any thread reads; the lock guards writes)
        self._probes = 0  # liveness probes admitted, not yet in the probe row
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._on_full = on_full
        self._full = False

    def _tell(self) -> None:
        """Under the lock: say when the queue has filled or has room again."""
        full = self._waiting >= self.max_waiting
        if full != self._full and self._on_full is not None:
            self._full = full
            self._on_full(full)

    def admit(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise QueueFullError("the engine is shutting down and accepts no new requests")
            if self._waiting >= self.max_waiting:
                raise QueueFullError(f"request queue is full ({self.max_waiting} waiting); retry later")
            self._waiting += 1
            self._tell()

    def admit_probe(self) -> None:
        with self._lock:
            if self._stopping.is_set():
                raise QueueFullError("the engine is shutting down and accepts no new requests")
            if self._probes >= MAX_WAITING_PROBES:
                raise QueueFullError(f"{MAX_WAITING_PROBES} liveness probes are already waiting for the engine")
            self._probes += 1

    def left_queue(self, count: int = 1, probes: int = 0) -> None:
        """``count`` admitted requests (and ``probes`` probes) got a slot or ended before getting one."""
        if count or probes:
            with self._lock:
                self._waiting -= count
                self._probes -= probes
                self._tell()

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def waiting(self) -> int:
        return self._waiting
