"""Local calibration text for ModelOpt (fp8, int8_sq, int4_awq), made from material every machine has.

TensorRT-LLM's ``quantize.py`` defaults to a hub dataset (cnn_dailymail), which fails offline. It accepts a
local dataset only as a *directory* that ``datasets.load_dataset(dir, split="train")`` can read, and uses its
``text`` column (``tensorrt_llm/quantization/quantize_by_modelopt.py: get_calib_dataloader``). So we write
``<dir>/train.jsonl`` with one ``{"text": ...}`` object per sample, and nothing else in that directory
(another file there could be picked up as data); provenance goes to a JSON file beside it.

The text: the top-level ``.py`` files of the running Python's standard library, sorted by name (the same
corpus as ``builders/default_model.py: corpus_files``), cut at line boundaries into samples of about
``chars_per_sample`` characters, ``n_samples`` of them taken evenly across the corpus. Deterministic for a
given Python installation. Nothing here imports torch or TensorRT-LLM.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path


def hub_branch(dataset_name_or_dir: str) -> str | None:
    """The dataset ``get_calib_dataloader`` takes this ``--calib_dataset`` for instead of a local text directory,
    or None. Its branches in order: exactly "pileval" (the hub's Pile); "scienceqa" / "science_qa" anywhere,
    any case (ScienceQA, multimodal); "cnn_dailymail" anywhere, this case (loaded with name="3.0.0" and its
    "article" column); only then ``os.path.isdir`` (our ``text`` column)."""
    if dataset_name_or_dir == "pileval":
        return "pileval"
    if any(word in dataset_name_or_dir.lower() for word in ("scienceqa", "science_qa")):
        return "ScienceQA"
    if "cnn_dailymail" in dataset_name_or_dir:
        return "cnn_dailymail"
    return None


def stdlib_sources(root: str | Path | None = None) -> list[Path]:
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted((p for p in base.glob("*.py") if p.is_file()), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no .py files under {base}")
    return files


def _samples(files: list[Path], chars_per_sample: int) -> list[str]:
    out: list[str] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        current: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            current.append(line)
            size += len(line)
            if size >= chars_per_sample:
                out.append("".join(current))
                current, size = [], 0
        if size >= chars_per_sample // 4:
            out.append("".join(current))
    return [s for s in out if s.strip()]


def write_calibration_set(out_dir: str | Path, n_samples: int = 512, chars_per_sample: int = 2048,
                          root: str | Path | None = None) -> Path:
    """Write ``out_dir/train.jsonl`` (and ``out_dir.with_suffix('.json')`` with provenance); return out_dir."""
    out_dir = Path(out_dir)
    taken_for = hub_branch(str(out_dir))  # the same string the plan passes as --calib_dataset
    if taken_for:
        raise ValueError(f"calibration directory {out_dir}: quantize.py's get_calib_dataloader would take it for "
                         f"the hub dataset name {taken_for}, not a local text directory; choose another path")
    files = stdlib_sources(root)
    samples = _samples(files, chars_per_sample)
    if len(samples) < n_samples:
        raise ValueError(f"only {len(samples)} samples of {chars_per_sample} characters in {files[0].parent}; "
                         f"lower --calib-size")
    step = len(samples) / n_samples
    chosen = [samples[int(i * step)] for i in range(n_samples)]
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():  # the directory must hold the data file only
        if stale.is_file():
            stale.unlink()
    data = "".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in chosen)
    (out_dir / "train.jsonl").write_text(data, encoding="utf-8")
    info = {
        "source": str(files[0].parent), "files": len(files), "samples": n_samples,
        "chars_per_sample": chars_per_sample, "sha256": hashlib.sha256(data.encode("utf-8")).hexdigest(),
        "format": "datasets json builder: train split, 'text' column",
    }
    out_dir.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
    return out_dir
