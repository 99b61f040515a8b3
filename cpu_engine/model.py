"""A Llama/Mistral-family transformer for CPU inference over a slotted KV cache (gpt-fast style).

One forward pass takes a [B, T] block of tokens, each row belonging to a KV-cache slot and starting at its
own position, so the same code runs prefill chunks and batched decode steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from .kv_cache import KVCache


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
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 like the reference implementation, then return to the compute dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.q_proj = nn.Linear(args.hidden_size, args.num_heads * args.head_dim, bias=False)
        self.k_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim, bias=False)
        self.v_proj = nn.Linear(args.hidden_size, args.num_kv_heads * args.head_dim, bias=False)
        self.o_proj = nn.Linear(args.num_heads * args.head_dim, args.hidden_size, bias=False)

    def forward(self, x, cos, sin, k_cache, v_cache, slots, positions, kv_len, mask):
        b, t, _ = x.shape
        a = self.args
        q = self.q_proj(x).view(b, t, a.num_heads, a.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, a.num_kv_heads, a.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, a.num_kv_heads, a.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = (k * cos + _rotate_half(k) * sin).transpose(1, 2)
        # Write this block's keys/values into each row's slot at its positions: cache is [slot, pos, kvh, hd].
        k_cache[slots[:, None], positions] = k.to(k_cache.dtype)
        v_cache[slots[:, None], positions] = v.to(v_cache.dtype)
        keys = k_cache[slots, :kv_len].transpose(1, 2).to(q.dtype)
        values = v_cache[slots, :kv_len].transpose(1, 2).to(q.dtype)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, a.num_heads * a.head_dim))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)

    def forward(self, x, cos, sin, k_cache, v_cache, slots, positions, kv_len, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, k_cache, v_cache, slots, positions, kv_len, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """Parameter names match Hugging Face's ``LlamaForCausalLM`` minus the ``model.`` prefix."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        # A plain attribute, not a buffer: it must stay fp32 when the weights move to bf16.
        self.inv_freq = rope_inv_freq(args)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: "KVCache", last_only: bool = True) -> torch.Tensor:
        """tokens/positions: [B, T] (int64); slots: [B]. Returns fp32 logits [B, V] (last position) or [B, T, V]."""
        kv_len = int(positions.max()) + 1
        x = self.embed_tokens(tokens).to(cache.compute_dtype)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None].to(x.dtype), emb.sin()[:, None].to(x.dtype)
        # Causal within the block and bounded by each row's own history: key j is visible to query i iff j <= pos_i.
        mask = (torch.arange(kv_len)[None, None, :] <= positions[:, :, None])[:, None]
        for layer, (k_cache, v_cache) in zip(self.layers, cache.layers):
            x = layer(x, cos, sin, k_cache, v_cache, slots, positions, kv_len, mask)
        if last_only:
            x = x[:, -1]
        return self.lm_head(self.norm(x)).float()
