"""Wedge reproducer (issue 27, docs/reliability.md "Wedge storm"): hang-up storms against one layout until the server
stops making progress, with a watchdog that detects the stall and dumps every Python-backend stub's threads.

``--concurrency`` SDK streams run without pause; each asks for ``--max-tokens`` tokens and, with probability
``--abandon``, is abandoned after a random delay in [0, ``--max-delay-s``] (the task reading it is cancelled: the SDK
sends ``stop`` to ``llm`` and reads its call to the end), else read to its end. Progress is any streamed chunk or finished request. When nothing
progresses for ``--stall-s`` seconds the server counts as wedged: gdb prints every stub's threads to
``<workdir>/wedge-N/``, the server is killed and a fresh one starts, until ``--budget-s`` of load has run. The mean
time to wedge is the load time divided by the wedges seen (each server's time counts, also the last one's, which
did not wedge).

    python tests/reliability/scripts/wedge_storm.py --layout trtllm-standin --budget-s 1800
    python tests/reliability/scripts/wedge_storm.py --layout trtllm-standin --no-batcher   # as CI rehearsals 8, 10
    python tests/reliability/scripts/wedge_storm.py --url localhost:8001 --budget-s 300   # a server that runs (GPU)

With ``--url`` the storm runs against a server started elsewhere (builders/gpu_smoke.sh's GPU server): a stall ends
the run with exit code 1 and no thread dump or restart; it needs only the client SDK (tritonclient).
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import parser, write_json

from tests.stack import PROMPTS  # not relkit's imports (psutil): --url runs in the GPU image's tool venv

# python_backend's lock-order cycle (docs/gpu.md): these three frames together in one stub are its signature.
DEADLOCK_FRAMES = ("GetResponseIterator", "EnqueueResponse", "ResponseIterator::Next")


class Progress:
    def __init__(self) -> None:
        self.last = time.monotonic()
        self.chunks = self.completed = self.abandoned = self.failed = 0

    def tick(self) -> None:
        self.last = time.monotonic()


async def _worker(client, rng: random.Random, progress: Progress, args, stop: asyncio.Event) -> None:
    from client import GenerationError, SamplingParams

    while not stop.is_set():
        stream = client.stream(rng.choice(PROMPTS), SamplingParams(max_tokens=args.max_tokens))

        async def consume():
            async for _ in stream:
                progress.chunks += 1
                progress.tick()

        task = asyncio.create_task(consume())
        abandoned = False
        try:
            await asyncio.wait({task}, timeout=rng.uniform(0, args.max_delay_s) if rng.random() < args.abandon
                               else None)
            if not task.done() and args.abandon_by == "stop":  # no cancellation: `stop`, then read to the end
                abandoned = True
                progress.abandoned += 1
                await client._stop_on_server(stream.request_id)  # the SDK's own `stop` (no public call for it)
                await asyncio.wait({task})
        finally:
            if not task.done():  # abandoned (or the storm is over): the SDK sends `stop` and reads its call to the end
                task.cancel()
                progress.abandoned += not abandoned
                # Its `stop` sent before this worker ends too, so no call is left open when the client closes.
                await asyncio.wait({task})
        try:
            await task
            progress.completed += 1
            progress.tick()
        except asyncio.CancelledError:
            pass
        except GenerationError:  # refused (a full queue) or failed: load, not progress
            progress.failed += 1
            await asyncio.sleep(0.05)


async def _load(grpc_url: str, args, progress: Progress, seed: int) -> bool:
    """Run the storm until a stall (True) or the time left (False)."""
    from client import AsyncLLMClient

    stop = asyncio.Event()
    rng = random.Random(seed)
    async with AsyncLLMClient(grpc_url) as client:
        workers = [asyncio.create_task(_worker(client, random.Random(rng.random()), progress, args, stop))
                   for _ in range(args.concurrency)]
        deadline = time.monotonic() + args.time_left
        wedged = False
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            if time.monotonic() - progress.last > args.stall_s:
                wedged = True
                break
        stop.set()
        if args.end == "cancel":
            for w in workers:
                w.cancel()
        await asyncio.wait(workers, timeout=10 if args.end == "cancel" else None)
    return wedged


def dump_threads(server_pid: int, out: Path) -> dict[str, bool]:
    """gdb's backtrace of every thread of every stub of ``server_pid`` → out/<pid>-<model>.txt; which show the
    deadlock's three frames."""
    from serving.launcher import stubs_of

    out.mkdir(parents=True, exist_ok=True)
    found = {}
    for pid in stubs_of(server_pid):
        model = Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1].decode()).parent.parent.name
        text = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"], capture_output=True,
                              text=True, timeout=120).stdout
        (out / f"{pid}-{model}.txt").write_text(text)
        found[f"{pid}-{model}"] = all(frame in text for frame in DEADLOCK_FRAMES)
    return found


def kill_server(server) -> None:
    from serving.launcher import stubs_of

    stubs = list(stubs_of(server.process.pid))
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    for pid in stubs:
        try:
            subprocess.run(["kill", "-9", str(pid)], check=False, capture_output=True)
        except OSError:
            pass


