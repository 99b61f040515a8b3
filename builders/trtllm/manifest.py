"""The engine manifest (``manifest.json`` beside ``config.json`` and ``rank*.engine``) and the check the
server runs before serving an engine.

A TensorRT engine only runs on the TensorRT-LLM and TensorRT versions that built it and on the GPU
architecture it was built for; a mismatch otherwise surfaces as an opaque deserialisation error deep in the
server log (or worse, a crash). The manifest records what the engine needs; :func:`check_engine` compares
it with the runtime and says, in one message, what is wrong and what to do.

Nothing here imports TensorRT-LLM: versions come from package metadata and environment variables the NGC
image sets, GPUs from ``nvidia-smi``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from .gpus import GpuSpec, detect_gpus
from .pins import TRITON_IMAGE

MANIFEST_FILE = "manifest.json"
MANIFEST_SCHEMA = 1
#: Set to 1 to serve an engine without (or despite) its manifest. Logged loudly; never the default.
SKIP_CHECK_ENV = "TRTLLM_SKIP_ENGINE_CHECK"
LIMIT_KEYS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width")


class EngineMismatch(RuntimeError):
    """The engine cannot be served by this runtime; the message says why and how to fix it."""


@dataclass
class EngineManifest:
    trtllm_version: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "9.0"
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    dtype: str
    limits: dict[str, int]
    tp_size: int
    pp_size: int
    checkpoint_sha256: str
    config_sha256: str
    variant: str = ""
    image: str = TRITON_IMAGE
    engine_files: dict[str, int] = field(default_factory=dict)  # rank*.engine → bytes
    commands: list[str] = field(default_factory=list)
    created: str = ""
    schema: int = MANIFEST_SCHEMA

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def write(self, engine_dir: str | Path) -> Path:
        path = Path(engine_dir) / MANIFEST_FILE
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def read(cls, engine_dir: str | Path) -> EngineManifest:
        path = Path(engine_dir) / MANIFEST_FILE
        data = json.loads(path.read_text())
        if data.get("schema") != MANIFEST_SCHEMA:
            raise EngineMismatch(f"{path}: manifest schema {data.get('schema')} is not {MANIFEST_SCHEMA}; rebuild")
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_checkpoint(checkpoint_dir: str | Path) -> str:
    """SHA-256 over every file of a Hugging Face checkpoint (relative names and contents, sorted)."""
    root = Path(checkpoint_dir)
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(sha256_file(path).encode() + b"\n")
    return h.hexdigest()


def engine_config(engine_dir: str | Path) -> dict:
    path = Path(engine_dir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: not a TensorRT-LLM engine directory")
    return json.loads(path.read_text())


def manifest_from_engine(engine_dir: str | Path, *, checkpoint_dir: str | Path | None, runtime: RuntimeInfo,
                         variant: str = "", commands: list[str] | None = None,
                         checkpoint_sha256: str | None = None) -> EngineManifest:
    """Describe a freshly built engine (the runtime is the one that built it)."""
    engine_dir = Path(engine_dir)
    cfg = engine_config(engine_dir)
    pc, bc = cfg["pretrained_config"], cfg["build_config"]
    q, m = pc.get("quantization") or {}, pc.get("mapping") or {}
    if not runtime.gpus:
        raise EngineMismatch("no GPU visible: a manifest records the GPU that built the engine")
    gpu = runtime.gpus[0]
    if checkpoint_sha256 is None:
        checkpoint_sha256 = hash_checkpoint(checkpoint_dir) if checkpoint_dir else ""
    return EngineManifest(
        trtllm_version=runtime.trtllm_version or cfg.get("version", ""),
        tensorrt_version=runtime.tensorrt_version or "",
        gpu_name=gpu.name, compute_capability=gpu.cc,
        quant_algo=q.get("quant_algo"), kv_cache_quant_algo=q.get("kv_cache_quant_algo"),
        dtype=pc.get("dtype", ""), limits={k: bc[k] for k in LIMIT_KEYS if k in bc},
        tp_size=m.get("tp_size", 1), pp_size=m.get("pp_size", 1),
        checkpoint_sha256=checkpoint_sha256, config_sha256=sha256_file(engine_dir / "config.json"),
        variant=variant, engine_files={p.name: p.stat().st_size for p in sorted(engine_dir.glob("rank*.engine"))},
        commands=list(commands or []), created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


# ---------------------------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class RuntimeInfo:
    """What the serving (or building) machine has."""

    trtllm_version: str | None
    tensorrt_version: str | None
    gpus: tuple[GpuSpec, ...] = ()
    image: str | None = None

    def describe(self) -> str:
        gpu = (f"{self.gpus[0].name} (compute capability {self.gpus[0].cc})" + (f" ×{len(self.gpus)}"
               if len(self.gpus) > 1 else "")) if self.gpus else "no GPU"
        return (f"TensorRT-LLM {self.trtllm_version or 'not installed'}, TensorRT "
                f"{self.tensorrt_version or 'not installed'}, {gpu}")


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def detect_runtime() -> RuntimeInfo:
    """Versions from installed package metadata (no import), GPUs from nvidia-smi."""
    trtllm = _dist_version("tensorrt_llm", "tensorrt-llm")
    trt = _dist_version("tensorrt", "tensorrt-cu13", "tensorrt_cu13", "tensorrt-cu12", "tensorrt_cu12") \
        or os.environ.get("TRT_VERSION") or os.environ.get("TENSORRT_VERSION")
    release = os.environ.get("NVIDIA_TRITON_SERVER_VERSION")
    image = f"nvcr.io/nvidia/tritonserver:{release}-trtllm-python-py3" if release else None
    return RuntimeInfo(trtllm, trt, tuple(detect_gpus()), image)


# ---------------------------------------------------------------------------------------------- check


def _rebuild_hint(m: EngineManifest, runtime: RuntimeInfo) -> str:
    where = runtime.gpus[0].short_name if runtime.gpus else "the serving GPU"
    return (f"Rebuild the engine on {where} inside {m.image}: python -m builders engine --target trtllm "
            f"--variant {m.variant or '<variant>'} --checkpoint <hf-checkpoint> --output <dir> "
            f"(or serve with the image and GPU it was built for).")


def engine_problems(engine_dir: str | Path, runtime: RuntimeInfo) -> list[str]:
    """Everything that stops ``engine_dir`` from running here (empty list = servable)."""
    engine_dir = Path(engine_dir)
    if not (engine_dir / MANIFEST_FILE).exists():
        return [f"{engine_dir} has no {MANIFEST_FILE}: it was not built by this project's builder, so nothing "
                f"says which TensorRT-LLM / TensorRT / GPU it needs. Build it with python -m builders engine "
                f"--target trtllm, or set {SKIP_CHECK_ENV}=1 to serve it unverified."]
    try:
        m = EngineManifest.read(engine_dir)
        cfg = engine_config(engine_dir)
    except (OSError, ValueError, TypeError, EngineMismatch) as e:
        return [f"{engine_dir}: unreadable manifest or config.json ({e}); rebuild the engine"]
    problems = []
    built = f"built with TensorRT-LLM {m.trtllm_version} / TensorRT {m.tensorrt_version} for {m.gpu_name} " \
            f"(compute capability {m.compute_capability})"
    if runtime.trtllm_version is None:
        problems.append(f"engine {engine_dir} is {built}, but TensorRT-LLM is not installed here "
                        f"(serve it in {m.image}).")
    elif runtime.trtllm_version != m.trtllm_version:
        problems.append(f"engine {engine_dir} was built with TensorRT-LLM {m.trtllm_version}; this runtime has "
                        f"TensorRT-LLM {runtime.trtllm_version}. Engines only load in the version that built them.")
    if runtime.tensorrt_version and m.tensorrt_version and runtime.tensorrt_version != m.tensorrt_version:
        problems.append(f"engine {engine_dir} was built with TensorRT {m.tensorrt_version}; this runtime has "
                        f"TensorRT {runtime.tensorrt_version}.")
    if not runtime.gpus:
        problems.append(f"engine {engine_dir} is {built}, but no NVIDIA GPU is visible here (is the container "
                        "started with --gpus?).")
    else:
        ccs = {g.cc for g in runtime.gpus}
        if ccs != {m.compute_capability}:
            problems.append(f"engine {engine_dir} was built for compute capability {m.compute_capability} "
                            f"({m.gpu_name}); this machine's GPU is {runtime.gpus[0].cc} ({runtime.gpus[0].name}). "
                            "TensorRT engines only run on the architecture they were built for.")
        if len(runtime.gpus) < m.world_size:
            problems.append(f"engine {engine_dir} needs {m.world_size} GPUs (TP={m.tp_size} × PP={m.pp_size}); "
                            f"{len(runtime.gpus)} visible.")
    if sha256_file(engine_dir / "config.json") != m.config_sha256:
        problems.append(f"{engine_dir}/config.json changed after the engine was built (the manifest does not "
                        "describe it any more); rebuild the engine.")
    else:
        limits = {k: cfg["build_config"][k] for k in LIMIT_KEYS if k in cfg["build_config"]}
        q = cfg["pretrained_config"].get("quantization") or {}
        if limits != m.limits or q.get("quant_algo") != m.quant_algo:
            problems.append(f"{engine_dir}: manifest and config.json disagree (limits or quant_algo); rebuild.")
    if problems:
        problems.append(_rebuild_hint(m, runtime))
    return problems


def check_engine(engine_dir: str | Path, runtime: RuntimeInfo | None = None) -> EngineManifest | None:
    """Raise :class:`EngineMismatch` unless the engine can be served here. Returns its manifest."""
    if os.environ.get(SKIP_CHECK_ENV) == "1":
        return None
    runtime = runtime or detect_runtime()
    problems = engine_problems(engine_dir, runtime)
    if problems:
        raise EngineMismatch("refusing to serve a TensorRT-LLM engine:\n  - " + "\n  - ".join(problems)
                             + f"\n  (this runtime: {runtime.describe()})")
    return EngineManifest.read(engine_dir)


def trtllm_engine_dirs(model_repository: str | Path) -> dict[str, Path]:
    """Model name → engine dir for every model of a rendered repository that runs a TensorRT-LLM engine (an ``llm``
    whose ``executor_bindings`` are TensorRT-LLM's; the CPU stand-in's are not)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from .layout import TRTLLM_BINDINGS

    found = {}
    for cfg_path in sorted(Path(model_repository).glob("*/config.pbtxt")):
        text = cfg_path.read_text()
        if TRTLLM_BINDINGS not in text:  # cheap pre-filter; CPU repositories never parse here
            continue
        cfg = text_format.Parse(text, mc.ModelConfig())
        if cfg.parameters["executor_bindings"].string_value == TRTLLM_BINDINGS:
            found[cfg.name or cfg_path.parent.name] = Path(cfg.parameters["engine_dir"].string_value)
    return found


def check_repository(model_repository: str | Path, runtime: RuntimeInfo | None = None) -> list[EngineManifest]:
    """Check every TensorRT-LLM engine a model repository serves; the launcher calls this before starting
    tritonserver. Raises :class:`EngineMismatch` (message lists every problem). CPU repositories pass."""
    dirs = trtllm_engine_dirs(model_repository)
    if not dirs or os.environ.get(SKIP_CHECK_ENV) == "1":
        return []
    runtime = runtime or detect_runtime()
    manifests, problems = [], []
    for name, engine_dir in dirs.items():
        try:
            m = check_engine(engine_dir, runtime)
            if m:
                manifests.append(m)
        except EngineMismatch as e:
            problems.append(f"model '{name}': {e}")
    if problems:
        raise EngineMismatch("\n".join(problems))
    return manifests
