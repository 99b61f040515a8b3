"""A Llama/Mistral-family transformer for CPU inference over a paged KV cache (gpt-fast style).

One forward pass takes a [B, T] block of tokens, each row with its own block table and starting at its own
position, so the same code runs prefill chunks and batched decode steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from . import native


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False

    @classmethod
    def from_pretrained_config(cls, pc: dict) -> "ModelArgs":
        """From the ``pretrained_config`` of a TensorRT-LLM-schema engine ``config.json``."""
        return cls(
            vocab_size=pc["vocab_size"],
            hidden_size=pc["hidden_size"],
            intermediate_size=pc["intermediate_size"],
            num_layers=pc["num_hidden_layers"],
            num_heads=pc["num_attention_heads"],
            num_kv_heads=pc["num_key_value_heads"],
            head_dim=pc["head_size"],
            max_position_embeddings=pc["max_position_embeddings"],
            rope_theta=float(pc["rotary_base"]),
            rope_scaling=pc.get("rotary_scaling"),
            norm_eps=pc["norm_epsilon"],
            tie_word_embeddings=bool(pc.get("tie_word_embeddings", False)),
        )


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies, with Llama-3 style and linear scaling applied as Hugging Face does."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    scaling = args.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_ctx = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, Hugging Face's half-split layout: x [B, T, heads, head_dim], cos/sin [B, T, 1, head_dim]
    with the first half of ``sin`` negated (Step), so rotate_half(x) * sin is one roll: bit-identical, 2 ops not 5."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused op; in fp32 it is bit-identical to Hugging Face's five-op LlamaRMSNorm.
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Cache(Protocol):
    """What a forward pass needs of a KV cache (kv_cache.KVCache): per layer a (keys, values) pair of
    [blocks × block_size, kv_heads, head_dim] tensors, the block size, and the dtype the model computes in."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    block_size: int
    compute_dtype: torch.dtype


