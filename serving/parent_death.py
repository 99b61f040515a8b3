"""How the launcher starts its children (tritonserver, the front door): in a process group of their own, and so that
they stop when the launcher dies, however it dies.

A terminal's Ctrl-C sends SIGINT to the whole foreground process group. Only the launcher may get it: it stops the
front door first and then drains Triton. A child that got it too would begin its own shutdown out of order, and the
front door would take the launcher's SIGTERM after it as a second signal ("stop now"), cutting the open streams.

A launcher killed outright (SIGKILL, the OOM killer, a supervisor giving up) runs none of its stop code, and its
tritonserver and front door would live on, holding the ports and the model's memory. Linux can send a child a
signal of our choice when its parent dies (``PR_SET_PDEATHSIG``). We ask for SIGTERM, so an orphan stops as on a
normal stop: the front door finishes its streams, Triton drains.

Linux sends it when the *thread* that started the child ends, not the process: start children from a thread that
lives as long as they do (the launcher's main thread does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def stop_with_parent(sig: signal.Signals = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child get ``sig`` when this process dies (None where
    the kernel has no such thing)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child between fork and exec does little
    parent = os.getpid()

    def in_child() -> None:
        if prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the prctl: no signal will come, so never start
            os._exit(128 + int(sig))

    return in_child


def launcher_child() -> dict:
    """``subprocess.Popen`` keywords for a child of the launcher: its own process group, SIGTERM at our death."""
    return {"process_group": 0, "preexec_fn": stop_with_parent()}
