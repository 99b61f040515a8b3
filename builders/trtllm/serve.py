"""Container entry point for GPU serving: check every engine against this runtime, then *exec* tritonserver.

``exec`` replaces this Python process, so with the image's ``nvidia_entrypoint.sh`` (which execs its
arguments) tritonserver is PID 1: it receives SIGTERM directly, stops accepting requests and drains
in-flight ones for ``--exit-timeout-secs``. For TP × PP > 1 in leader mode the exec'd process is ``mpirun``,
which forwards SIGTERM to every rank.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

NGC_ROOT = Path("/opt/tritonserver")


def build_server_argv(model_repository: Path, extra: list[str], multi_gpu_mode: str) -> tuple[list[str], dict]:
    from serving.launcher import ADMIN_KEY_ENV, ServerConfig, build_command
    from serving.triton_install import TritonInstall

    from .layout import engine_info, server_command
    from .manifest import trtllm_engine_dirs
    from .options import TrtllmOptions

    config = ServerConfig.from_env(model_repository)
    config.exit_timeout_secs = int(os.environ.get("EXIT_TIMEOUT_SECS", config.exit_timeout_secs))
    config.extra_args = list(extra)
    config.drain = False  # tritonserver is exec'd as PID 1 and gets SIGTERM itself: its own exit timeout is the drain
    install = TritonInstall(NGC_ROOT / "bin" / "tritonserver", NGC_ROOT / "backends")
    admin_key = os.environ.get(ADMIN_KEY_ENV) or os.urandom(18).hex()
    base = build_command(config, install, admin_key)[1:]
    engines = trtllm_engine_dirs(model_repository)
    if not engines:
        return [str(install.binary), *base], {}
    engine_cfg = engine_info(next(iter(engines.values())))
    options = TrtllmOptions(multi_gpu_mode=multi_gpu_mode)
    return server_command(model_repository, engine_cfg, options, base, str(install.binary))


def serve_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m builders.trtllm serve",
                                description="check the repository's engines, then exec tritonserver")
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--multi-gpu-mode", choices=["orchestrator", "leader"],
                   default=os.environ.get("TRTLLM_MULTI_GPU_MODE", "orchestrator"))
    p.add_argument("--print-only", action="store_true", help="print the command instead of exec'ing it")
    args = p.parse_args(argv)
    from .manifest import EngineMismatch, check_repository

    if not (args.model_repository / "ensemble" / "config.pbtxt").exists():
        print(f"serve: {args.model_repository} is not a rendered model repository (no ensemble/config.pbtxt); "
              "mount the build output (python -m builders engine --target trtllm) there", file=sys.stderr)
        return 1
    try:
        check_repository(args.model_repository)
    except EngineMismatch as e:
        print(f"serve: {e}", file=sys.stderr, flush=True)
        return 1
    server_argv, extra_env = build_server_argv(args.model_repository, extra, args.multi_gpu_mode)
    # The Python stubs embed the image's python3 (first on PATH, not this tool's venv); the image puts the
    # project on its sys.path with a .pth file (Dockerfile), as the stub ignores PYTHONPATH.
    env = {**os.environ, **extra_env}
    if args.print_only:
        shown = [re.sub(r"admin-key=\S+", "admin-key=***", a) for a in server_argv]
        print(" ".join(f"{k}={v}" for k, v in extra_env.items()) + (" " if extra_env else "") + " ".join(shown))
        return 0
    sys.stdout.flush()
    os.execvpe(server_argv[0], server_argv, env)  # never returns
    return 0  # pragma: no cover
