"""Hang-up storm through the OpenAI front door (docs/reliability.md "Hang-up storm"): what `make serve` runs (the
launcher, tritonserver, the front door), loaded for minutes by ``openai`` SDK clients of which half hang up.

``--concurrency`` clients send requests without pause: chat and text completions, streamed and not. With probability
``--abandon`` a client hangs up after a random delay in [0, ``--max-delay-s``] — it closes the HTTP connection, as an
agent does when it times out or its user presses stop — else it reads the answer to its end. A watchdog calls the
server wedged when nothing (no chunk, no answer, no refusal) arrives for ``--stall-s`` seconds. Once the load ends,
the server must come back to rest by itself: no engine slot held, nothing queued, no KV block held by a request, no
request in flight in the front door. Then the first-minute question is answered (greedy; streamed = non-streamed,
and containing ``--expect``), and the launcher drains and exits 0 on SIGTERM. Every 5 s the RSS of the llm stub and
the front door and the engine gauges are recorded; the tokens the engine generated beyond those the clients read
show whether hang-ups reach it.

    make repository   # the default engine and repository, as `make serve` builds them
    .venv/bin/python tests/reliability/scripts/hangup_storm.py --repository build/model_repository --duration 600

Without ``--repository`` it serves the test suite's tiny random model (``--expect`` defaults to nothing then).
tests/reliability/test_rel_hangup_storm.py runs it for seconds on both layouts in CI. Exit code 0 = PASS.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import parser, publish, replot, repository
from wedge_storm import dump_threads

from tests.stack import PROMPTS

FIRST_QUESTION = "What is the capital of France?"  # scripts/first_minute.py's
KINDS = ("chat-stream", "chat", "completion-stream", "completion")


@dataclass
class Tally:
    last_progress: float = field(default_factory=time.monotonic)
    chunks: int = 0  # content chunks the clients read
    completed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    abandoned: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    mid_stream: int = 0  # hang-ups of streams that had read at least one chunk (the rest: queued or prefilling)
    cut_at_end: int = 0  # in flight when the load ended: every client hangs up at once, the last wave
    refused: int = 0  # 429 / 503: overload answered fast, as promised
    failed: list[str] = field(default_factory=list)  # anything else: a defect
    tokens_read: int = 0  # completion tokens of answers read to the end (their usage)

    def progress(self) -> None:
        self.last_progress = time.monotonic()


async def _request(client, model: str, kind: str, prompt: str, max_tokens: int, tally: Tally,
                   read: list[int]) -> None:
    """One request read to its end (or until the task reading it is cancelled: the hang-up); ``read[0]`` counts its
    chunks."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.8}
    if kind.startswith("chat"):
        create, body["messages"] = client.chat.completions.create, [{"role": "user", "content": prompt}]
    else:
        create, body["prompt"] = client.completions.create, prompt
    if not kind.endswith("stream"):
        answer = await create(**body)
        tally.tokens_read += answer.usage.completion_tokens
        return
    # The context manager closes the response (the connection) however the block ends: a cancelled task hangs up.
    async with await create(**body, stream=True, stream_options={"include_usage": True}) as stream:
        async for chunk in stream:
            if chunk.usage is not None:
                tally.tokens_read += chunk.usage.completion_tokens
            elif chunk.choices:
                read[0] += 1
                tally.chunks += 1
                tally.progress()


