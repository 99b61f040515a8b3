"""``python -m builders.trtllm COMMAND``: engine builds, budgets, engine checks and the GPU container entry.

    engine          build (or --dry-run) an engine + repository   (= python -m builders engine --target trtllm)
    budget          print / write the memory budget of a variant on a GPU
    calibration     write the local calibration set (English text from the Python install)
    check-engine    is an engine servable here? (exit 1 with the reasons if not)
    serve           container entry point: check engines, then exec tritonserver
    standin         render the GPU repository over a CPU engine (stand-in executor; make serve LAYOUT=…)
    variants        the variants this machine's GPU (or --gpu) supports, one per line
    worker          a multi-node group's worker pod: sshd for the leader's mpirun (builders/trtllm/multinode.py)
"""

from __future__ import annotations

import argparse
import sys


def _budget(argv):
    from .gpus import UnsupportedOnGpu, lookup_gpu
    from .memory import ModelShape, compute_budget
    from .variants import VARIANTS

    p = argparse.ArgumentParser(prog="python -m builders.trtllm budget")
    p.add_argument("--checkpoint", required=True, help="a Hugging Face checkpoint dir, or its config.json")
    p.add_argument("--variant", choices=list(VARIANTS), default="fp16")
    p.add_argument("--kv-cache-dtype", choices=["fp8", "int8"])
    p.add_argument("--gpu", required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--max-seq-len", type=int, default=4096)
    p.add_argument("--max-num-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-free-gpu-mem-fraction", type=float, default=0.9)
    p.add_argument("--json", default=None, help="write the budget JSON here")
    a = p.parse_args(argv)
    import json
    from pathlib import Path

    path = Path(a.checkpoint)
    config = path if path.suffix == ".json" else path / "config.json"
    shape = ModelShape.from_hf_config(json.loads(config.read_text()))
    try:
        b = compute_budget(shape, a.variant, lookup_gpu(a.gpu), kv_cache_dtype=a.kv_cache_dtype, tp_size=a.tp_size,
                           pp_size=a.pp_size, max_batch_size=a.max_batch_size, max_seq_len=a.max_seq_len,
                           max_num_tokens=a.max_num_tokens,
                           kv_cache_free_gpu_mem_fraction=a.kv_cache_free_gpu_mem_fraction)
    except UnsupportedOnGpu as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(b.summary())
    if a.json:
        b.write(a.json)
    return 0 if b.fits else 1


def _calibration(argv):
    from .calibration import write_calibration_set

    p = argparse.ArgumentParser(prog="python -m builders.trtllm calibration")
    p.add_argument("out_dir")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--chars-per-sample", type=int, default=2048)
    a = p.parse_args(argv)
    print(write_calibration_set(a.out_dir, a.samples, a.chars_per_sample) / "train.jsonl")
    return 0


def _check_engine(argv):
    from .manifest import EngineMismatch, check_engine

    p = argparse.ArgumentParser(prog="python -m builders.trtllm check-engine")
    p.add_argument("engine_dir")
    a = p.parse_args(argv)
    try:
        m = check_engine(a.engine_dir)
    except EngineMismatch as e:
        print(e, file=sys.stderr)
        return 1
    print(f"ok: {a.engine_dir}" + (f" ({m.variant}, TensorRT-LLM {m.trtllm_version}, {m.gpu_name})" if m else
                                    " (check skipped)"))
    return 0


def _standin(argv):
    from ..profile import PROJECT_ROOT, ServingProfile
    from .standin import render_layout
    from cpu_engine.token_sources import TOKEN_SOURCES

    p = argparse.ArgumentParser(prog="python -m builders.trtllm standin")
    p.add_argument("--profile", default=str(PROJECT_ROOT / "builders/profiles/cpu.yaml"), help="a CPU profile")
    p.add_argument("--out", default=str(PROJECT_ROOT / "build/model_repository"))
    p.add_argument("--token-source", choices=TOKEN_SOURCES, default="engine")
    p.add_argument("--engine-dir", default=None, help="override the profile's engine_dir")
    a = p.parse_args(argv)
    out = render_layout("trtllm-standin", ServingProfile.from_yaml(a.profile, engine_dir=a.engine_dir), a.out,
                        a.token_source)
    print(f"GPU layout with the stand-in executor ({a.token_source} tokens) rendered to {out}")
    return 0


def _variants(argv):
    from .gpus import detect_gpus, lookup_gpu, supported_variants

    p = argparse.ArgumentParser(prog="python -m builders.trtllm variants")
    p.add_argument("--gpu", default=None)
    a = p.parse_args(argv)
    gpus = [lookup_gpu(a.gpu)] if a.gpu else detect_gpus()
    if not gpus:
        print("no NVIDIA GPU visible; pass --gpu", file=sys.stderr)
        return 1
    print("\n".join(supported_variants(gpus[0])))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"budget": _budget, "calibration": _calibration, "check-engine": _check_engine,
                "standin": _standin, "variants": _variants}
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] == "engine":
        from .build import engine_main

        return engine_main(argv[1:])
    if argv[0] == "serve":
        from .serve import serve_main

        return serve_main(argv[1:])
    if argv[0] == "worker":
        from .multinode import worker_main

        return worker_main(argv[1:])
    if argv[0] in commands:
        return commands[argv[0]](argv[1:])
    print(f"unknown command {argv[0]!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
