"""Container entry point for GPU serving: check every engine against this runtime, then run tritonserver.

tritonserver runs as a child of serving.launcher's supervisor, as ``make serve`` runs it on CPU, with the liveness
check that generates (``GET /health/generate`` on HEALTH_PORT, serving/health.py: what the chart's livenessProbe and
the image's HEALTHCHECK read) and, by default (``docker run`` of the image), the OpenAI front door (``python -m
serving openai``) on OPENAI_PORT; ``--no-openai`` (what the Helm chart's Triton container passes: the front door is a
container of its own there) leaves the front door out. SIGTERM stops the front door first (it finishes its open
streams), then the launcher drains Triton as on CPU (new requests refused with UNAVAILABLE, accepted ones finish,
up to EXIT_TIMEOUT_SECS: serving/drain.py), then tritonserver gets SIGTERM; tritonserver dying on its own stops the
rest and exits non-zero. For TP × PP > 1 in leader mode the child is ``mpirun``, which forwards SIGTERM to
every rank. Not exec'd as PID 1: a tritonserver alone answers ``/v2/health/live`` while its Python model is stuck
(docs/reliability.md, "Liveness").
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from .multinode import GroupHosts

NGC_ROOT = Path("/opt/tritonserver")
#: Flags TensorRT-LLM's ``triton_backend/scripts/launch_triton_server.py`` (``add_multi_model_config``) adds when
#: the backend spawns its own MPI workers (``--multi-model`` without ``--disable-spawn-processes``, i.e.
#: TRTLLM_ORCHESTRATOR=1 with TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES=1, on Triton > 24.06): no pinned or per-GPU
#: CUDA memory pool in the tritonserver process and no peer access, leaving GPU memory to the spawned workers.
ORCHESTRATOR_FLAGS = ("--pinned-memory-pool-byte-size=0", "--enable-peer-access=false")
#: Ranks > 0 serve nothing (as kubernetes-sigs/lws docs/examples/tensorrt-llm starts them): our ``llm`` (a Python
#: model) finishes loading on a worker rank, so their tritonservers would go on to bind rank 0's ports (the same pod)
#: or open ports nobody calls (another pod of the group).
WORKER_RANK_FLAGS = ("--allow-http=false", "--allow-grpc=false", "--allow-metrics=false")
#: The flags of the endpoints a worker rank does not open.
_ENDPOINT_FLAGS = ("--http-", "--grpc-", "--metrics-", "--allow-http", "--allow-grpc", "--allow-metrics",
                   "--allow-gpu-metrics")


def server_command(model_repository: str | Path, engine_cfg: dict, options, base_args: list[str],
                   tritonserver: str = "/opt/tritonserver/bin/tritonserver", n_gpus: int | None = None,
                   llm_model_name: str = "llm", group: GroupHosts | None = None) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment to serve the repository, the way the backend's own launcher
    (``launch_triton_server.py``, TensorRT-LLM release/1.2.1 via tensorrtllm_backend r26.07) starts it.

    World size 1: one tritonserver. TP × PP > 1, orchestrator mode: one tritonserver with
    ``TRTLLM_ORCHESTRATOR=1`` (the llm's executor spawns one MPI worker per rank) plus the launcher's spawn-mode
    memory flags, one ``--cuda-memory-pool-byte-size=J:0`` per visible GPU (``n_gpus``). Leader mode: ``mpirun`` with
    one tritonserver per rank, each with ``--disable-auto-complete-config`` and its own Python shm prefix; ranks > 0
    load only the llm (``--model-control-mode=explicit --load-model=…``), whose executor follows rank 0's, and serve
    no endpoint (WORKER_RANK_FLAGS). Rank 0 keeps ``--model-control-mode=none``, Triton's default, which the launcher
    leaves implicit (docs/gpu.md). ``group`` (a LeaderWorkerSet group of several pods): mpirun places the ranks on
    its hosts over ssh, rank 0 on the leader.

    ``base_args`` are tritonserver's flags after the binary as serving.launcher builds them (ports, control mode
    none, ``--disable-auto-complete-config``, restricted APIs, …); each flag appears once per process.
    """
    from .layout import world_size

    world = world_size(engine_cfg)
    repo = f"--model-repository={Path(model_repository)}"
    base = [a for a in base_args if not a.startswith("--model-repository=")]
    if "--disable-auto-complete-config" not in base:
        base.append("--disable-auto-complete-config")
    if world == 1:
        return [tritonserver, repo, *base], {}
    if options.multi_gpu_mode == "orchestrator":
        pools = [f"--cuda-memory-pool-byte-size={j}:0" for j in range(n_gpus if n_gpus is not None else world)]
        return ([tritonserver, repo, *base, *ORCHESTRATOR_FLAGS, *pools],
                {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"})
    if group is not None and group.gpus_per_host * len(group.hosts) != world:
        raise ValueError(f"the engine has {world} ranks (TP x PP), the group {len(group.hosts)} pods x "
                         f"{group.gpus_per_host} GPUs")
    argv = ["mpirun", "--allow-run-as-root", *(group.mpirun_args() if group else [])]
    for rank in range(world):
        rank_args = [a for a in base if not a.startswith("--model-control-mode=")]
        if rank == 0:
            rank_args.append("--model-control-mode=none")
        else:
            rank_args = [a for a in rank_args if not a.startswith(_ENDPOINT_FLAGS)]
            rank_args += ["--model-control-mode=explicit", f"--load-model={llm_model_name}", *WORKER_RANK_FLAGS]
        argv += ["-n", "1", tritonserver, repo, *rank_args,
                 f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        if rank != world - 1:
            argv.append(":")
    return argv, {}


def build_server_argv(model_repository: Path, extra: list[str], multi_gpu_mode: str,
                      group: GroupHosts | None = None) -> tuple[list[str], dict]:
    from serving.launcher import ADMIN_KEY_ENV, ServerConfig, build_command
    from serving.triton_install import TritonInstall

    from .gpus import detect_gpus
    from .layout import engine_info
    from .manifest import trtllm_engine_dirs
    from .options import TrtllmOptions

    config = ServerConfig.from_env(model_repository)
    config.exit_timeout_secs = int(os.environ.get("EXIT_TIMEOUT_SECS", config.exit_timeout_secs))
    config.extra_args = list(extra)
    # The launcher drains first, as on CPU: the llm is the same model, which reads the drain file and reports its
    # engine's gauges (serving/drain.py); tritonserver's own exit timeout then only covers unloading.
    config.drain = True
    install = TritonInstall(NGC_ROOT / "bin" / "tritonserver", NGC_ROOT / "backends")
    admin_key = os.environ.get(ADMIN_KEY_ENV) or os.urandom(18).hex()
    base = build_command(config, install, admin_key)[1:]
    engines = trtllm_engine_dirs(model_repository)
    if not engines:
        return [str(install.binary), *base], {}
    (llm, engine_dir), = engines.items()
    engine_cfg = engine_info(engine_dir)
    options = TrtllmOptions(multi_gpu_mode=multi_gpu_mode)
    n_gpus = len(detect_gpus()) if multi_gpu_mode == "orchestrator" else None
    return server_command(model_repository, engine_cfg, options, base, str(install.binary), n_gpus=n_gpus or None,
                          llm_model_name=llm, group=group)


def serve_supervised(model_repository: Path, server_argv: list[str], env: dict[str, str], ready_timeout: float,
                     openai: bool, health_deadline_s: float) -> int:
    """Run ``server_argv`` under serving.launcher's supervisor, with the liveness endpoint and (``openai``) the OpenAI
    front door (module docstring)."""
    from serving.launcher import (DEFAULT_HEALTH_PORT, DEFAULT_OPENAI_PORT, ServerConfig, TritonServer,
                                  serve_until_stopped)

    class PreparedServer(TritonServer):  # the launcher's process handling, our command (mpirun included)
        def prepare(self) -> tuple[list[str], dict[str, str]]:
            return server_argv, env

    config = ServerConfig.from_env(model_repository)  # ports (OPENAI_PORT, HEALTH_PORT too) and the stop budget
    config.openai_port = None if not openai else DEFAULT_OPENAI_PORT if config.openai_port is None \
        else config.openai_port
    config.health_port = DEFAULT_HEALTH_PORT if config.health_port is None else config.health_port
    config.health_deadline_s = health_deadline_s
    config.exit_timeout_secs = int(os.environ.get("EXIT_TIMEOUT_SECS", config.exit_timeout_secs))
    return serve_until_stopped(PreparedServer(config, ready_timeout=ready_timeout), ready_timeout)


def serve_main(argv: list[str] | None = None) -> int:
    from serving.health import DEFAULT_DEADLINE_S

    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m builders.trtllm serve",
                                description="check the repository's engines, then run tritonserver")
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--multi-gpu-mode", choices=["orchestrator", "leader"],
                   default=os.environ.get("TRTLLM_MULTI_GPU_MODE", "orchestrator"))
    p.add_argument("--gpus-per-host", type=int, default=int(os.environ.get("TRTLLM_GPUS_PER_HOST", "1")),
                   help="leader mode in a LeaderWorkerSet group: the GPUs of each pod (ranks per pod)")
    p.add_argument("--print-only", action="store_true", help="print the command instead of exec'ing it")
    p.add_argument("--no-openai", action="store_true",
                   help="without the OpenAI front door (Kubernetes runs it in a container of its own)")
    p.add_argument("--health-deadline", type=float, default=DEFAULT_DEADLINE_S,
                   help="seconds the liveness check (GET /health/generate on HEALTH_PORT) waits for its token")
    p.add_argument("--ready-timeout", type=float, default=1800.0,
                   help="with the front door: seconds to wait for Triton's readiness before giving up")
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
    group = None
    if args.multi_gpu_mode == "leader":  # a LeaderWorkerSet group of several pods: ranks on every pod
        group = GroupHosts.from_env(dict(os.environ), gpus_per_host=args.gpus_per_host)
    server_argv, extra_env = build_server_argv(args.model_repository, extra, args.multi_gpu_mode, group)
    if group is not None and not args.print_only:
        from .multinode import private_key_copy

        private_key_copy()
        group.wait_for_workers(args.ready_timeout)
    # The Python stubs embed the image's python3 (first on PATH, not this tool's venv); the image puts the
    # project on its sys.path with a .pth file (Dockerfile), as the stub ignores PYTHONPATH.
    env = {**os.environ, **extra_env}
    if args.print_only:
        shown = [re.sub(r"admin-key=\S+", "admin-key=***", a) for a in server_argv]
        print(" ".join(f"{k}={v}" for k, v in extra_env.items()) + (" " if extra_env else "") + " ".join(shown))
        return 0
    return serve_supervised(args.model_repository, server_argv, env, args.ready_timeout, not args.no_openai,
                            args.health_deadline)
