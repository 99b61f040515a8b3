"""Noise accounting: the CPU other processes used while a measurement ran, a canary that shows a machine slowed by
what this VM cannot see, and a wait for quiet before each group."""

from __future__ import annotations

import os
import time
from pathlib import Path


class CpuMonitor:
    """CPU used on the machine by processes outside this process tree while a measurement runs."""

    def __init__(self):
        try:
            import psutil
        except ImportError:  # only the load average then
            psutil = None
        self._psutil = psutil

    @staticmethod
    def _machine_busy() -> float:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def _ours(self) -> float:
        t = os.times()
        total = t.user + t.system + t.children_user + t.children_system  # children: those already waited for
        if self._psutil is not None:
            for child in self._psutil.Process().children(recursive=True):
                try:
                    ct = child.cpu_times()
                    total += ct.user + ct.system
                except self._psutil.Error:
                    pass
        return total

    def start(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._machine_busy(), self._ours()

    def stop(self, mark: tuple[float, float, float]) -> dict:
        t0, busy0, ours0 = mark
        wall = max(time.perf_counter() - t0, 1e-9)
        busy, ours = self._machine_busy() - busy0, self._ours() - ours0
        return {"wall_s": wall, "machine_cores": busy / wall, "ours_cores": ours / wall,
                "foreign_cores": max(0.0, (busy - ours) / wall), "load1": os.getloadavg()[0]}


    def _tree(self):
        """(process, label) for this process and each descendant (Triton stubs labelled by model name)."""
        if self._psutil is None:
            return
        me = self._psutil.Process()
        for proc in [me] + me.children(recursive=True):
            try:
                cmd = proc.cmdline()
            except self._psutil.Error:
                continue
            if proc.pid == me.pid:
                label = "bench process (client / in-process engine)"
            elif cmd and cmd[0].endswith("triton_python_backend_stub"):
                label = f"python stub: {Path(cmd[1]).parent.parent.name}" if len(cmd) > 1 else "python stub"
            elif cmd and cmd[0].endswith("tritonserver"):
                label = "tritonserver (core, gRPC, ensemble)"
            else:
                label = Path(cmd[0]).name if cmd else proc.name()
            yield proc, label

    def processes(self) -> dict[int, tuple[str, float]]:
        """CPU seconds so far of this process and each descendant, labelled."""
        out = {}
        for proc, label in self._tree():
            try:
                ct = proc.cpu_times()
            except self._psutil.Error:
                continue
            out[proc.pid] = (label, ct.user + ct.system)
        return out

    def rss_mb(self, label: str) -> float | None:
        """Resident memory of the descendant(s) with ``label``, MB (None without psutil or no such process)."""
        total = None
        for proc, name in self._tree():
            if name == label:
                try:
                    total = (total or 0.0) + proc.memory_info().rss / 2**20
                except self._psutil.Error:
                    continue
        return total and round(total, 1)

    @staticmethod
    def breakdown(before: dict, after: dict, wall: float) -> dict[str, float]:
        """Cores used per label between two ``processes()`` snapshots."""
        per: dict[str, float] = {}
        for pid, (label, cpu) in after.items():
            per[label] = per.get(label, 0.0) + (cpu - before.get(pid, (label, 0.0))[1]) / wall
        return {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}


MONITOR = CpuMonitor()


def canary() -> dict:
    """A fixed small workload timed just before a group: it shows a machine slowed by something this VM cannot
    see (other VMs on the host, memory-bandwidth contention) as well as by visible processes."""
    import torch

    t = time.perf_counter()
    acc = 0
    for i in range(200_000):
        acc += i
    py_ms = 1e3 * (time.perf_counter() - t)
    a = torch.randn(384, 384)
    a @ a
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    gflops = 20 * 2 * 384**3 / (time.perf_counter() - t) / 1e9
    x = torch.empty(16 * 2**20)  # 64 MB, beyond the caches
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    for _ in range(4):
        y.copy_(x)
    gbs = 4 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9
    return {"python_loop_ms": round(py_ms, 2), "matmul_gflops": round(gflops, 1), "copy_gb_s": round(gbs, 1)}


def wait_quiet(max_wait_s: float, threshold: float) -> float:
    """Wait (up to max_wait_s) until other processes use < threshold cores over 2 s; returns seconds waited."""
    start = time.perf_counter()
    while True:
        mark = MONITOR.start()
        time.sleep(2.0)
        if MONITOR.stop(mark)["foreign_cores"] < threshold or time.perf_counter() - start >= max_wait_s:
            return time.perf_counter() - start


def noise_fields(noise: dict) -> dict:
    return {"foreign_cores": round(noise["foreign_cores"], 3), "machine_cores": round(noise["machine_cores"], 3),
            "load1": round(noise["load1"], 2)}
