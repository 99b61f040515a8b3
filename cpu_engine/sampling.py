"""Token choice for a whole batch at once: penalties, temperature, top-k / top-p / min_p, seeded sampling, log-probs.

One [B, V] tensor path per step; per-row settings are [B] tensors. Penalties and their order follow TensorRT-LLM's
``batchApplyPenalty`` (cpp/tensorrt_llm/kernels/penaltyKernels.cu, NVIDIA/TensorRT-LLM commit 249d93d5, read
2026-12-03; the executor's SamplingConfig documents the same defaults), because the GPU layout hands these names
straight to tensorrt_llm and both layouts must agree:

- the occurrence count of a token covers the prompt *and* the generated tokens (the kernel counts every prompt
  token at the context step, then adds each generated token);
- temperature first (``logit / temperature``; the kernel's ``+ 1e-6`` is left out), then, for a token seen at
  least once: repetition (``logit < 0 ? logit * p : logit / p``), presence (``- p`` once), frequency
  (``- p * count``).
- min_p (not a tensorrt_llm input, ours): after temperature, drop tokens whose probability is below
  ``min_p * max probability`` (vLLM / llama.cpp).
"""

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
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.top_k == 1 or self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


class Sampler:
    """One sequence's settings and random stream. Sequence i of a request with n > 1 draws from seed + i, so each
    sequence is reproducible on its own and the n sequences differ."""

    def __init__(self, params: SamplingParams, sequence_index: int = 0):
        self.params = params
        self.generator = None
        if not params.greedy:
            self.generator = torch.Generator().manual_seed((params.seed + sequence_index) % (2**63))


