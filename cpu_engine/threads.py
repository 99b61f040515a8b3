"""Keep torch's OpenMP work on the engine thread, so its kernels run on every core.

libgomp gives each thread that starts a parallel region its own pool of worker threads, kept until that thread
exits, and once the pools together hold more threads than there are CPUs it stops letting idle workers spin
(100 spins instead of ~3 ms): every parallel region then pays a futex wake-up. A decode step of a 30-layer model
opens hundreds of small regions, so on 2 cores an engine thread beside a caller thread that had run one big op
(loading weights, zeroing the KV cache) decoded int8 at half speed, with ~1.1 cores busy instead of 2
(28.8 vs 13.2 ms per step, measured in one process with and without a pool on the main thread).
Heavy set-up therefore runs in a scratch thread that exits, and its pool with it.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_scratch_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` in a short-lived thread; its result returned, its exception re-raised here."""
    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller, with its traceback
            result["error"] = exc

    thread = threading.Thread(target=target, name="torch-setup")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]
