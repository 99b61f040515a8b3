"""GPU memory budget of an engine: weights, KV cache per token, and what batch × sequence fits.

All numbers are computed from the Hugging Face ``config.json`` (no weights are read), so the budget is known
before any GPU work, printed, written as JSON beside the engine, and used to fill the Triton config
(``max_tokens_in_paged_kv_cache``).

- KV bytes per token = 2 (K and V) × layers × kv_heads × head_dim × bytes per element.
- Weights: every linear layer at the variant's bits (+ fp16 scales: per output channel, or per group of
  ``group_size`` inputs for AWQ); embeddings, norms and ``lm_head`` stay in the activation dtype (ModelOpt
  and convert_checkpoint.py do not quantize them by default).
- Run time: TensorRT-LLM sizes the paged KV cache as ``kv_cache_free_gpu_mem_fraction`` × the memory left
  after the engine (weights + activation buffers) is loaded. The activation estimate here is an estimate,
  labelled as such in the JSON; the KV figure is exact arithmetic.

A budget is only made for what the builder takes (``gpus.check_variant``), and its notes say when the builder's
rules (``rules.py``) leave the engine without paged context FMHA, and so without KV-cache reuse.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .gpus import GIB, GpuSpec, check_variant
from .rules import flag_notes, plugin_flags
from .variants import KV_CACHE_QUANT_ALGO, VARIANTS, Variant, kv_bytes_per_element

#: CUDA context, cuBLAS/NCCL workspaces and TensorRT runtime, per GPU (estimate).
RUNTIME_OVERHEAD_BYTES = int(1.5 * GIB)


@dataclass(frozen=True)
class ModelShape:
    """The parts of a Llama-family Hugging Face config that decide memory."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        heads = config["num_attention_heads"]
        return cls(
            num_hidden_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            architecture=(config.get("architectures") or ["LlamaForCausalLM"])[0],
        )

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> ModelShape:
        return cls.from_hf_config(json.loads((Path(checkpoint_dir) / "config.json").read_text()))

    # ---- parameter counts
    @property
    def linear_params_per_layer(self) -> int:
        q = self.hidden_size * self.num_attention_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        return q + kv + o + mlp

    @property
    def linear_params(self) -> int:
        return self.num_hidden_layers * self.linear_params_per_layer

    @property
    def embedding_params(self) -> int:
        """Token embedding + lm_head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def norm_params(self) -> int:
        return (2 * self.num_hidden_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_params + self.norm_params


def kv_bytes_per_token(shape: ModelShape, bytes_per_element: int = 2, tp: int = 1, pp: int = 1) -> int:
    """K and V of one token, per GPU: layers split by PP, KV heads split by TP (at least one per rank)."""
    layers = math.ceil(shape.num_hidden_layers / pp)
    kv_heads = max(1, math.ceil(shape.num_key_value_heads / tp))
    return 2 * layers * kv_heads * shape.head_dim * bytes_per_element


def weight_bytes(shape: ModelShape, variant: Variant | str) -> int:
    """Bytes of the whole model's weights for one variant (all ranks together)."""
    v = VARIANTS[variant] if isinstance(variant, str) else variant
    high = 2  # fp16 / bf16
    rest = (shape.embedding_params + shape.norm_params) * high
    if v.quant_algo is None:
        return shape.linear_params * high + rest
    linear = shape.linear_params * v.weight_bits / 8
    if v.group_size:  # one fp16 scale per group of inputs, plus AWQ's per-input pre-quant scale
        linear += shape.linear_params / v.group_size * high
        linear += shape.num_hidden_layers * 4 * shape.hidden_size * high
    else:  # one fp16 scale per output channel
        out_channels = shape.num_hidden_layers * (
            (shape.num_attention_heads + 2 * shape.num_key_value_heads) * shape.head_dim
            + shape.hidden_size + 2 * shape.intermediate_size + shape.hidden_size)
        linear += out_channels * high
    return int(linear) + rest


