"""The CPU engine directory: ``config.json`` in TensorRT-LLM's engine schema plus ``rank0.safetensors``.

Sharing the schema means the repository layout and the server launcher read CPU and GPU engines alike.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from . import compiled_step, memory, native
from .model import ModelArgs, Transformer
from .quant import QUANT_ALGOS, fp8_dequantise, fuse_projections, prepare_for_cpu, swap_linears
from .threads import on_scratch_thread

CPU_ENGINE_VERSION = "cpu-engine-1"
WEIGHTS_FILE = "rank0.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
VARIANT_OF_QUANT_ALGO = {algo: variant for variant, algo in QUANT_ALGOS.items()}
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedEngine:
    model: Transformer
    config: dict
    compute_dtype: torch.dtype
    load_seconds: float
    kernels: str  # "eager", or which C++ kernels run (native.describe())
    decode: str  # "compiled (<package>)", or why decode steps run eager

    @property
    def build_config(self) -> dict:
        return self.config["build_config"]


def read_config(engine_dir: str | Path) -> dict:
    path = Path(engine_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no engine config at {path}: build the engine first (python -m builders engine)")
    return json.loads(path.read_text())


def engine_variant(config: dict) -> str | None:
    """The quantisation variant of an engine's config (None: plain fp32/bf16 weights)."""
    quant_algo = (config["pretrained_config"].get("quantization") or {}).get("quant_algo")
    if quant_algo is not None and quant_algo not in VARIANT_OF_QUANT_ALGO:
        raise ValueError(f"quant_algo {quant_algo} has no CPU implementation (supported: "
                         f"{sorted(VARIANT_OF_QUANT_ALGO)})")
    return VARIANT_OF_QUANT_ALGO.get(quant_algo)


def load_engine(engine_dir: str | Path, compiled_decode: bool = True, int4_dot: bool = True) -> LoadedEngine:
    """``compiled_decode=False``: without the compiled decode step, and without a warning that it is not there (the
    builder that compiles it loads the engine first). ``int4_dot=False``: int4_awq in ATen's layout even where the
    engine's int4 kernels run (the builder of a package for CPUs without them)."""
    # Off the caller's thread: an OpenMP pool left on it would slow the engine thread (cpu_engine/threads.py).
    return on_scratch_thread(_load_engine, engine_dir, compiled_decode, int4_dot)


def _allocate(model: nn.Module) -> None:
    """``model.to_empty(device="cpu")`` through ``torch.empty``: to_empty's ``empty_like`` of a meta tensor runs its
    Python reference kernel, whose first call imports sympy and torch.fx's symbolic shapes (~30 MB of every served
    process, which never traces anything)."""
    for module in model.modules():
        for name, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            empty = torch.empty(t.shape, dtype=t.dtype)
            setattr(module, name, nn.Parameter(empty, t.requires_grad) if isinstance(t, nn.Parameter) else empty)


def _load_engine(engine_dir: str | Path, compiled_decode: bool, int4_dot: bool) -> LoadedEngine:
    start = time.perf_counter()
    memory.bound_kernel_caches()
    config = read_config(engine_dir)
    if config.get("version") != CPU_ENGINE_VERSION:
        raise ValueError(f"{engine_dir} holds a {config.get('version')!r} engine, not a CPU engine "
                         f"({CPU_ENGINE_VERSION}): TensorRT-LLM engines need the tensorrtllm backend on a GPU")
    pc = config["pretrained_config"]
    variant = engine_variant(config)
    dtype = DTYPES[pc["dtype"]]
    # Built on the meta device and then allocated uninitialised: no random init of weights the file replaces.
    # Parameters take the compute dtype first; quantised modules keep their own buffer dtypes, and
    # load_state_dict copies (and casts) into whatever is there, so the file's buffer is freed after loading.
    with torch.device("meta"):
        model = Transformer(ModelArgs.from_pretrained_config(pc)).to(dtype)
        swap_linears(model, variant, pc["quantization"].get("group_size"))
    _allocate(model)
    state = load_file(str(Path(engine_dir) / WEIGHTS_FILE))
    if variant == "fp8":
        for name in [n for n in state if n.endswith("_proj.scales")]:
            fp8_dequantise(state, name.removesuffix(".scales"), dtype)
    if model.args.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["embed_tokens.weight"])
    fuse_projections(state)
    model.load_state_dict(state, strict=True)
    if model.args.tie_word_embeddings:  # one tensor, as in the checkpoint (56 MB saved in bf16)
        model.lm_head.weight = model.embed_tokens.weight
    # Every variant calls them (decode attention; int8_sq's and int4_awq's projections), and the compiled
    # step's package is the one built for them when they are loaded.
    why_not = native.load(engine_dir)
    native_kernels = why_not is None
    if why_not:
        log.warning("the C++ kernels are not loaded; their callers run eager PyTorch, slower: %s", why_not)
    prepare_for_cpu(model, variant, dtype, native_kernels, int4_dot)
    del state
    # Loading frees the file's tensors and the repacking's temporaries (RSS after loading int4_awq 735 → 450 MB).
    memory.return_freed_memory()
    kernels = native.describe() if native_kernels else "eager"
    if variant in compiled_step.NOT_COMPILED:
        decode = "eager: int8_sq's projections are a C++ op"
    elif not compiled_decode:
        decode = "eager: loaded without the compiled step"
    else:
        model.compiled_decode, why_not = compiled_step.load(engine_dir, config, model)
        decode = f"compiled ({model.compiled_decode.path})" if model.compiled_decode else f"eager: {why_not}"
        if why_not:
            log.warning("decode steps run eager PyTorch, slower: %s", why_not)
    return LoadedEngine(model.eval(), config, dtype, time.perf_counter() - start, kernels, decode)
