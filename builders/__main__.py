"""``python -m builders``: default model, CPU engine and Triton model repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .profile import PROJECT_ROOT


def _model(args) -> None:
    from .default_model import build_default_model, build_random_model

    if args.random:
        build_random_model(Path(args.out), seed=args.seed)
    else:
        build_default_model(Path(args.out), seed=args.seed, steps=args.steps, force=args.force)


def _engine(args) -> None:
    from .cpu_build import BuildLimits, build_cpu_engine

    limits = BuildLimits(max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                         max_seq_len=args.max_seq_len, max_num_tokens=args.max_num_tokens)
    out = build_cpu_engine(args.checkpoint, args.output, dtype=args.dtype, limits=limits)
    print(f"CPU engine ({args.dtype}) written to {out}")


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

    p = sub.add_parser("model", help="build the default small Llama checkpoint (cached)")
    p.add_argument("--out", default=str(PROJECT_ROOT / "build/models/default"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="training steps (default: the preset's)")
    p.add_argument("--random", action="store_true", help="tiny untrained model (tests)")
    p.add_argument("--force", action="store_true", help="rebuild even when a matching checkpoint exists")
    p.set_defaults(func=_model)

    p = sub.add_parser("engine", help="build an engine from a Hugging Face checkpoint")
    p.add_argument("--target", choices=["cpu", "trtllm"], default="cpu",
                   help="trtllm: see `python -m builders engine --target trtllm --help`")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-input-len", type=int, default=768)
    p.add_argument("--max-seq-len", type=int, default=1024)
    p.add_argument("--max-num-tokens", type=int, default=256)
    p.set_defaults(func=_engine)

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
