"""One wake-up for everything queued: the threads that hand a step's output on (the ``llm``'s response sender, the
stand-in executor's ``await_responses``) take all that a step put in at once, not one item per wake-up."""

from __future__ import annotations

import queue


def take_all(items: queue.SimpleQueue, timeout: float | None = None) -> list:
    """Every item queued by now: waits for the first one up to ``timeout`` seconds (None: until one comes); [] when
    none came."""
    try:
        taken = [items.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            taken.append(items.get_nowait())
        except queue.Empty:
            return taken
