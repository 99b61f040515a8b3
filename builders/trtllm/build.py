"""``python -m builders engine --target trtllm``: gate → budget → convert/quantize → trtllm-build →
manifest → GPU model repository. ``--dry-run`` prints every command and the rendered repository and runs
nothing (no GPU, no TensorRT-LLM needed); that is what the CPU tests exercise.

Output directory (mount it into the serving container, e.g. at /engines/llama)::

    checkpoint/          TensorRT-LLM checkpoint (intermediate; safe to delete after the build)
    calibration/         train.jsonl (calibrated variants only) + calibration.json beside it
    engine/              config.json, rank*.engine, manifest.json
    tokenizer/           the checkpoint's tokenizer files (what preprocessing and the llm load)
    memory_budget.json   the budget printed at the start
    model_repository/    the rendered Triton repository, paths as the server sees them
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .gpus import UnsupportedOnGpu, detect_gpus, lookup_gpu
from .options import GpuProfile
from .pins import (CONVERT_SCRIPT, DEFAULT_TRTLLM_SRC, IMAGE_TRTLLM_SRC_ROOTS, QUANTIZE_SCRIPT, TRITON_IMAGE,
                   TRTLLM_VERSION)
from .plan import BuildLimits, BuildPlan, make_plan, plan_commands, predict_engine_config
from .variants import VARIANTS

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json", "config.json")


def add_engine_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--target", choices=["trtllm"], default="trtllm", help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", required=True, help="Hugging Face Llama/Mistral checkpoint directory")
    p.add_argument("--output", required=True, help="build output directory (see module docstring)")
    p.add_argument("--variant", choices=list(VARIANTS), default="fp16")
    p.add_argument("--kv-cache-dtype", choices=["fp8", "int8"], default=None,
                   help="quantized KV cache (calibrated variants only); default: the model dtype")
    p.add_argument("--gpu", default=None, help="plan for this GPU (A10, L4, A100, H100, … or NAME:CC:GIB); "
                   "default: the GPU nvidia-smi reports")
    p.add_argument("--profile", default="latency", help="latency | throughput | path to a GPU profile YAML")
    p.add_argument("--max-batch-size", type=int)
    p.add_argument("--max-input-len", type=int)
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--max-num-tokens", type=int)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default=None, help="activation dtype")
    p.add_argument("--workers", type=int, default=1, help="parallel conversion / build workers (≤ TP×PP GPUs)")
    p.add_argument("--calib-size", type=int, default=512)
    p.add_argument("--calib-max-seq-length", type=int, default=512)
    p.add_argument("--kv-cache-free-gpu-mem-fraction", type=float, default=None)
    p.add_argument("--no-multiple-profiles", action="store_true")
    p.add_argument("--trtllm-src", default=os.environ.get("TRTLLM_SRC"),
                   help="TensorRT-LLM source tree with examples/ (convert_checkpoint.py, quantize.py); default: "
                   f"the one the image ships for its wheel ({', '.join(IMAGE_TRTLLM_SRC_ROOTS)}), "
                   f"else {DEFAULT_TRTLLM_SRC}")
    p.add_argument("--python", default="python3", help="interpreter that has TensorRT-LLM (the image's)")
    p.add_argument("--server-root", default=None,
                   help="where the server will see --output (default: the same path), e.g. /engines/llama")
    p.add_argument("--budget-json", default=None, help="also write the memory budget here (works with --dry-run)")
    p.add_argument("--allow-other-trtllm", action="store_true",
                   help=f"build with an installed TensorRT-LLM other than the pinned {TRTLLM_VERSION}")
    p.add_argument("--dry-run", action="store_true", help="print the plan, commands and repository; run nothing")
    return p


def find_trtllm_src(explicit: str | Path | None = None, roots=(*IMAGE_TRTLLM_SRC_ROOTS, DEFAULT_TRTLLM_SRC)) -> Path:
    """The TensorRT-LLM source tree whose example scripts the build runs.

    An explicit ``--trtllm-src`` / ``TRTLLM_SRC`` wins. Otherwise the first of ``roots`` that has both scripts:
    the image's own ``examples`` (release/1.2.1, the wheel's version) before the fork scripts a
    ``TRTLLM_EXAMPLES=download`` image build fetched; with none (a plan on a machine without the image) the first
    root, so ``--dry-run`` shows the paths the image would use."""
    if explicit:
        return Path(explicit)
    for root in map(Path, roots):
        if (root / CONVERT_SCRIPT).is_file() and (root / QUANTIZE_SCRIPT).is_file():
            return root
    return Path(roots[0])


def _resolve_gpu(args):
    if args.gpu:
        return lookup_gpu(args.gpu)
    gpus = detect_gpus()
    if not gpus:
        hint = "pass --gpu A100 (or L4, H100, …) to plan for a GPU" if args.dry_run else \
            "run the build on a machine with an NVIDIA GPU, inside " + TRITON_IMAGE
        raise UnsupportedOnGpu(f"no NVIDIA GPU visible (nvidia-smi found none): {hint}")
    if len({g.cc for g in gpus}) > 1:
        raise UnsupportedOnGpu("GPUs of different compute capabilities are visible; set CUDA_VISIBLE_DEVICES "
                               "to the ones the engine is for")
    return gpus[0]


def plan_from_args(args) -> tuple[BuildPlan, GpuProfile]:
    profile = GpuProfile.load(args.profile)
    b = profile.build
    limits = BuildLimits(max_batch_size=args.max_batch_size or b.max_batch_size,
                         max_input_len=args.max_input_len or b.max_input_len,
                         max_seq_len=args.max_seq_len or b.max_seq_len,
                         max_num_tokens=args.max_num_tokens or b.max_num_tokens)
    fraction = args.kv_cache_free_gpu_mem_fraction or profile.runtime.kv_cache_free_gpu_mem_fraction
    plan = make_plan(args.checkpoint, args.output, args.variant, _resolve_gpu(args),
                     kv_cache_dtype=args.kv_cache_dtype, limits=limits, tp_size=args.tp_size,
                     pp_size=args.pp_size, dtype=args.dtype, workers=args.workers, calib_size=args.calib_size,
                     calib_max_seq_length=args.calib_max_seq_length,
                     multiple_profiles=b.multiple_profiles and not args.no_multiple_profiles,
                     tokens_per_block=b.tokens_per_block, kv_cache_free_gpu_mem_fraction=fraction,
                     trtllm_src=find_trtllm_src(args.trtllm_src), python=args.python)
    return plan, profile


def serving_for(plan: BuildPlan, profile: GpuProfile, server_root: str | Path | None, budget_tokens: int):
    """The ServingProfile and TrtllmOptions of the repository rendered for this build."""
    root = Path(server_root) if server_root else plan.output_dir.resolve()
    serving = profile.serving_profile(engine_dir=str(root / "engine"), tokenizer_dir=str(root / "tokenizer"))
    options = profile.runtime
    updates = {"kv_cache_free_gpu_mem_fraction": plan.kv_cache_free_gpu_mem_fraction}
    if options.max_tokens_in_paged_kv_cache == "auto":
        updates["max_tokens_in_paged_kv_cache"] = budget_tokens
    return serving, options.model_copy(update=updates)


def render_for(plan: BuildPlan, profile: GpuProfile, server_root, budget_tokens: int, engine_cfg: dict,
               out_dir: Path | None):
    """Render (to ``out_dir``) or just return the configs: [(name, source, ModelConfig)]."""
    from .guided import write_tokenizer_info
    from ..repository import render_repository
    from .layout import OPTIONS_FILE, model_configs_trtllm

    serving, options = serving_for(plan, profile, server_root, budget_tokens)
    if out_dir is not None:
        # Before rendering: the config turns guided decoding on when this file is beside the engine.
        write_tokenizer_info(plan.checkpoint, plan.output_dir)
    configs = model_configs_trtllm(serving.resolved(), options, engine_cfg)
    if out_dir is not None:
        render_repository(serving, out_dir, configs)
        (plan.output_dir / OPTIONS_FILE).write_text(options.model_dump_json(indent=2) + "\n")
    return configs


def print_dry_run(plan: BuildPlan, profile: GpuProfile, args, out=None) -> None:
    from .. import triton_config as tc

    out = out or sys.stdout
    budget = plan.budget()
    w = out.write
    w(f"# TensorRT-LLM {TRTLLM_VERSION} build plan (dry run: nothing is executed)\n")
    w(f"# image: {TRITON_IMAGE}\n# variant: {plan.variant} ({VARIANTS[plan.variant].label}), quant_algo="
      f"{plan.quant_algo}, kv_cache_quant_algo={plan.kv_cache_quant_algo}, GPU: {plan.gpu.describe()}\n")
    w("\n" + budget.summary() + "\n\n# memory_budget.json\n" + budget.to_json())
    step = 1
    w("\n# commands\n")
    if VARIANTS[plan.variant].calibrated:
        w(f"# {step}. calibration text (built in): python -m builders.trtllm calibration {plan.calib_dir} "
          f"--samples {plan.calib_size}\n")
        step += 1
    for cmd in plan_commands(plan):
        w(f"# {step}. {cmd.name}\n{cmd.shell()}\n")
        step += 1
    w(f"# {step}. copy tokenizer files → {plan.output_dir / 'tokenizer'}; write {plan.engine_dir / 'manifest.json'}"
      f" and {plan.output_dir / 'memory_budget.json'}; render {plan.output_dir / 'model_repository'}\n")
    configs = render_for(plan, profile, args.server_root, budget.max_tokens_in_paged_kv_cache,
                         predict_engine_config(plan), None)
    w("\n# rendered repository (engine config.json predicted from the plan)\n")
    for name, source, cfg in configs:
        w(f"\n## {name}/config.pbtxt" + (f"   (model.py from {source})" if source else "") + "\n")
        w(tc.to_pbtxt(cfg))
    if args.budget_json:
        budget.write(args.budget_json)


def _check_build_runtime(plan: BuildPlan, allow_other: bool):
    from .manifest import detect_runtime

    rt = detect_runtime()
    if rt.trtllm_version is None:
        raise SystemExit(f"error: TensorRT-LLM is not installed here; run the build inside {TRITON_IMAGE} "
                         "(see docs/gpu.md), or use --dry-run to see the plan")
    if rt.trtllm_version != TRTLLM_VERSION and not allow_other:
        raise SystemExit(f"error: TensorRT-LLM {rt.trtllm_version} is installed, the pinned version is "
                         f"{TRTLLM_VERSION} ({TRITON_IMAGE}); the server must run the version that built the "
                         "engine. Use the pinned image or pass --allow-other-trtllm.")
    script = plan.trtllm_src / (CONVERT_SCRIPT if VARIANTS[plan.variant].tool == "convert" else QUANTIZE_SCRIPT)
    if not script.is_file():
        raise SystemExit(f"error: {script} not found: set --trtllm-src / TRTLLM_SRC to a TensorRT-LLM "
                         f"{TRTLLM_VERSION} source tree (the image ships release/{TRTLLM_VERSION}'s examples under "
                         f"{' or '.join(IMAGE_TRTLLM_SRC_ROOTS)}; see docs/gpu.md)")
    return rt


def run_build(plan: BuildPlan, profile: GpuProfile, args) -> Path:
    """Execute the plan (inside the pinned image, on the GPU the plan is for)."""
    from .calibration import write_calibration_set
    from .manifest import hash_checkpoint, manifest_from_engine

    runtime = _check_build_runtime(plan, args.allow_other_trtllm)
    if runtime.gpus and runtime.gpus[0].compute_capability != plan.gpu.compute_capability:
        raise SystemExit(f"error: planned for {plan.gpu.describe()} but this machine has {runtime.gpus[0].describe()}")
    budget = plan.budget()
    print(budget.summary(), flush=True)
    if not budget.fits:
        raise SystemExit("error: the engine does not fit this GPU (see the notes above)")
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    budget.write(plan.output_dir / "memory_budget.json")
    if args.budget_json:
        budget.write(args.budget_json)
    if VARIANTS[plan.variant].calibrated:
        write_calibration_set(plan.calib_dir, n_samples=plan.calib_size)
    commands = plan_commands(plan)
    for cmd in commands:
        print(f"\n$ {cmd.shell()}", flush=True)
        env = {**os.environ, **cmd.env}
        result = subprocess.run(list(cmd.argv), env=env, check=False)
        if result.returncode != 0:
            raise SystemExit(f"error: {cmd.name} failed with exit code {result.returncode}")
    engine_cfg = json.loads((plan.engine_dir / "config.json").read_text())
    built = {flag: engine_cfg["build_config"]["plugin_config"].get(flag) for flag in plan.plugin_flags}
    if built != plan.plugin_flags:  # the one place a GPU run checks rules.py against the real builder
        raise SystemExit(f"error: trtllm-build wrote {built} into {plan.engine_dir / 'config.json'}, the plan "
                         f"expected {plan.plugin_flags}: TensorRT-LLM {TRTLLM_VERSION}'s builder rules differ from "
                         "builders/trtllm/rules.py; fix the table before serving this engine")
    tok = plan.output_dir / "tokenizer"
    tok.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        if (plan.checkpoint / name).exists():
            shutil.copy2(plan.checkpoint / name, tok / name)
    manifest = manifest_from_engine(plan.engine_dir, checkpoint_dir=None, runtime=runtime, variant=plan.variant,
                                    commands=[c.shell() for c in commands],
                                    checkpoint_sha256=hash_checkpoint(plan.checkpoint))
    manifest.write(plan.engine_dir)
    repo = plan.output_dir / "model_repository"
    render_for(plan, profile, args.server_root, budget.max_tokens_in_paged_kv_cache, engine_cfg, repo)
    print(f"\nengine: {plan.engine_dir}\nmanifest: {plan.engine_dir / 'manifest.json'}\nrepository: {repo}")
    return plan.output_dir


def engine_main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m builders engine --target trtllm …`` (argv without the ``engine`` word)."""
    parser = add_engine_arguments(argparse.ArgumentParser(
        prog="python -m builders engine --target trtllm", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter))
    args = parser.parse_args(argv)
    try:
        plan, profile = plan_from_args(args)
        if args.dry_run:
            print_dry_run(plan, profile, args)
        else:
            run_build(plan, profile, args)
    except UnsupportedOnGpu as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