def activation_bytes(shape: ModelShape, max_num_tokens: int, max_batch_size: int, tp: int = 1) -> int:
    """Estimate of TensorRT's activation buffers per GPU: the widest per-token intermediate tensors for
    ``max_num_tokens`` tokens (fp16) plus fp32 logits for one token of every sequence in the batch."""
    per_token = (3 * shape.hidden_size + 2 * shape.intermediate_size // tp
                 + (shape.num_attention_heads + 2 * shape.num_key_value_heads) * shape.head_dim // tp)
    return max_num_tokens * per_token * 2 + max_batch_size * (shape.vocab_size // tp) * 4


@dataclass
class MemoryBudget:
    """The budget of one engine on one GPU model (per GPU when TP/PP > 1). Bytes unless named otherwise."""

    variant: str
    kv_cache_dtype: str
    gpu: str
    gpu_memory_bytes: int
    tp_size: int
    pp_size: int
    total_params: int
    weight_bytes_total: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    activation_bytes_estimate: int
    runtime_overhead_bytes_estimate: int
    kv_cache_free_gpu_mem_fraction: float
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_batch_size: int
    max_seq_len: int
    #: sequences of each length that fit in the KV cache at once (capped by max_batch_size)
    batch_at_seq_len: dict[int, int] = field(default_factory=dict)
    #: what the Triton config gets: no more KV than max_batch_size × max_seq_len could ever use
    max_tokens_in_paged_kv_cache: int = 0
    fits: bool = True
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["batch_at_seq_len"] = {str(k): v for k, v in self.batch_at_seq_len.items()}
        data["estimated_fields"] = ["activation_bytes_estimate", "runtime_overhead_bytes_estimate",
                                    "kv_cache_bytes", "kv_cache_tokens", "batch_at_seq_len"]
        return json.dumps(data, indent=2) + "\n"

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    def summary(self) -> str:
        g = GIB
        lines = [
            f"memory budget: {self.variant} (KV cache {self.kv_cache_dtype}) on {self.gpu}, "
            f"{self.gpu_memory_bytes / g:.1f} GiB per GPU, TP={self.tp_size} PP={self.pp_size}",
            f"  weights          {self.weight_bytes_total / 1e9:7.2f} GB total, "
            f"{self.weight_bytes_per_gpu / g:.2f} GiB per GPU ({self.total_params / 1e9:.2f} B params)",
            f"  KV per token     {self.kv_bytes_per_token / 1024:7.0f} KiB per GPU",
            f"  activations      {self.activation_bytes_estimate / g:7.2f} GiB (estimate) + runtime "
            f"{self.runtime_overhead_bytes_estimate / g:.1f} GiB (estimate)",
            f"  KV cache         {self.kv_cache_bytes / g:7.2f} GiB = {self.kv_cache_free_gpu_mem_fraction:.2f} × free "
            f"→ {self.kv_cache_tokens:,} tokens",
            "  batch that fits  " + ", ".join(f"{n} × {s}" for s, n in self.batch_at_seq_len.items()),
            f"  Triton config    max_tokens_in_paged_kv_cache={self.max_tokens_in_paged_kv_cache:,} "
            f"(≤ max_batch_size {self.max_batch_size} × max_seq_len {self.max_seq_len})",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def compute_budget(shape: ModelShape, variant: str, gpu: GpuSpec, *, kv_cache_dtype: str | None = None,
                   tp_size: int = 1, pp_size: int = 1, max_batch_size: int = 64, max_seq_len: int = 4096,
                   max_num_tokens: int = 8192, kv_cache_free_gpu_mem_fraction: float = 0.9,
                   tokens_per_block: int = 32) -> MemoryBudget:
    check_variant(variant, gpu, kv_cache_dtype)
    v = VARIANTS[variant]
    world = tp_size * pp_size
    w_total = weight_bytes(shape, v)
    w_gpu = math.ceil(w_total / world)
    kv_tok = kv_bytes_per_token(shape, kv_bytes_per_element(v, kv_cache_dtype), tp_size, pp_size)
    act = activation_bytes(shape, max_num_tokens, max_batch_size, tp_size)
    free = gpu.memory_bytes - w_gpu - act - RUNTIME_OVERHEAD_BYTES
    notes = flag_notes(*plugin_flags(v.quant_algo, KV_CACHE_QUANT_ALGO[kv_cache_dtype], gpu.compute_capability))
    fits = free > 0
    kv_bytes = max(0, int(free * kv_cache_free_gpu_mem_fraction))
    kv_tokens = kv_bytes // kv_tok // tokens_per_block * tokens_per_block
    if not fits:
        notes.append(f"weights + activations exceed {gpu.memory_bytes / GIB:.1f} GiB: use a smaller variant "
                     f"(int8_wo, int4_awq), more GPUs (--tp-size), or smaller max_num_tokens")
    lengths = sorted({s for s in (512, 1024, 2048, 4096, 8192, 16384, 32768) if s < max_seq_len} | {max_seq_len})
    batch_at = {s: min(max_batch_size, kv_tokens // s) for s in lengths}
    if fits and kv_tokens < max_seq_len:
        fits = False
        notes.append(f"the KV cache ({kv_tokens:,} tokens) cannot hold one sequence of max_seq_len {max_seq_len}")
    cap = max_batch_size * max_seq_len
    max_tokens = min(kv_tokens, math.ceil(cap / tokens_per_block) * tokens_per_block)
    if kv_tokens > cap:
        notes.append(f"KV capped at max_batch_size × max_seq_len = {cap:,} tokens; the rest of the "
                     f"{kv_cache_free_gpu_mem_fraction:.2f} fraction stays free for other processes")
    return MemoryBudget(
        variant=variant, kv_cache_dtype=kv_cache_dtype or v.dtype, gpu=gpu.name, gpu_memory_bytes=gpu.memory_bytes,
        tp_size=tp_size, pp_size=pp_size, total_params=shape.total_params, weight_bytes_total=w_total,
        weight_bytes_per_gpu=w_gpu, kv_bytes_per_token=kv_tok, activation_bytes_estimate=act,
        runtime_overhead_bytes_estimate=RUNTIME_OVERHEAD_BYTES,
        kv_cache_free_gpu_mem_fraction=kv_cache_free_gpu_mem_fraction, kv_cache_bytes=kv_bytes,
        kv_cache_tokens=kv_tokens, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
        batch_at_seq_len=batch_at, max_tokens_in_paged_kv_cache=max_tokens, fits=fits, notes=notes,
    )
