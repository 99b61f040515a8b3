"""The CPU engine directory: ``config.json`` in TensorRT-LLM's engine schema plus ``rank0.safetensors``.

Sharing the schema means the repository layout and the server launcher read CPU and GPU engines alike.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from .model import ModelArgs, Transformer

CPU_ENGINE_VERSION = "cpu-engine-1"
WEIGHTS_FILE = "rank0.safetensors"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedEngine:
    model: Transformer
    config: dict
    compute_dtype: torch.dtype
    load_seconds: float

    @property
    def build_config(self) -> dict:
        return self.config["build_config"]


def read_config(engine_dir: str | Path) -> dict:
    path = Path(engine_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no engine config at {path}: build the engine first (python -m builders engine)")
    return json.loads(path.read_text())


def load_engine(engine_dir: str | Path) -> LoadedEngine:
    start = time.perf_counter()
    config = read_config(engine_dir)
    if config.get("version") != CPU_ENGINE_VERSION:
        raise ValueError(f"{engine_dir} holds a {config.get('version')!r} engine, not a CPU engine "
                         f"({CPU_ENGINE_VERSION}): TensorRT-LLM engines need the tensorrtllm backend on a GPU")
    pc = config["pretrained_config"]
    quant = (pc.get("quantization") or {}).get("quant_algo")
    if quant is not None:
        raise ValueError(f"quantisation {quant} is not supported by this CPU engine build")
    dtype = DTYPES[pc["dtype"]]
    model = Transformer(ModelArgs.from_pretrained_config(pc))
    state = load_file(str(Path(engine_dir) / WEIGHTS_FILE))
    if model.args.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["embed_tokens.weight"])
    model.load_state_dict(state, strict=True)
    model.to(dtype)
    return LoadedEngine(model.eval(), config, dtype, time.perf_counter() - start)
