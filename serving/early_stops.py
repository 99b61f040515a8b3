"""Stops that arrive before their request, remembered so that the request ends as it arrives.

The client SDK abandons a request by sending TensorRT-LLM's ``stop`` straight to the ``llm`` model under the same
request id (the synchronous SDK cancels its ensemble call first; the asyncio one reads it to its end). The request itself travels through the ensemble's preprocessing step
first, and Triton 2.51 cancels an ensemble only between steps: a request whose preprocessing has finished still
reaches ``llm``, and its stop can get there first. Forgotten, that stop is lost and the abandoned request holds a
slot until max_tokens. Both ``llm`` models (the CPU layout's and the GPU layout's wrapper) keep such a stop for
``TTL_S`` and end a request it names at its arrival.
"""

from __future__ import annotations

import time
from collections import OrderedDict

TTL_S = 30.0  # far longer than any request spends in preprocessing; ids are the client's uuids, never reused sooner
MAX_REMEMBERED = 65536  # a flood of stops for unknown ids costs at most this many small entries


class EarlyStops:
    """Client request ids whose ``stop`` came while no request of theirs was running. One model thread uses it."""

    def __init__(self, ttl_s: float = TTL_S, max_remembered: int = MAX_REMEMBERED) -> None:
        self.ttl_s, self.max_remembered = ttl_s, max_remembered
        self._at: OrderedDict[str, float] = OrderedDict()  # id → when its stop came, oldest first

    def remember(self, client_id: str) -> None:
        now = time.monotonic()
        self._at.pop(client_id, None)
        self._at[client_id] = now
        while self._at and (len(self._at) > self.max_remembered or now - next(iter(self._at.values())) > self.ttl_s):
            self._at.popitem(last=False)

    def claim(self, client_id: str) -> bool:
        """True once for a request whose stop came first (within ``ttl_s``): end it now."""
        at = self._at.pop(client_id, None)
        return at is not None and time.monotonic() - at <= self.ttl_s