async def _client(client, model: str, rng: random.Random, args, tally: Tally, stop: asyncio.Event) -> None:
    import openai

    storm_over = asyncio.ensure_future(stop.wait())
    task = None
    try:
        while not stop.is_set():
            kind = rng.choice(KINDS)
            read = [0]
            task = asyncio.ensure_future(_request(client, model, kind, rng.choice(PROMPTS), args.max_tokens, tally,
                                                  read))
            hang_up_after = rng.uniform(0, args.max_delay_s) if rng.random() < args.abandon else None
            await asyncio.wait({task, storm_over}, timeout=hang_up_after, return_when=asyncio.FIRST_COMPLETED)
            hung_up = not task.done()
            if hung_up:  # its time is up, or the storm's. A hang-up is the client's doing: no progress of the server.
                task.cancel()
                if stop.is_set():
                    tally.cut_at_end += 1
                else:
                    tally.abandoned[kind] += 1
                    tally.mid_stream += read[0] > 0
            await asyncio.wait({task})  # the hang-up done (connection closed); never raises the request's error
            if hung_up or task.cancelled():
                continue
            exc = task.exception()
            if exc is None:
                tally.completed[kind] += 1
                tally.progress()
            elif isinstance(exc, openai.APIStatusError) and exc.status_code in (429, 503):
                tally.refused += 1  # overload answered at once, as promised: the server did answer
                tally.progress()
                await asyncio.sleep(0.05)
            elif isinstance(exc, openai.APIStatusError):
                tally.failed.append(f"{kind}: HTTP {exc.status_code} {exc.message}"[:300])
            else:
                tally.failed.append(f"{kind}: {type(exc).__name__}: {exc}"[:300])
    finally:  # also when this client itself is cancelled (Ctrl-C): hang up what is open
        storm_over.cancel()
        if task is not None and not task.done():
            task.cancel()


async def _storm(openai_url: str, model: str, args, tally: Tally, sample) -> bool:
    """The load for ``args.duration`` s, or until a stall (True). ``sample`` runs on a thread (psutil and two
    scrapes), so that the clients and the watchdog never wait for it."""
    import openai

    async with openai.AsyncOpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=120) as client:
        stop = asyncio.Event()
        rng = random.Random(args.seed)
        clients = [asyncio.ensure_future(_client(client, model, random.Random(rng.random()), args, tally, stop))
                   for _ in range(args.concurrency)]
        started = time.monotonic()
        tally.progress()  # the watchdog counts from here, not from the server's start
        next_sample, wedged, sampling = started, False, None
        while (now := time.monotonic()) - started < args.duration:
            if now >= next_sample and (sampling is None or sampling.done()):
                sampling = asyncio.ensure_future(asyncio.to_thread(sample, now - started))
                next_sample += args.sample_s
            if now - tally.last_progress > args.stall_s:
                wedged = True
                break
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*clients, *([sampling] if sampling is not None else []))
    return wedged


class Samples:
    """RSS of the llm stub and the front door, engine gauges and counters, every ``--sample-s`` seconds."""

    def __init__(self, launcher_pid: int, metrics_url: str, openai_metrics_url: str):
        self.launcher_pid, self.metrics_url, self.openai_metrics_url = launcher_pid, metrics_url, openai_metrics_url
        self.rows: list[dict] = []

    def processes(self) -> dict[str, object]:
        import psutil

        found = {}
        try:
            children = psutil.Process(self.launcher_pid).children(recursive=True)
        except psutil.Error:  # the launcher has gone
            return found
        for proc in children:
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:  # gone between listing and reading
                continue
            if "-m serving openai" in cmd:
                found["front_door"] = proc
            elif "triton_python_backend_stub" in cmd and "/llm/" in cmd:
                found["llm"] = proc
            elif cmd.split(" ")[0].endswith("tritonserver"):
                found["tritonserver"] = proc
        return found

    def engine(self) -> dict:
        from serving.prometheus import fetch, total

        s = fetch(self.metrics_url)
        front = fetch(self.openai_metrics_url)
        # total() reads a series that is not there as 0: a renamed gauge must not look like a server at rest.
        wanted = {"llm_engine_active_slots": s, "llm_engine_queued_requests": s, "llm_engine_kv_cache_occupancy": s,
                  "openai_requests_in_flight": front}
        missing = [name for name, samples in wanted.items() if not any(n == name for n, _ in samples)]
        if missing:
            raise OSError(f"no {', '.join(missing)} on the metrics endpoints")
        return {"active": total(s, "llm_engine_active_slots"), "queued": total(s, "llm_engine_queued_requests"),
                "kv_occupancy": total(s, "llm_engine_kv_cache_occupancy"),
                "generated_tokens": total(s, "llm_generation_tokens_total"),
                "finished": {r: total(s, "llm_requests_finished_total", reason=r)
                             for r in ("length", "stop", "cancelled", "error")},
                "front_door_in_flight": total(front, "openai_requests_in_flight")}

    def __call__(self, t: float, tally: Tally | None = None, phase: str = "load") -> dict:
        row = {"t": round(t, 1), "phase": phase}
        for name, proc in self.processes().items():
            try:
                row[f"{name}_rss_mib"] = round(proc.memory_info().rss / 2**20, 1)
            except Exception:  # noqa: BLE001 - gone between listing and reading
                pass
        try:
            row.update(self.engine())
        except OSError:
            pass
        if tally is not None:
            row.update(chunks=tally.chunks, completed=sum(tally.completed.values()),
                       abandoned=sum(tally.abandoned.values()), refused=tally.refused, failed=len(tally.failed))
        self.rows.append(row)
        return row