class TokenCounts:
    """How often each token occurs in each slot's prompt + output ([slots, V] int32), for the penalties.
    Only penalised sequences keep their row up to date; the others never read it."""

    def __init__(self, num_slots: int, vocab_size: int):
        self.counts = torch.zeros(num_slots, vocab_size, dtype=torch.int32)

    def start(self, slot: int, prompt_ids: list[int]) -> None:
        row = self.counts[slot]
        row.zero_()
        row.scatter_add_(0, torch.tensor(prompt_ids), torch.ones(len(prompt_ids), dtype=torch.int32))

    def copy(self, src: int, dst: int) -> None:
        self.counts[dst] = self.counts[src]

    def add(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        self.counts.index_put_((slots, tokens), torch.ones(len(slots), dtype=torch.int32), accumulate=True)

    def seen(self, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(i, token, count) for every token seen in slot ``slots[i]``: one scan of the table, no [B, V] copy."""
        index_of = torch.full((len(self.counts),), -1)
        index_of[slots] = torch.arange(len(slots))
        slot_ids, tokens = self.counts.nonzero(as_tuple=True)
        rows = index_of[slot_ids]
        keep = rows >= 0
        rows, tokens = rows[keep], tokens[keep]
        return rows, tokens, self.counts[slot_ids[keep], tokens]


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor,
                    repetition: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor) -> None:
    """In place on temperature-scaled logits [B, V], at the seen (row, token) pairs only (their counts > 0);
    the penalties are [B]."""
    x = logits[rows, tokens]
    rp = repetition[rows]
    logits[rows, tokens] = torch.where(x < 0, x * rp, x / rp) - presence[rows] - frequency[rows] * counts


def filtered_probs(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
                   ) -> torch.Tensor:
    """Temperature-scaled logits [B, V] → probabilities after top-k, then min_p, then top-p ([B] each). Every step
    is skipped for the rows (and batches) that do not use it."""
    vocab = logits.shape[-1]
    cut = ((top_k > 0) & (top_k < vocab)).nonzero().flatten()
    if len(cut):
        k = top_k[cut]
        kth = torch.topk(logits[cut], int(k.max())).values.gather(1, (k - 1)[:, None])
        logits[cut] = logits[cut].masked_fill(logits[cut] < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    cut = (min_p > 0).nonzero().flatten()
    if len(cut):
        p = probs[cut]
        p = p.masked_fill(p < min_p[cut, None] * p.max(-1, keepdim=True).values, 0.0)
        probs[cut] = p / p.sum(-1, keepdim=True)
    cut = (top_p < 1.0).nonzero().flatten()
    if len(cut):
        p, nucleus = probs[cut], top_p[cut]
        # Sorting the whole vocabulary costs more than the model's step at 16 rows × 49k. The nucleus lies among
        # the tokens above a floor that already holds top_p of the mass, so only those are ranked: the floor
        # starts at the row's top probability and drops tenfold until it holds enough (0 after 8 drops: all).
        floor = p.max(-1, keepdim=True).values
        for _ in range(8):
            short = (p * (p >= floor)).sum(-1) < nucleus
            if not short.any():
                break
            floor[short] /= 10
        else:
            floor[short] = 0.0
        # Rank all rows' candidates in one sort: key 2·row − p keeps rows apart, most probable first within each.
        rows, tokens = (p >= floor).nonzero(as_tuple=True)
        mass = p[rows, tokens].double()
        order = torch.argsort(2 * rows - mass)
        rows, tokens, mass = rows[order], tokens[order], mass[order]
        above = torch.cumsum(mass, 0) - mass  # mass ranked above each candidate, across rows so far
        sizes = torch.bincount(rows, minlength=len(p))
        above -= above[torch.cumsum(sizes, 0) - sizes][rows]  # ... minus the mass of the rows before
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        kept = above < nucleus[rows]
        probs[cut] = torch.zeros_like(p).index_put_((rows[kept], tokens[kept]), mass[kept].float())
    return probs


def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One token per row by inverse CDF, each row's uniform from its own generator: a row's draw depends on its
    seed and its distribution only, never on what else is in the batch."""
    u = torch.cat([torch.rand(1, generator=g) for g in generators])
    cdf = torch.cumsum(probs, dim=-1)
    # right=True: the first token whose cumulative mass exceeds u, so a zero-probability token is never chosen.
    picked = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).flatten()
    return picked.clamp_(max=probs.shape[-1] - 1)


def sample(logits: torch.Tensor, samplers: list[Sampler], slots: list[int], counts: TokenCounts) -> torch.Tensor:
    """logits: fp32 [B, V] of the sequences in ``slots``, already masked (bans, grammar); changed in place.
    Returns the chosen tokens [B] (int64)."""
    params = [s.params for s in samplers]
    # Temperature 0 means greedy on unscaled logits (TensorRT-LLM's 1 / (0 + 1e-6) would make the penalties vanish).
    temperature = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params])
    if bool((temperature != 1.0).any()):
        logits.div_(temperature[:, None])
    penalised = [i for i, p in enumerate(params) if p.penalised]
    if penalised:
        rows, tokens, seen = counts.seen([slots[i] for i in penalised])
        apply_penalties(logits, torch.tensor(penalised)[rows], tokens, seen,
                        torch.tensor([p.repetition_penalty for p in params]),
                        torch.tensor([p.presence_penalty for p in params]),
                        torch.tensor([p.frequency_penalty for p in params]))
    tokens = torch.argmax(logits, dim=-1)
    drawn = [i for i, p in enumerate(params) if not p.greedy]
    if drawn:
        picked = [params[i] for i in drawn]
        probs = filtered_probs(logits[drawn], torch.tensor([p.top_k for p in picked]),
                               torch.tensor([p.top_p for p in picked]), torch.tensor([p.min_p for p in picked]))
        tokens[drawn] = draw(probs, [samplers[i].generator for i in drawn])
    return tokens


@dataclass(frozen=True)
class LogProbs:
    """For each asking row: the emitted token's log-prob and the top alternatives (ids, log-probs), best first."""

    chosen: list[float]
    top: list[tuple[tuple[int, float], ...]]


class LogProbTable:
    """log_softmax of the raw model logits (before bans, grammar, penalties and temperature) in fp32, for the rows
    that asked; taken before sampling changes the logits in place."""

    def __init__(self, raw_logits: torch.Tensor, rows: list[int], top: list[int]):
        self.rows = rows
        self.top = top
        self.logprobs = torch.log_softmax(raw_logits[rows].float(), dim=-1)

    def pick(self, tokens: torch.Tensor) -> LogProbs:
        chosen = self.logprobs.gather(1, tokens[self.rows][:, None]).flatten().tolist()
        k = max(self.top)
        if k == 0:
            return LogProbs(chosen, [()] * len(self.rows))
        values, ids = torch.topk(self.logprobs, k, dim=-1)
        top = [tuple(zip(i[:n], v[:n])) for i, v, n in zip(ids.tolist(), values.tolist(), self.top)]
        return LogProbs(chosen, top)
