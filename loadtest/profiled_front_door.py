"""Run ``python -m serving openai`` with cProfile switched on and off by signals, so that a profile holds the
requests only (not start-up imports, not idle time): SIGUSR1 enables the profiler, SIGUSR2 disables it and writes
the stats to the file named by ``--cprofile-out`` (which must come first). Used by
``loadtest.openai_bench.profile_front_door``::

    python -m loadtest.profiled_front_door --cprofile-out F --triton HOST:GRPC --port N
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] != "--cprofile-out":
        raise SystemExit("usage: python -m loadtest.profiled_front_door --cprofile-out FILE <serving openai args>")
    out = sys.argv[2]
    profiler = cProfile.Profile()

    def start(*_):
        profiler.enable()

    def stop(*_):
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["serving", "openai", *sys.argv[3:]]
    runpy.run_module("serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
