"""The llm's "request queue is full", shared with preprocessing: an overload is refused at the ensemble's entry,
before its prompt is tokenised, and never reaches the llm (docs/reliability.md, section 2).

Why: each Python-backend stub a request passes costs it milliseconds of that stub's main thread (its tensors
unpacked under the GIL). When the llm refused an overload itself, every refusal paid preprocessing and the llm both,
Triton's queue before the llm filled with requests that would only be refused, and a liveness probe waited behind
them (docs/reliability.md, section 8).

The launcher makes one file per server and names it to the stubs in ``TRITON_LLM_QUEUE_FULL_FILE``. Each llm
instance keeps one byte of it, 1 while its engine's queue is full (cpu_engine/admission.py tells it when that
changes); preprocessing refuses when every instance's byte is 1. A byte read from a shared mapping per request,
no IPC. The byte can be a moment stale: the llm still refuses what its queue cannot hold, and the entry's refusal
begins with the llm's words. Without the variable (a plain ``tritonserver``), only the llm refuses.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

QUEUE_FULL_FILE_ENV = "TRITON_LLM_QUEUE_FULL_FILE"
MAX_INSTANCES = 64


def create_queue_full_file(path: Path) -> None:
    """The launcher's part: every instance's byte 0 (not full) before any stub starts."""
    path.write_bytes(bytes(MAX_INSTANCES))


def entry_refusal(max_queue_size: int) -> str:
    """What the entry says; "request queue is full", as the llm's own refusal, is what clients and the front door
    (429) recognise."""
    return f"request queue is full: the llm's {max_queue_size} waiting places are taken; retry later"


def instance_index(instance_name: str) -> int | None:
    """Triton names a model's instances ``<model>_<group>_<index>`` (``llm_0_0``); the index is the instance's
    byte. Instances of later groups share their index's byte, which only makes the entry refuse less. None (the
    instance publishes nothing, so the entry never refuses for it) past ``MAX_INSTANCES`` or for another name."""
    tail = instance_name.rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() and int(tail) < MAX_INSTANCES else None


class QueueFullFlag:
    def __init__(self, path: str | None = None):
        path = path if path is not None else os.environ.get(QUEUE_FULL_FILE_ENV) or None
        self._map: mmap.mmap | None = None
        self.problem = ""  # why a file was named and is not used: only the llm refuses then
        if path is not None:
            try:
                fd = os.open(path, os.O_RDWR)
                try:
                    self._map = mmap.mmap(fd, MAX_INSTANCES)
                finally:
                    os.close(fd)
            except (OSError, ValueError) as exc:
                self.problem = f"no queue-full file ({exc}): the llm alone refuses an overload"

    @property
    def shared(self) -> bool:
        return self._map is not None

    def publish(self, index: int, full: bool) -> None:
        """The llm instance ``index``'s queue has filled (True) or has room again (False)."""
        if self._map is not None:
            self._map[index] = int(full)

    def all_full(self, instances: int) -> bool:
        """Every one of the llm's ``instances`` has a full queue: a new request would only be refused there."""
        return self._map is not None and instances <= MAX_INSTANCES and all(self._map[:instances])
