"""The process's memory, kept bounded for a server that runs for weeks.

Two caches keep a compiled kernel per tensor shape, sized for training jobs that see a few shapes: oneDNN's primitive
cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024 JIT-compiled kernels) and ideep's cache of torch's mkldnn ops
(``LRU_CACHE_CAPACITY``, 1,024). A server sees a new shape (batch rows × KV length × prompt chunk) almost every step,
so both only grow: 1,200 bf16 linears of distinct row counts grew RSS by 639 MB with their defaults and by 6 MB with
both at 8. Both variables are read when the first kernel is made, so setting them before an engine loads is in time;
an operator's own value wins.

glibc keeps the heap pages a burst of requests freed (fragments among live blocks) until asked: the engine gives them
back when it goes idle (``malloc_trim``; 200 MB after 150 mixed requests in-process).
"""

from __future__ import annotations

import ctypes
import os

#: Kernels each cache keeps: a decode step's shapes recur while a batch grows, so a few dozen already hit.
KERNEL_CACHE_ENTRIES = 64


def bound_kernel_caches() -> None:
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(KERNEL_CACHE_ENTRIES))


# Looked up once: the engine calls it each time it goes idle. The process's own symbols: libc is loaded already.
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS. Not glibc (musl, macOS): nothing to do."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
