"""The benchmarked models (the default checkpoint and a random ~100M Llama), their prompts, and their engines built
once and kept while their inputs are the same; plus the build stamps and progress lines every benchmark uses."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine_bench.options import PROJECT_ROOT, Options
from bench.workload import make_prompts
from cpu_engine import compiled_step
from cpu_engine.threads import on_scratch_thread

# ~100M-param Llama: memory-bound on this CPU (~0.38 GB of fp32 weights read per decode step).
LLAMA_100M = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2560, vocab_size=4096, max_position_embeddings=1024)


def say(msg: str) -> None:
    from tqdm import tqdm

    tqdm.write(f"[{time.strftime('%H:%M:%S')}] {msg}")


def file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        st = p.stat()
        h.update(f"{p}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def cached(out: Path, stamp: dict) -> bool:
    f = out / "bench_stamp.json" if out.suffix == "" else out.with_name(out.name + ".stamp.json")
    return f.exists() and json.loads(f.read_text()) == stamp


def write_stamp(out: Path, stamp: dict) -> None:
    f = out / "bench_stamp.json" if out.suffix == "" else out.with_name(out.name + ".stamp.json")
    f.write_text(json.dumps(stamp, sort_keys=True))


@dataclass
class BenchModel:
    name: str
    checkpoint: Path
    random_weights: bool
    params: int
    prompts: list[str] = field(default_factory=list)
    prompt_ids: list[list[int]] = field(default_factory=list)


def count_params(checkpoint: Path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(checkpoint / "model.safetensors"), framework="np") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())


def prepare_model(name: str, opts: Options) -> BenchModel:
    from builders.tiny_model import ModelSpec, build_random_model

    if name == "default":
        ckpt = PROJECT_ROOT / "build" / "models" / "smollm2"
        if not (ckpt / "provenance.json").is_file():
            raise SystemExit(f"{ckpt} is missing: build it first (make model, ~1 min)")
        model = BenchModel(name, ckpt, random_weights=False, params=0)
    else:
        ckpt = opts.work_dir / "models" / name
        spec = ModelSpec(**LLAMA_100M)
        try:
            info = json.loads((ckpt / "build_info.json").read_text())
        except (OSError, ValueError):
            info = None
        if not (info and info.get("spec") == spec.to_dict() and info.get("seed") == 0):
            say(f"building {name}: random weights, {spec}")
            build_random_model(ckpt, spec=spec, seed=0)
        model = BenchModel(name, ckpt, random_weights=True, params=0)
    model.params = count_params(ckpt)
    model.prompts, model.prompt_ids = make_prompts(ckpt, opts.prompt_tokens, count=16)
    return model


def build_engine(model: BenchModel, variant: str, opts: Options) -> Path:
    from builders.cpu_build import BuildLimits, build_cpu_engine, compile_decode_step

    out = opts.work_dir / "engines" / f"{model.name}-{variant}"
    src = [model.checkpoint / "model.safetensors", PROJECT_ROOT / "builders" / "cpu_build.py",
           PROJECT_ROOT / "cpu_engine" / "quant.py"]
    limits = BuildLimits(max_batch_size=16, max_input_len=768, max_seq_len=1024, max_num_tokens=256)
    stamp = {"variant": variant, "limits": dataclasses.asdict(limits), "inputs": file_digest(*src)}
    if not ((out / "config.json").exists() and cached(out, stamp)):
        say(f"building engine {out.name}")
        # On a scratch thread, as every torch workload of this process but the engine's (cpu_engine/threads.py).
        on_scratch_thread(build_cpu_engine, model.checkpoint, out, variant=variant, limits=limits)
        write_stamp(out, stamp)
    if variant not in compiled_step.NOT_COMPILED:  # as `make serve` builds it; kept while the code is the same
        on_scratch_thread(compile_decode_step, out)
    return out
