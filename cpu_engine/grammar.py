"""Structured output: the token bitmask a guided sequence's grammar state fills each step, and its application.

A bitmask is int32 [rows, ceil(vocab / 32)]: token t is allowed in row r when bit t % 32 of word t // 32 is set
(xgrammar's layout, so its matchers can fill it directly).
"""

from __future__ import annotations

import torch


def new_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """All tokens allowed in every row."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """logits [B, V] in place: disallowed tokens → -inf."""
    bits = (bitmask[:, :, None] >> torch.arange(32, dtype=torch.int32)) & 1
    allowed = bits.flatten(1)[:, :logits.shape[-1]].bool()
    logits.masked_fill_(~allowed, float("-inf"))
