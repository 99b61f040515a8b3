"""Paged KV cache tensors: per layer one [blocks × block_size, kv_heads, head_dim] pair; block b is rows
b·block_size … (b+1)·block_size − 1. Which block holds what is block_manager.py's business.

The last ``probe_blocks`` blocks are the liveness probe's (serving/health.py): a probe generates through the engine
even when every block is taken, so a busy engine never fails its liveness check and a stuck one always does."""

from __future__ import annotations

import torch

from .model import ModelArgs

PROBE_BLOCKS = 2  # a probe is a short prompt and one token


class KVCache:
    def __init__(self, args: ModelArgs, num_blocks: int, block_size: int, dtype: torch.dtype,
                 probe_blocks: int = PROBE_BLOCKS):
        # Zeroed, not empty: a padded row reads positions it never wrote, masked out, and 0 × NaN would leak.
        shape = ((num_blocks + probe_blocks) * block_size, args.num_kv_heads, args.head_dim)
        self.layers = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                       for _ in range(args.num_layers)]
        self.compute_dtype = dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.probe_blocks = probe_blocks

    @classmethod
    def for_one_sequence(cls, args: ModelArgs, length: int, dtype: torch.dtype,
                         block_size: int = 256) -> tuple["KVCache", torch.Tensor]:
        """A cache for one sequence of ``length`` positions and its block table (perplexity windows)."""
        blocks = -(-length // block_size)
        return cls(args, blocks + 1, block_size, dtype, probe_blocks=0), torch.arange(1, blocks + 1)[None]

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """KV of block ``src`` into block ``dst`` for each pair (a shared block a sequence is about to write)."""
        bs = self.block_size
        for k, v in self.layers:
            for src, dst in pairs:
                k[dst * bs:(dst + 1) * bs] = k[src * bs:(src + 1) * bs]
                v[dst * bs:(dst + 1) * bs] = v[src * bs:(src + 1) * bs]

    def bytes_per_token(self) -> int:
        k, _ = self.layers[0]
        return 2 * len(self.layers) * k.shape[1] * k.shape[2] * k.element_size()