def main() -> None:
    ap = parser(__doc__, "wedge-storm")
    ap.add_argument("--layout", default="trtllm-standin", help="cpu or trtllm-standin")
    ap.add_argument("--url", help="storm a running server's gRPC address instead of starting one")
    ap.add_argument("--no-batcher", action="store_true", help="preprocessing without a dynamic batcher")
    ap.add_argument("--batcher", action="store_true", help="preprocessing with a bounded dynamic batcher")
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--abandon", type=float, default=0.5, help="share of streams abandoned mid-flight")
    ap.add_argument("--max-delay-s", type=float, default=0.3)
    ap.add_argument("--abandon-by", choices=("cancel", "stop"), default="cancel",
                    help="cancel: cancel the task reading the stream (the SDK then stops the request and reads its call "
                         "to the end); stop: send `stop` and read the stream to its final response")
    ap.add_argument("--end", choices=("cancel", "finish"), default="cancel",
                    help="at the end of the load, cancel the streams in flight or let them finish")
    ap.add_argument("--stall-s", type=float, default=30.0, help="no progress this long = wedged")
    ap.add_argument("--budget-s", type=float, default=1800.0, help="seconds of load in all")
    ap.add_argument("--max-wedges", type=int, default=5)
    ap.add_argument("--server-seconds", type=float, default=None,
                    help="restart the server after this long without a wedge (several runs in one budget)")
    args = ap.parse_args()
    if args.url:
        args.time_left = args.budget_s
        progress, started = Progress(), time.monotonic()
        wedged = asyncio.run(_load(args.url, args, progress, seed=0))
        print(f"{args.url}: {'WEDGED: no progress for ' + str(args.stall_s) + ' s after' if wedged else 'clean for'} "
              f"{(progress.last if wedged else time.monotonic()) - started:.0f} s; {progress.chunks} chunks, "
              f"{progress.completed} completed, {progress.abandoned} abandoned, {progress.failed} failed")
        sys.exit(1 if wedged else 0)
    from builders.profile import DynamicBatcher, Stage
    from tests.reliability import relkit
    from tests.stack import render_layout, stack_profile

    args.workdir.mkdir(parents=True, exist_ok=True)
    slots = args.slots or 16  # the tiny engine's max_batch_size
    checkpoint, engine = relkit.build_tiny_stack(args.workdir, {"max_batch_size": slots})
    profile = stack_profile(engine, checkpoint, max_batch_size=slots)
    if args.no_batcher:
        profile = profile.model_copy(update={"preprocessing": Stage(instances=1, batcher=None)})
    elif args.batcher:  # the bounded batcher the profiles had until the wedge was removed (docs/reliability.md B12)
        profile = profile.model_copy(update={"preprocessing": Stage(
            instances=1, batcher=DynamicBatcher(max_queue_delay_us=0, max_queue_size=128))})
    tag = f"{args.layout}{'-nobatcher' if args.no_batcher else '-batcher' if args.batcher else ''}"
    repo = render_layout(args.layout, profile, args.workdir / f"wedge-repo-{tag}")
    runs, spent, wedges = [], 0.0, 0
    while spent < args.budget_s - 1 and wedges < args.max_wedges:
        args.time_left = min(args.budget_s - spent, args.server_seconds or args.budget_s)
        server = relkit.start_server(repo, args.workdir, name=f"wedge-{tag}-{len(runs)}")
        progress = Progress()
        started = time.monotonic()
        wedged = asyncio.run(_load(server.urls.grpc, args, progress, seed=len(runs)))
        seconds = (progress.last if wedged else time.monotonic()) - started
        spent += time.monotonic() - started
        run = {"seconds_to_wedge" if wedged else "seconds_clean": round(seconds, 1), "wedged": wedged,
               "chunks": progress.chunks, "completed": progress.completed, "abandoned": progress.abandoned,
               "failed": progress.failed}
        if wedged:
            wedges += 1
            run["deadlock_signature"] = dump_threads(server.process.pid, args.workdir / f"wedge-{tag}-{len(runs)}")
            kill_server(server)
        else:
            run["server_exit_code"] = server.stop()
        runs.append(run)
        print(f"run {len(runs)}: {run}", flush=True)
    loaded = sum(r.get("seconds_to_wedge", r.get("seconds_clean", 0)) for r in runs)
    summary = {"layout": args.layout, "no_batcher": args.no_batcher, "concurrency": args.concurrency,
               "max_tokens": args.max_tokens, "abandon": args.abandon, "abandon_by": args.abandon_by, "end": args.end,
               "stall_s": args.stall_s,
               "load_seconds": round(loaded, 1), "wedges": wedges,
               "mean_seconds_to_wedge": round(loaded / wedges, 1) if wedges else None,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}
    write_json(args.out / f"{args.name}-{tag}.json", summary)
    print(f"{tag}: {wedges} wedge(s) in {loaded:.0f} s of load"
          + (f", mean time to wedge {loaded / wedges:.0f} s" if wedges else ""))
    sys.exit(0 if not wedges else 1)


if __name__ == "__main__":
    main()