@dataclass(frozen=True)
class Step:
    """What every layer needs for one forward block, computed once per forward."""

    positions: torch.Tensor  # [B, T]
    writes: torch.Tensor  # [B, T] the cache row each new key/value goes to
    kv_len: int  # keys to attend over: the longest row's history
    cos: torch.Tensor
    sin: torch.Tensor
    mask: torch.Tensor | None  # [B, 1, T, kv_len]; None when every query sees every key
    reads: torch.Tensor | None  # [B × kv_len] the cache rows of each row's positions 0..kv_len-1, row after row
    runs: tuple[tuple[int, int], ...]  # one row: (first cache row, length) of each run of adjacent blocks
    fused_attention: bool  # SDPA; else one query a row as three batched matmuls (_attend)
    # One query a row, read in place from the cache by the C++ kernel (kernels/decode_attention.cpp): a decode
    # step's attention, eager or compiled, where the engine's kernels are loaded.
    native_attention: bool = False

    def read(self, cache: torch.Tensor) -> list[torch.Tensor]:
        """Positions 0..kv_len-1 of each row as [B, L, kv_heads, head_dim]: views of one row's runs of adjacent
        blocks, or one gathered tensor."""
        if self.reads is None:
            return [cache[start:start + n][None] for start, n in self.runs]
        # index_select, not cache[reads]: 5.5× faster for 16 rows × 704 positions (122 vs 671 µs a tensor).
        return [cache.index_select(0, self.reads).view(-1, self.kv_len, *cache.shape[1:])]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
            fused: bool) -> torch.Tensor:
    """q [B, H, T, D] over k/v [B, KVH, L, D] (grouped-query). Blocks of queries use the fused SDPA kernel; one
    query per row (decode) over several rows is three small batched matmuls, which measured 4.7× faster at 16
    rows in bf16 (0.85 → 0.18 ms a layer); at 1 row the fused kernel is still the faster (1.8 vs 2.1 ms a step)."""
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    b, h, _, d = q.shape
    kvh = k.shape[1]
    # k (gathered [B, L, KVH, D], viewed [B, KVH, L, D]) copied whole rows at a time into [B, KVH, L, D]: the
    # matmul then reads it transposed in place. Left to the matmul, the copy is a column gather into [B, KVH, D, L]
    # (compiled, 16 rows x 200 keys: 373 µs a layer).
    k = k.contiguous()
    scores = (q.reshape(b, kvh, h // kvh, d) @ k.transpose(-1, -2)) * d ** -0.5  # a KV head's query heads as rows
    if mask is not None:
        scores = scores.masked_fill(~mask.view(b, 1, 1, -1), float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return (probs @ v).view(b, h, 1, d)


def _attend_runs(q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor]) -> torch.Tensor:
    """One query (a decode step of one row) over keys/values held in several runs [1, KVH, L_i, D], none copied:
    scores per run, one softmax over them all, then the runs' weighted values summed. A reused prefix and the
    sequence's own blocks are two runs; gathering them into one tensor cost batch-1 decode 18 % at 700 positions."""
    _, h, _, d = q.shape
    kvh = ks[0].shape[1]
    qg = q.reshape(1, kvh, h // kvh, d)
    scores = torch.cat([qg @ k.transpose(-1, -2) for k in ks], dim=-1) * d ** -0.5
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    parts = probs.split([k.shape[2] for k in ks], dim=-1)
    return sum(p @ v for p, v in zip(parts, vs)).view(1, h, 1, d)


class Attention(nn.Module):
    """q, k and v come from one fused projection (one weight read and one kernel call instead of three)."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        qkv_heads = args.num_heads + 2 * args.num_kv_heads
        self.qkv_proj = nn.Linear(args.hidden_size, qkv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, step: Step, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, kvh = self.args.num_heads, self.args.num_kv_heads
        qkv = self.qkv_proj(x).view(b, t, h + 2 * kvh, self.args.head_dim)
        qk = _rope(qkv[:, :, :h + kvh], step.cos, step.sin)
        # This block's keys/values go to the cache rows of each row's positions (its blocks).
        rows = step.writes.flatten()
        k_cache.index_copy_(0, rows, qk[:, :, h:].reshape(-1, kvh, self.args.head_dim))
        v_cache.index_copy_(0, rows, qkv[:, :, h + kvh:].reshape(-1, kvh, self.args.head_dim))
        if step.native_attention:
            out = torch.ops.llm_cpu.decode_attention(qk[:, 0, :h], k_cache, v_cache, step.reads.view(b, -1),
                                                     step.positions[:, 0])
            return self.o_proj(out.reshape(b, t, h * self.args.head_dim))
        ks = [k.transpose(1, 2) for k in step.read(k_cache)]
        vs = [v.transpose(1, 2) for v in step.read(v_cache)]
        q = qk[:, :, :h].transpose(1, 2)
        out = _attend(q, ks[0], vs[0], step.mask, step.fused_attention) if len(ks) == 1 else _attend_runs(q, ks, vs)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * self.args.head_dim))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)

    def forward(self, x, step: Step, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), step, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names match Hugging Face's ``LlamaForCausalLM`` minus the ``model.`` prefix."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        # Given its (uninitialised) weight: the engine file fills it, and nn.Embedding's own init on the meta device
        # (engine_dir builds there) runs normal_'s Python reference kernel, whose first call imports
        # torch._dynamo and sympy: ~800 modules, ~70 MB of every served process, which never compiles anything.
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size,
                                         _weight=torch.empty(args.vocab_size, args.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # A plain attribute, not a buffer: it must stay fp32 when the weights move to bf16.
        self.inv_freq = rope_inv_freq(args)
        # The decode step compiled ahead of time over these weights (compiled_step.CompiledDecode), which the engine
        # runs for decode batches it fits; set by engine_dir.load_engine.
        self.compiled_decode = None

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, blocks: torch.Tensor,
                cache: Cache, last_only: bool = True, last: torch.Tensor | None = None) -> torch.Tensor:
        """tokens/positions: [B, T] (int64); blocks: [B, N] each row's block table (padded with block 0).
        Returns fp32 logits [B, V] (last position, or column ``last[b]`` of each row when rows are padded) or
        [B, T, V]."""
        x = self.embed_tokens(tokens).to(cache.compute_dtype)
        step = self.step_inputs(positions, blocks, cache.block_size, x.dtype)
        for layer, (k_cache, v_cache) in zip(self.layers, cache.layers):
            x = layer(x, step, k_cache, v_cache)
        if last is not None:
            x = x[torch.arange(x.shape[0]), last]
        elif last_only:
            x = x[:, -1]
        return self.lm_head(self.norm(x)).float()

    def step_inputs(self, positions: torch.Tensor, blocks: torch.Tensor, block_size: int, dtype: torch.dtype) -> Step:
        kv_len = int(positions.max()) + 1
        cos, sin = rope(positions, self.inv_freq, dtype)
        # A decode step attends in the C++ kernel where it is loaded, as the compiled step does: the same numbers
        # whichever of the two runs a batch. It reads the cache rows in place and bounds each row by its position.
        kernel = positions.shape[1] == 1 and native.available()
        # Causal within the block and bounded by each row's own history: key j is visible to query i iff j <= pos_i.
        # A decode step whose rows all sit at the same position needs no mask (the common batch-1 case).
        mask = None
        if not kernel and (positions.shape[1] > 1 or int(positions.min()) != kv_len - 1):
            mask = (torch.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]
        # Positions past a row's blocks (padding) map to block 0, which no sequence owns.
        needed = -(-kv_len // block_size)
        if blocks.shape[1] < needed:
            blocks = F.pad(blocks, (0, needed - blocks.shape[1]))
        writes = blocks.gather(1, positions // block_size) * block_size + positions % block_size
        runs = _runs(blocks[0, :needed].tolist(), block_size, kv_len) if blocks.shape[0] == 1 and not kernel else ()
        # Views instead of a copy: one row's adjacent blocks, or its runs of them in a decode step (_attend_runs).
        if len(runs) == 1 or (1 < len(runs) <= MAX_RUNS and mask is None):
            reads = None
        else:
            keys = torch.arange(kv_len)
            reads, runs = (blocks[:, keys // block_size] * block_size + keys % block_size).flatten(), ()
        fused = positions.shape[1] > 1 or positions.shape[0] == 1
        return Step(positions, writes, kv_len, cos, sin, mask, reads, runs, fused, kernel)


def rope(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, T, 1, head_dim] of each position, the first half of sin negated (see _rope)."""
    freqs = positions[..., None].float() * inv_freq
    cos = torch.cat((freqs, freqs), dim=-1).cos()[:, :, None]
    sin = torch.cat((-freqs.sin(), freqs.sin()), dim=-1)[:, :, None]
    return cos.to(dtype), sin.to(dtype)


MAX_RUNS = 8  # more runs than this: one gathered copy beats as many small matmuls


def _runs(ids: list[int], block_size: int, length: int) -> tuple[tuple[int, int], ...]:
    """(first cache row, rows) of each run of adjacent blocks in ``ids``, covering positions 0..length-1."""
    runs: list[list[int]] = []
    for i, block in enumerate(ids):
        if runs and block == ids[i - 1] + 1:
            runs[-1][1] += block_size
        else:
            runs.append([block * block_size, block_size])
    runs[-1][1] -= len(ids) * block_size - length
    return tuple((start, n) for start, n in runs)