def _at_rest(samples: Samples, started: float, load_end: float, timeout: float) -> tuple[dict, float | None]:
    """The first sample after the load with nothing held anywhere, and how long after the load it came (None: the
    last sample, still holding something after ``timeout``)."""
    while True:
        now = time.monotonic()
        row = samples(now - started, phase="after")
        if (row.get("active"), row.get("queued"), row.get("kv_occupancy"), row.get("front_door_in_flight")) \
                == (0, 0, 0, 0):
            return row, now - load_end
        if now - load_end > timeout:
            return row, None
        time.sleep(0.5)


def _first_question(openai_url: str, model: str) -> dict:
    import openai

    client = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": FIRST_QUESTION}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=32, temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=messages, max_tokens=32, temperature=0, stream=True) if c.choices)
    return {"answer": whole.choices[0].message.content, "streamed_equal": streamed == whole.choices[0].message.content}


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["samples"]
    t = [r["t"] for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    load = [r for r in rows if r["phase"] == "load"]
    def rate(key: str) -> list[float]:
        return [(b[key] - a[key]) / (b["t"] - a["t"]) for a, b in zip(load, load[1:])]

    ax1.plot([r["t"] for r in load[1:]], rate("chunks"), label="chunks read / s")
    ax1.set_ylabel("chunks read / s")
    right = ax1.twinx()
    right.plot([r["t"] for r in load[1:]], rate("abandoned"), color="tab:red", label="hang-ups / s")
    right.set_ylabel("hang-ups / s", color="tab:red")
    right.set_ylim(bottom=0)
    ax2.plot(t, [r.get("active") for r in rows], label="engine slots held")
    ax2.plot(t, [r.get("front_door_in_flight") for r in rows], label="front door in flight")
    ax2.plot(t, [r.get("queued") for r in rows], label="queued")
    ax2.legend(loc="upper right")
    for key, label in (("llm_rss_mib", "llm stub"), ("front_door_rss_mib", "front door"),
                       ("tritonserver_rss_mib", "tritonserver")):
        ax3.plot(t, [r.get(key) for r in rows], label=label)
    ax3.set_ylabel("RSS (MiB)")
    ax3.set_xlabel("seconds from the start of the load (after it: the server coming to rest)")
    ax3.legend(loc="center right")
    layout = result["report"].get("layout")
    fig.suptitle(f"Hang-up storm via the OpenAI front door{f' ({layout})' if layout else ''}: "
                 f"{result['report']['concurrency']} clients, {result['report']['abandon']:.0%} hang up")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def layout_of(repo: Path) -> str:
    """The GPU layout's llm names the executor bindings it imports (TensorRT-LLM's, or the CPU stand-in's)."""
    config = (repo / "llm" / "config.pbtxt").read_text()
    if "executor_bindings" not in config:
        return "CPU layout"
    return "GPU layout" + ("" if "tensorrt_llm.bindings" in config else ", stand-in executor")


def main() -> None:
    ap = parser(__doc__, "hangup-storm")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=32, help="clients sending without pause (2× the default "
                    "engine's slots: half wait in the llm's queue)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--abandon", type=float, default=0.5, help="share of requests whose client hangs up")
    ap.add_argument("--max-delay-s", type=float, default=15.0,
                    help="a hang-up comes after 0 to this many seconds (the default model's requests take ~5-15 s "
                         "here, queue included: hang-ups land in the queue, in prefill and mid-stream)")
    ap.add_argument("--stall-s", type=float, default=30.0, help="nothing arriving this long = wedged")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--expect", default=None,
                    help="text the greedy answer to the first-minute question must contain afterwards (default: "
                         "'Paris' with --repository, the default model's; nothing for the tiny random model)")
    args = ap.parse_args()
    if replot(args, plot):
        return
    import json

    import requests

    from serving.launcher import free_ports
    from tests.reliability import relkit

    repo = args.repository.resolve() if args.repository is not None else repository(args)[0]
    expect = args.expect if args.expect is not None else "Paris" if args.repository is not None else ""
    ports = free_ports(4)
    args.workdir.mkdir(parents=True, exist_ok=True)
    log = args.workdir / f"{args.name}-launcher.log"
    launcher = relkit.launch_cli(repo, log, ports, exit_timeout_secs=30)
    report: dict = {"repository": str(repo), "layout": layout_of(repo), "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                    "abandon": args.abandon, "max_delay_s": args.max_delay_s, "duration_s": args.duration,
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    samples = Samples(launcher.pid, f"http://localhost:{ports[2]}/metrics", f"http://localhost:{ports[3]}/metrics")
    tally, wedged = Tally(), False
    try:
        relkit.wait_cli_ready(launcher, log)
        openai_url = f"http://localhost:{ports[3]}/v1"
        report["model"] = model = requests.get(f"{openai_url}/models", timeout=10).json()["data"][0]["id"]
        before = samples(0.0, tally, phase="before")
        print(f"storm: {args.concurrency} clients for {args.duration:.0f} s on {repo}", flush=True)
        started = time.monotonic()
        wedged = asyncio.run(_storm(openai_url, model, args, tally, lambda t: print(
            f"  {t:5.0f} s {samples(t, tally)}", flush=True)))
        load_end = time.monotonic()
        report.update(wedged=wedged, completed=tally.completed, abandoned=tally.abandoned, refused=tally.refused,
                      failed=len(tally.failed), failures=tally.failed[:20], mid_stream_hang_ups=tally.mid_stream,
                      cut_at_end=tally.cut_at_end,
                      chunks_read=tally.chunks)
        if wedged:
            server = samples.processes().get("tritonserver")
            report["threads"] = (dump_threads(server.pid, args.workdir / "hangup-wedge") if server is not None
                                 else "tritonserver had exited")
        else:
            rest, after_s = _at_rest(samples, started, load_end, timeout=60)
            report.update(at_rest_after_s=None if after_s is None else round(after_s, 1),
                          tokens_read_by_finished_requests=tally.tokens_read)
            if "finished" in rest and "finished" in before:
                finished = {r: rest["finished"][r] - before["finished"][r] for r in rest["finished"]}
                report.update(engine_finished=finished,
                              tokens_generated=rest["generated_tokens"] - before["generated_tokens"])
            try:
                report["first_question"] = _first_question(openai_url, model)
            except Exception as exc:  # noqa: BLE001 - a failed answer is this run's finding, reported with the rest
                report["first_question"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        report["rss_mib_before_after"] = {k: [before.get(k), samples.rows[-1].get(k)] for k in before
                                          if k.endswith("_rss_mib")}
    finally:
        rc, stop_s = relkit.terminate_and_wait(launcher)
    text = log.read_text("utf-8", "replace")
    report.update(exit_code=rc, stop_s=round(stop_s, 1), traceback_in_log="Traceback" in text)
    answer = report.get("first_question", {})
    passed = bool(not wedged and report.get("at_rest_after_s") is not None and not tally.failed and rc == 0
              and not report["traceback_in_log"]
              and answer.get("streamed_equal") and expect in answer.get("answer", ""))
    report["verdict"] = "PASS" if passed else "FAIL"
    result = {"report": report, "samples": samples.rows}
    publish(args, result, result, plot)
    print(json.dumps(report, indent=1, default=str))
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()
