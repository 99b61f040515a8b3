"""``python -m builders eval``: quality of every CPU engine variant against full precision.

Per variant: perplexity on held-out local text, top-1 agreement and mean KL(fp32 ‖ variant) of the
next-token distributions, weight bytes on disk, load time. Each window is scored by the engine's own model
code (not Hugging Face), so the numbers describe what the server runs.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from cpu_engine import load_engine
from cpu_engine.engine_dir import WEIGHTS_FILE
from cpu_engine.kv_cache import KVCache
from serving.machine import cpu_model

from .cpu_build import VARIANTS, BuildLimits, build_cpu_engine
from .default_model import corpus_files


@dataclass
class VariantQuality:
    variant: str
    quant_algo: str | None
    compute_dtype: str
    perplexity: float
    perplexity_delta_pct: float
    top1_agreement: float
    mean_kl: float
    weight_bytes: int
    load_seconds: float


def heldout_windows(tokenizer, seq_len: int, max_windows: int) -> list[list[int]]:
    ids: list[int] = []
    for path in corpus_files().val:
        ids.extend(tokenizer.encode(path.read_text(encoding="utf-8", errors="replace")))
    return [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)][:max_windows]


def window_log_probs(engine_dir: Path, windows: list[list[int]], desc: str):
    loaded = load_engine(engine_dir)
    seq_len = len(windows[0])
    cache = KVCache(loaded.model.args, 1, seq_len, loaded.compute_dtype)
    positions, slot = torch.arange(seq_len)[None], torch.tensor([0])
    out = []
    with torch.inference_mode():
        for window in tqdm(windows, desc=desc, unit="window", leave=False):
            logits = loaded.model(torch.tensor([window]), positions, slot, cache, last_only=False)[0]
            out.append(F.log_softmax(logits.float(), dim=-1))
    return loaded, out


def evaluate(checkpoint: Path, engines_root: Path, variants=VARIANTS, seq_len: int = 256,
             max_windows: int = 64, calib_samples: int = 64, sq_alpha: float = 0.5) -> list[VariantQuality]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    windows = heldout_windows(tokenizer, seq_len, max_windows)
    targets = torch.tensor([w[1:] for w in windows])
    limits = BuildLimits(max_batch_size=1, max_input_len=seq_len - 1, max_seq_len=seq_len, max_num_tokens=seq_len)
    reference = None
    results = []
    for variant in ["fp32"] + [v for v in variants if v != "fp32"]:
        engine_dir = build_cpu_engine(checkpoint, engines_root / f"eval-{variant}", variant=variant, limits=limits,
                                      sq_alpha=sq_alpha, calib_samples=calib_samples)
        loaded, log_probs = window_log_probs(engine_dir, windows, f"scoring {variant}")
        lp = torch.stack([x[:-1] for x in log_probs])  # predictions for tokens 1..n-1
        nll = -lp.gather(-1, targets[..., None]).mean().item()
        if reference is None:
            reference = lp
        kl = F.kl_div(lp, reference, log_target=True, reduction="none").sum(-1).mean().item()
        agree = (lp.argmax(-1) == reference.argmax(-1)).float().mean().item()
        ppl = math.exp(nll)
        base = results[0].perplexity if results else ppl
        quant = loaded.config["pretrained_config"]["quantization"]["quant_algo"]
        results.append(VariantQuality(variant, quant, str(loaded.compute_dtype).removeprefix("torch."), ppl,
                                      100 * (ppl - base) / base, agree, kl,
                                      (engine_dir / WEIGHTS_FILE).stat().st_size, loaded.load_seconds))
    return results


def to_markdown(results: list[VariantQuality], command: str, windows: int, seq_len: int) -> str:
    lines = [
        "# CPU engine variants: quality versus full precision",
        "",
        f"Command: `{command}`  ",
        f"Held-out text: {windows} windows × {seq_len} tokens from the held-out standard-library files "
        "(`builders.default_model.corpus_files().val`), scored by the engine's own model code.  ",
        f"Machine: {platform.machine()}, {cpu_model()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads.",
        "",
        "| variant | quant_algo | compute | perplexity | Δ vs fp32 | top-1 agreement | mean KL | weights | load |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r.variant} | {r.quant_algo or '—'} | {r.compute_dtype} | {r.perplexity:.2f} | "
                     f"{r.perplexity_delta_pct:+.2f}% | {r.top1_agreement:.4f} | {r.mean_kl:.5f} | "
                     f"{r.weight_bytes / 1e6:.2f} MB | {r.load_seconds * 1000:.0f} ms |")
    lines += [
        "",
        "FP8 weights are stored as float8_e4m3fn with per-channel scales and dequantised to the compute dtype "
        "at load (CPUs have no fast FP8 matmul; a per-call upcast is far slower), so FP8 saves disk and load "
        "bandwidth, not memory or compute. int8_wo computes with `torch._weight_int8pack_mm` on bf16 "
        "activations; int8_sq with `torch._int_mm` on per-token int8 activations after SmoothQuant smoothing "
        "(calibrated on the training split of the same local corpus).",
    ]
    return "\n".join(lines) + "\n"


def write_report(results: list[VariantQuality], out_md: Path, command: str, windows: int, seq_len: int) -> None:
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text(to_markdown(results, command, windows, seq_len))
    out_md.with_suffix(".json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
