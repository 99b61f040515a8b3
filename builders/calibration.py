"""Local calibration for SmoothQuant (``int8_sq``) and AWQ (``int4_awq``): token windows of real English prose taken
evenly across the calibration part of :mod:`builders.english_text` (standard-library docstrings and the Language
Reference), and the activation-aware scale search of AWQ on them.

No hub dataset is involved, so calibration works offline and is reproducible; the held-out evaluation text
(``english_text.evaluation_texts()``) is never seen here.
"""

from __future__ import annotations

import torch
from torch import nn

from cpu_engine.quant import int4_group_dequantise, int4_group_quantise, observe_inputs

from .english_text import calibration_texts, token_stream

AWQ_GRID = 20  # exponents α in 0, 0.05, …, 1 tried per projection group
AWQ_ROWS = 512  # activation rows kept per input for the search (the per-channel mean uses every row)
AWQ_CLIP_RATIOS = tuple(1 - i / 20 for i in range(10))  # each group's range shrunk to 100 %, 95 %, …, 55 %
AWQ_CLIP_ROWS = 128  # activation rows used for the clip search
AWQ_INPUTS = ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")


def calibration_batches(tokenizer, samples: int = 64, seq_len: int = 256, batch_size: int = 8) -> list[torch.Tensor]:
    """``samples`` windows of ``seq_len`` tokens, spread evenly over the calibration text, in batches."""
    ids = token_stream(tokenizer, calibration_texts())
    n_windows = len(ids) // seq_len
    if n_windows < samples:
        raise ValueError(f"only {n_windows} calibration windows of {seq_len} tokens in the local English text; "
                         f"lower --calib-samples")
    picks = [int(i * n_windows / samples) * seq_len for i in range(samples)]
    windows = torch.tensor([ids[start:start + seq_len] for start in picks])
    return list(windows.split(batch_size))


def awq_statistics(model: nn.Module, batches: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per input of ``AWQ_INPUTS`` (our names): (mean |x| per channel, ``AWQ_ROWS`` sample rows), from a Hugging
    Face causal LM run on ``batches``."""
    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, list[torch.Tensor]] = {}
    total = sum(b.numel() for b in batches)
    stride = max(1, total // AWQ_ROWS)  # rows kept evenly across the batches

    def record(name: str, x: torch.Tensor) -> None:
        sums[name] = sums.get(name, 0) + x.abs().sum(dim=0)
        rows.setdefault(name, []).append(x[::stride])

    observe_inputs(model, batches, lambda name: name.endswith(AWQ_INPUTS), record)
    return {name: (sums[name] / total, torch.cat(rows[name])[:AWQ_ROWS]) for name in sums}


def awq_scale(weight: torch.Tensor, x: torch.Tensor, act_mean: torch.Tensor, group_size: int) -> torch.Tensor:
    """AWQ: the per-input-channel scale s = mean|x|^α (α searched) that minimises ‖x Wᵀ − x (Q(W·s)/s)ᵀ‖²:
    salient input channels get finer quantisation steps."""
    reference = x @ weight.T
    best, best_error = torch.ones_like(act_mean), float("inf")
    for i in range(AWQ_GRID + 1):
        s = act_mean.clamp(min=1e-5).pow(i / AWQ_GRID)
        s = s / (s.max() * s.min()).sqrt()
        fake = int4_group_dequantise(*int4_group_quantise(weight * s, group_size)) / s
        error = (x @ fake.T - reference).pow(2).mean().item()
        if error < best_error:
            best, best_error = s, error
    return best


def awq_clip(weight: torch.Tensor, x: torch.Tensor, group_size: int) -> torch.Tensor:
    """AWQ's clip search: per (row, group), the shrunk range [r·min, r·max] whose int4 rounding changes
    x Wᵀ least; returns ``weight`` clamped to it (outliers give up precision so the bulk of the group gains)."""
    rows, cols = weight.shape
    w = weight.reshape(rows, -1, group_size)
    xs = x[:AWQ_CLIP_ROWS].reshape(min(len(x), AWQ_CLIP_ROWS), -1, group_size)
    lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    best, best_error = w, torch.full(w.shape[:2], float("inf"))
    for r in AWQ_CLIP_RATIOS:
        clipped = torch.minimum(torch.maximum(w, lo * r), hi * r)
        fake = int4_group_dequantise(*int4_group_quantise(clipped.reshape(rows, cols), group_size))
        error = torch.einsum("ngk,ogk->nog", xs, w - fake.reshape(w.shape)).pow(2).mean(dim=0)
        better = error < best_error
        best_error = torch.where(better, error, best_error)
        best = torch.where(better[..., None], clipped, best)
    return best.reshape(rows, cols)


def apply_awq(weights: dict[str, torch.Tensor], stats: dict, num_layers: int, group_size: int) -> None:
    """Scale fp32 ``weights`` (our names) in place, folding each 1/s into what produces the scaled input, so the
    model computes the same function: q/k/v's into ``input_layernorm``, gate/up's into
    ``post_attention_layernorm``, down's into up's rows. o_proj stays unscaled: with grouped-query attention its
    input channels repeat v's rows across heads, so no v row scaling fits them all (AWQ skips it too).
    Then every projection's groups are clipped (:func:`awq_clip`) against the input it sees after scaling."""
    for i in range(num_layers):
        p = f"layers.{i}."
        groups = ((("mlp.down_proj",), "mlp.up_proj", "mlp.down_proj"),
                  (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "input_layernorm", "self_attn.q_proj"),
                  (("mlp.gate_proj", "mlp.up_proj"), "post_attention_layernorm", "mlp.gate_proj"),
                  (("self_attn.o_proj",), None, "self_attn.o_proj"))
        for projections, fold_into, source in groups:
            names = [f"{p}{n}.weight" for n in projections]
            mean, x = stats[p + source]
            s = torch.ones_like(mean)
            if fold_into is not None:
                s = awq_scale(torch.cat([weights[n] for n in names]), x, mean, group_size)
                for n in names:
                    weights[n] *= s
                # A norm's weight scales its output channels; up_proj's output channels are its rows.
                target = weights[f"{p}{fold_into}.weight"]
                target /= s if target.dim() == 1 else s[:, None]
            for n in names:
                weights[n] = awq_clip(weights[n], x / s, group_size)
