"""Per-request token choice: greedy, or temperature / top-k / top-p sampling from a seeded generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """TensorRT-LLM semantics: top_k == 1 means greedy; top_k == 0 means no top-k cut."""

    temperature: float = 1.0
    top_k: int = 1
    top_p: float = 1.0
    seed: int = 0
    min_tokens: int = 0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0.0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator().manual_seed(params.seed % (2**63))

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: fp32 [V], already masked for banned tokens."""
        p = self.params
        if p.greedy:
            return int(torch.argmax(logits))
        logits = logits / p.temperature
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            drop = (torch.cumsum(sorted_probs, 0) - sorted_probs) >= p.top_p
            sorted_probs[drop] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=self.generator))
