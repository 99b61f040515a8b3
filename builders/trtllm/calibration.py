"""Local calibration text for ModelOpt (fp8, int8_sq, int4_awq), made from material every machine has.

TensorRT-LLM's ``quantize.py`` defaults to a hub dataset (cnn_dailymail), which fails offline. It accepts a
local dataset only as a *directory* that ``datasets.load_dataset(dir, split="train")`` can read, and uses its
``text`` column (``tensorrt_llm/quantization/quantize_by_modelopt.py: get_calib_dataloader``). So we write
``<dir>/train.jsonl`` with one ``{"text": ...}`` object per sample, and nothing else in that directory
(another file there could be picked up as data); provenance goes to a JSON file beside it.

The text: the calibration part of ``builders/english_text.py`` (prose paragraphs of the running Python's
standard-library docstrings and of its Language Reference, ``pydoc_data/topics.py``; the held-out part is kept for
evaluation), its paragraphs in unit order packed into samples of at least ``chars_per_sample`` characters, each
starting at a paragraph, ``n_samples`` of them starting evenly across the text (neighbours overlap a little when
``n_samples × chars_per_sample`` exceeds the text: 512 × 2048 characters does, slightly). Deterministic for a
given Python installation. Nothing here imports torch or TensorRT-LLM.
"""

from __future__ import annotations

import hashlib
import json
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


def _paragraphs(root: str | Path | None) -> list[str]:
    from ..english_text import units

    return [p for u in units(root) if not u.heldout for p in u.paragraphs]


def _samples(paragraphs: list[str], n_samples: int, chars_per_sample: int) -> list[str]:
    starts, total = [], 0
    for p in paragraphs:
        starts.append(total)
        total += len(p) + 2
    if total < chars_per_sample * max(n_samples, 2) / 2:  # more than every character twice: too little text
        raise ValueError(f"only {total} characters of calibration text for {n_samples} samples of "
                         f"{chars_per_sample}; lower --calib-size")
    span = max(total - chars_per_sample, 0)
    out, first = [], 0
    for i in range(n_samples):
        target = span * i // max(n_samples - 1, 1)
        while first + 1 < len(starts) and starts[first + 1] <= target:
            first += 1
        chunk, size, j = [], 0, first
        while size < chars_per_sample and j < len(paragraphs):
            chunk.append(paragraphs[j])
            size += len(paragraphs[j]) + 2
            j += 1
        out.append("\n\n".join(chunk))
    return out


def write_calibration_set(out_dir: str | Path, n_samples: int = 512, chars_per_sample: int = 2048,
                          root: str | Path | None = None) -> Path:
    """Write ``out_dir/train.jsonl`` (and ``out_dir.with_suffix('.json')`` with provenance); return out_dir."""
    out_dir = Path(out_dir)
    taken_for = hub_branch(str(out_dir))  # the same string the plan passes as --calib_dataset
    if taken_for:
        raise ValueError(f"calibration directory {out_dir}: quantize.py's get_calib_dataloader would take it for "
                         f"the hub dataset name {taken_for}, not a local text directory; choose another path")
    from ..english_text import summary

    chosen = _samples(_paragraphs(root), n_samples, chars_per_sample)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():  # the directory must hold the data file only
        if stale.is_file():
            stale.unlink()
    data = "".join(json.dumps({"text": s}, ensure_ascii=False) + "\n" for s in chosen)
    (out_dir / "train.jsonl").write_text(data, encoding="utf-8")
    text = summary(root)
    info = {
        "source": text["source"], "stdlib": text["stdlib"], "python": text["python"],
        "text_sha256": text["calibration"]["sha256"], "samples": n_samples,
        "chars_per_sample": chars_per_sample, "sha256": hashlib.sha256(data.encode("utf-8")).hexdigest(),
        "format": "datasets json builder: train split, 'text' column",
    }
    out_dir.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")
    return out_dir
