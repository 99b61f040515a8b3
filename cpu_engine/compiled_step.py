"""The decode step compiled ahead of time (AOTInductor): one call into generated C++ a step, with no Python and no
per-op dispatch inside it.

At engine build, :class:`DecodeStep` (the model's own layers over a step whose shapes are inputs: B rows and L keys
are dynamic dimensions, each row masked to its own history) is exported with ``torch.export`` and compiled into
``<engine>/compiled/<key>/<cpu target>/decode_step.pt2``, without its weights: at load the package is handed the
engine's own tensors, so they are not held twice. The key hashes the model code, torch's version and the engine's
config, so a package never runs code or shapes it was not built from; the CPU target (cpu_target.py) says which
instructions the generated code uses, so a package never runs on a CPU that lacks them. The engine runs it for
decode-only batches of up to ``max_rows`` rows; prompt chunks run eager. A missing or stale package, none for this
CPU, or ``LLM_CPU_DECODE=eager``, means the eager step, with a warning that says why. int8_sq is not compiled: its
projections are the engine's own C++ op."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from . import cpu_target, native
from .cpu_target import CpuTarget
from .kv_cache import KVCache
from .model import Step, Transformer, rope
from .quant import QUANT_ALGOS, Int4Linear

PACKAGE = "decode_step.pt2"
TARGET_FILE = "target.json"  # the CPU target a package was compiled for, and the CPU flags it needs
_TARGET_NAME = re.compile(r"(x86-64-v\d|native)-[0-9a-f]{8}")  # package_path's folders
_SCRATCH = ".partial-"  # build()'s folder while it compiles
EAGER_ENV = "LLM_CPU_DECODE"  # "eager": never load the compiled step (A/B runs)
NOT_COMPILED = ("int8_sq",)  # variants whose step calls the engine's own C++ op (native.py)
_SOURCES = ("model.py", "quant.py", "compiled_step.py", "cpu_target.py")
_EXAMPLE_ROWS, _EXAMPLE_KEYS = 4, 64  # export traces at these; never 0 or 1, which torch.export would specialise


class DecodeStep(nn.Module):
    """One decode step: tokens, positions, writes [B] (each row's new token, its position and the cache row its
    key/value go to), reads [B, L] (the cache rows of positions 0..L-1 of each row, padded with block 0's), and the
    per-layer caches (k0, v0, k1, v1, …), written in place. Returns the final norm's hidden states [B, H]: the head
    runs after it, eager, because it picks its kernel by the row count (quant.Int8Head)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        # A buffer of this module, so the package names it (the model's is a plain attribute, kept fp32).
        self.register_buffer("inv_freq", model.inv_freq, persistent=False)

    def forward(self, tokens, positions, writes, reads, *caches):
        model = self.model
        dtype = caches[0].dtype
        rows, keys = reads.shape
        x = model.embed_tokens(tokens[:, None]).to(dtype)
        cos, sin = rope(positions[:, None], self.inv_freq, dtype)
        mask = (torch.arange(keys)[None, :] <= positions[:, None]).view(rows, 1, 1, keys)
        step = Step(positions[:, None], writes[:, None], keys, cos, sin, mask, reads.flatten(), (),
                    fused_attention=False, native_attention=native.available())
        for i, layer in enumerate(model.layers):
            x = layer(x, step, caches[2 * i], caches[2 * i + 1])
        return model.norm(x[:, 0])


def step_rows(positions: torch.Tensor, blocks: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """writes [B] and reads [B, L] of a decode step: positions [B], blocks [B, N] (rows padded with block 0)."""
    keys = int(positions.max()) + 1
    needed = -(-keys // block_size)
    if blocks.shape[1] < needed:
        blocks = F.pad(blocks, (0, needed - blocks.shape[1]))
    writes = blocks.gather(1, (positions // block_size)[:, None])[:, 0] * block_size + positions % block_size
    span = torch.arange(keys)
    return writes, blocks[:, span // block_size] * block_size + span % block_size


@functools.cache
def _source_digest() -> bytes:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((Path(__file__).parent / name).read_bytes())
    return digest.digest()


def package_root(engine_dir: str | Path, config: dict) -> Path:
    """The folder of the packages for this code, torch, config and kernels: with the engine's C++ kernels loaded in
    this process (load_engine loads them, native.py) the step calls their attention, and a package that calls them
    is only run where they are. Within it, one folder per CPU target (cpu_target.py)."""
    kernels = native.build_key() if native.available() else "no C++ kernels"
    digest = hashlib.sha256(_source_digest())
    digest.update(kernels.encode())
    digest.update(torch.__version__.encode())
    digest.update(json.dumps(config, sort_keys=True).encode())
    return Path(engine_dir) / "compiled" / digest.hexdigest()[:16]


def build_target(config: dict) -> CpuTarget:
    """This machine's target: int4_awq's projections on the engine's bf16 dot-product kernel where it runs here."""
    quant_algo = (config["pretrained_config"].get("quantization") or {}).get("quant_algo")
    return cpu_target.host_target(quant_algo == QUANT_ALGOS["int4_awq"] and native.int4_dot())


def package_path(engine_dir: str | Path, config: dict, target: CpuTarget) -> Path:
    """Where the package for ``target`` goes: a folder named by its x86-64 level and a hash of the target and the
    CPU flags it needs."""
    named = hashlib.sha256(json.dumps([dataclasses.asdict(target), target.requirements()]).encode()).hexdigest()[:8]
    return package_root(engine_dir, config) / f"{target.march or 'native'}-{named}" / PACKAGE


def built(path: Path) -> bool:
    """A package and its CPU flags, both there (a folder only ever appears whole: build() renames it in)."""
    return path.is_file() and (path.parent / TARGET_FILE).is_file()


def max_rows(config: dict) -> int:
    """A decode batch holds up to max_batch_size sequences and a liveness probe."""
    return config["build_config"]["max_batch_size"] + 1


def build(loaded, target: CpuTarget, engine_dir: str | Path) -> Path:
    """Export and compile the decode step of ``loaded`` (engine_dir.LoadedEngine; about a minute on 2 cores) for
    ``target`` into its folder under package_root, with the CPU flags it needs beside it (``TARGET_FILE``), renamed
    into place only when complete; packages of older code or torch are removed. Returns the package's path."""
    root, path = package_root(engine_dir, loaded.config), package_path(engine_dir, loaded.config, target)
    args, block = loaded.model.args, 16  # any block size: the step gets cache rows, not blocks
    cache = KVCache(args, _EXAMPLE_KEYS // block + _EXAMPLE_ROWS + 1, block, loaded.compute_dtype, probe_blocks=0)
    caches = tuple(t for pair in cache.layers for t in pair)
    positions = torch.arange(_EXAMPLE_ROWS) + _EXAMPLE_KEYS - _EXAMPLE_ROWS
    tables = torch.arange(1, _EXAMPLE_ROWS * 3 + 1).view(_EXAMPLE_ROWS, 3)
    writes, reads = step_rows(positions, tables, block)
    rows = torch.export.Dim("rows", min=1, max=max_rows(loaded.config))
    keys = torch.export.Dim("keys", min=1, max=loaded.build_config["max_seq_len"])
    cache_rows = torch.export.Dim("cache_rows", min=block, max=1 << 30)
    dynamic = ({0: rows}, {0: rows}, {0: rows}, {0: rows, 1: keys}, tuple({0: cache_rows} for _ in caches))
    if any(isinstance(m, Int4Linear) and m.dot for m in loaded.model.modules()) != target.int4_dot:
        raise ValueError(f"the engine was loaded with the other int4 layout than {target} wants "
                         f"(load_engine(int4_dot=...))")
    with torch.no_grad():
        program = torch.export.export(DecodeStep(loaded.model).eval(), (torch.zeros_like(positions), positions,
                                      writes, reads, *caches), dynamic_shapes=dynamic, strict=False)
    root.mkdir(parents=True, exist_ok=True)
    for abandoned in root.glob(f"{_SCRATCH}*"):  # of builds killed mid-way; a live one's is younger
        if time.time() - abandoned.stat().st_mtime > 3600:
            shutil.rmtree(abandoned, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(prefix=_SCRATCH, dir=root))
    try:
        with torch.no_grad():
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(scratch / PACKAGE),
                inductor_configs={"aot_inductor.package_constants_in_so": False, "emulate_precision_casts": True,
                                  **target.inductor_configs()})
        described = {**dataclasses.asdict(target), "requirements": target.requirements()}
        (scratch / TARGET_FILE).write_text(json.dumps(described, indent=2) + "\n")
        os.chmod(scratch, 0o755)  # mkdtemp's 0700 would hide it from a server running as another user
        try:
            os.replace(scratch, path.parent)
        except OSError:
            if not built(path):  # else a concurrent build of the same target got there first: keep its package
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for stale in root.parent.iterdir():
        if stale != root:
            shutil.rmtree(stale, ignore_errors=True)
    return path


def find(engine_dir: str | Path, config: dict) -> tuple[Path | None, str]:
    """The package this process should run: among those for this code, torch and config, the one whose CPU flags
    this machine has, needing the most of them (the one built here before a portable one). Or None and why not."""
    root = package_root(engine_dir, config)
    int4_dot = build_target(config).int4_dot  # the layout load_engine gives int4_awq here (quant.Int4Linear)
    runnable, unfit = [], []
    for folder in sorted(root.iterdir() if root.is_dir() else ()):
        if not (_TARGET_NAME.fullmatch(folder.name) and built(folder / PACKAGE)):
            continue
        try:
            target = json.loads((folder / TARGET_FILE).read_text())
            lacking = cpu_target.missing(target["requirements"])
            if target["int4_dot"] and not int4_dot:
                lacking.append("the int4 dot-product kernel (native.int4_dot())")
            elif int4_dot and not target["int4_dot"]:
                lacking.append("ATen's int4 layout, which this process does not load (native.int4_dot())")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            unfit.append(f"{folder.name}: unreadable {TARGET_FILE} ({exc})")
            continue
        if lacking:
            unfit.append(f"{folder.name} needs {', '.join(lacking)}")
        else:
            runnable.append((len(target["requirements"]), folder / PACKAGE))
    if runnable:
        return max(runnable)[1], ""
    command = f"python -m builders kernels --engine-dir {engine_dir} compiles it"
    if unfit:
        return None, f"no compiled decode step built for this CPU under {root} ({'; '.join(unfit)}; {command})"
    return None, f"no compiled decode step for this code and torch {torch.__version__} at {root} ({command})"


class CompiledDecode:
    """The compiled step and the model's head, called as the model is for a decode batch: (tokens [B, 1], positions
    [B, 1], blocks [B, N], cache) → fp32 logits [B, V]."""

    def __init__(self, run: Callable[[list[torch.Tensor]], list[torch.Tensor]], head: nn.Module, max_rows: int,
                 path: Path):
        self.run = run  # the package's flat inputs → its flat outputs
        self.head = head
        self.max_rows = max_rows
        self.path = path

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, blocks: torch.Tensor, cache) -> torch.Tensor:
        positions = positions[:, 0]
        writes, reads = step_rows(positions, blocks, cache.block_size)
        [hidden] = self.run([tokens[:, 0], positions, writes, reads, *(t for pair in cache.layers for t in pair)])
        return self.head(hidden).float()


def load(engine_dir: str | Path, config: dict, model: Transformer) -> tuple[CompiledDecode | None, str]:
    """The engine's compiled step with ``model``'s tensors as its weights, or None and why not."""
    if os.environ.get(EAGER_ENV, "").lower() == "eager":
        return None, f"{EAGER_ENV}=eager"
    path, why_not = find(engine_dir, config)
    if path is None:
        return None, why_not
    try:
        run = _open(path, model, config)
    except (RuntimeError, KeyError, OSError) as exc:  # a package from another build of torch, or broken
        return None, f"could not load {path}: {exc}"
    return CompiledDecode(run, model.lm_head, max_rows(config), path), ""


def _open(path: Path, model: Transformer, config: dict) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The package loaded, its weights the model's tensors. Through the engine's C++ kernels where they are loaded
    (kernels/compiled_runner.cpp): torch's Python binding of the loader holds the GIL for the whole step, so the
    served model's other threads (responses, admissions) would wait out every step."""
    if native.available():
        handle = torch.ops.llm_cpu.compiled_open(str(path))
        constants = _constants(torch.ops.llm_cpu.compiled_constant_names(handle), model, config)
        torch.ops.llm_cpu.compiled_set_constants(handle, list(constants), list(constants.values()))
        return functools.partial(torch.ops.llm_cpu.compiled_run, handle)
    runner = torch._inductor.aoti_load_package(str(path))
    runner.load_constants(_constants(runner.get_constant_fqns(), model, config), check_full_update=True,
                          user_managed=True)
    return runner.loader.boxed_run


def _constants(names: list[str], model: Transformer, config: dict) -> dict[str, torch.Tensor]:
    """The package's constants by name: the model's own parameters and buffers (the embedding, int4's packed
    tiles), and the one kind inductor makes itself, unnamed (``constant<N>``): it lowers
    ``_weight_int4pack_mm_for_cpu`` to the shim that takes the group size as an int64 scalar tensor."""
    step = DecodeStep(model)
    # Every name of a tied tensor: export names the tied embedding and head by either (seen: fp32's package
    # wanted model.embed_tokens.weight, bf16's model.lm_head.weight), where named_parameters() keeps only the first.
    tensors = {name: t.detach() for name, t in [*step.named_parameters(remove_duplicate=False),
                                                *step.named_buffers(remove_duplicate=False)]}
    group_size = (config["pretrained_config"].get("quantization") or {}).get("group_size")
    out = {}
    for name in names:
        if name in tensors:
            out[name] = tensors[name]
        elif name.startswith("constant") and group_size is not None:
            out[name] = torch.tensor(group_size, dtype=torch.int64)
        else:
            raise KeyError(f"the compiled decode step wants a constant the model does not have: {name}")
    return out
