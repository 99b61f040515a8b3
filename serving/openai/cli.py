"""``python -m serving openai --triton HOST:PORT``: run the front door until SIGTERM/SIGINT (docs/openai.md).

Signals are the front door's own, not uvicorn's: uvicorn would stop listening at once (new clients get a refused
connection, not a 503) and re-raise the signal after shutdown (exit status -15, not 0). Here the first signal
drains: new requests get 503, open streams and requests finish (up to ``--drain-timeout``), then uvicorn stops and
the process exits 0. A second signal stops at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

import uvicorn

from serving.openai.engine_metrics import EngineMetricsRelay
from serving.openai.server import FrontDoor, create_app

CORS_ENV = "LLM_CORS_ORIGINS"
ENGINE_METRICS_PATH_ENV = "LLM_ENGINE_METRICS_PATH"
TRITON_METRICS_PORT = 8002

API_KEY_ENV = "LLM_API_KEY"


def api_keys_from_env() -> list[str]:
    """``LLM_API_KEY``: one key or a comma-separated list; unset or empty: no key required."""
    return [k.strip() for k in os.environ.get(API_KEY_ENV, "").split(",") if k.strip()]


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, front: FrontDoor):
        super().__init__(config)
        self.front = front
        self._drain: asyncio.Task | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self) -> None:
        if self._drain is not None:  # the second signal: out now
            self.force_exit = self.should_exit = True
            return
        self._drain = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self.front.drain()
        self.should_exit = True


async def _announce(server: _Server, front: FrontDoor, host: str, port: int) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    info = await front.model_info()
    print(f"openai front door ready on http://{host}:{port} (model {info.id})", flush=True)


def front_door(args: argparse.Namespace) -> FrontDoor:
    """The front door the arguments describe; ValueError names a bad one."""
    relay = None
    if args.engine_metrics_path:
        metrics_url = args.triton_metrics_url or f"http://{args.triton.rpartition(':')[0]}:{TRITON_METRICS_PORT}/metrics"
        relay = EngineMetricsRelay(args.engine_metrics_path, metrics_url)
    return FrontDoor(args.triton, served_model_name=args.served_model_name, api_keys=api_keys_from_env(),
                     drain_timeout_s=args.drain_timeout, engine_metrics=relay)


async def serve(args: argparse.Namespace, front: FrontDoor) -> int:
    cors = [o.strip() for o in (args.cors_origins or "").split(",") if o.strip()]
    config = uvicorn.Config(create_app(front, cors_origins=cors), host=args.host, port=args.port,
                            log_level=args.log_level,
                            access_log=False, lifespan="on", timeout_graceful_shutdown=3, timeout_keep_alive=5)
    server = _Server(config, front)
    announce = asyncio.ensure_future(_announce(server, front, args.host, args.port))
    try:
        await server.serve()
    finally:
        announce.cancel()
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving openai",
                                     description="OpenAI-compatible HTTP front door for the Triton ensemble "
                                                 f"(API keys: ${API_KEY_ENV}, comma-separated).")
    parser.add_argument("--triton", required=True, metavar="HOST:PORT", help="Triton's gRPC address")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--served-model-name", default=None,
                        help="model id to serve (default: the ensemble's served_model_name parameter)")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds to let open requests finish after SIGTERM/SIGINT")
    parser.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    parser.add_argument("--cors-origins", default=os.environ.get(CORS_ENV, ""),
                        help=f"comma-separated origins browsers may call from ('*': any; default ${CORS_ENV}, empty: "
                             "CORS off); preflights are answered before the API-key check")
    parser.add_argument("--engine-metrics-path", default=os.environ.get(ENGINE_METRICS_PATH_ENV, ""),
                        help="serve the engine's gauges (queue, running, KV cache; Triton's llm_engine_* and "
                             "nv_trt_llm_* families) on this path without an API key, for an inference gateway's "
                             f"endpoint picker (default ${ENGINE_METRICS_PATH_ENV}; empty: off)")
    parser.add_argument("--triton-metrics-url", default=None, metavar="URL",
                        help="Triton's metrics endpoint the engine gauges come from (default: the --triton host, "
                             f"port {TRITON_METRICS_PORT}, /metrics)")
    args = parser.parse_args(argv)
    try:
        front = front_door(args)
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(serve(args, front))


if __name__ == "__main__":
    sys.exit(main())
