"""In-flight batching: which sequences run in the next step, and how much of each prompt.

Each step first gives every generating sequence one token, then spends the rest of the per-step token
budget on prompt chunks (chunked prefill), oldest first. Sequences join and leave between steps.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .sampling import Sampler, SamplingParams
from .stop_strings import StopStrings


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"  # the engine failed while generating it (TokenEvent.error says what)


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    # [vocab_size] float32 added to every step's logits (TensorRT-LLM's embedding_bias, OpenAI's logit_bias).
    embedding_bias: object | None = None
    is_cancelled: Callable[[], bool] = lambda: False
    return_log_probs: bool = False
    top_logprobs: int = 0  # alternatives per token (0..20), with return_log_probs
    # 1..8: the prompt is prefilled once, then its KV rows are copied; sequence i samples with seed + i.
    num_return_sequences: int = 1
    # A compiled grammar: guide.matcher(end_id=...) gives each sequence an object with fill(bitmask, row),
    # accept(token) and finished() (cpu_engine/grammar.py); end_id is the stop token it allows once complete.
    guide: object | None = None
    # A liveness probe (serving/health.py): one token in the cache's reserved row, ahead of every waiting request.
    probe: bool = False

    def __post_init__(self):
        if not 1 <= self.num_return_sequences <= 8:
            raise ValueError(f"num_return_sequences must be in [1, 8], got {self.num_return_sequences}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")


@dataclass
class Sequence:
    request: GenerationRequest
    index: int = 0  # which of the request's num_return_sequences
    slot: int = -1
    siblings: list[int] = field(default_factory=list)  # slots held for sequences 1..n-1 until the prompt is in
    prefilled: int = 0  # prompt tokens already in the KV cache
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    sampler: Sampler | None = None
    stops: StopStrings | None = None  # the stop words on text (None: matched on token ids)
    matcher: object | None = None  # the grammar's state for this sequence (request.guide)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def generating(self) -> bool:
        return self.prefilled == self.prompt_len

    @property
    def length(self) -> int:
        return self.prompt_len + len(self.output_ids)


@dataclass
class StepPlan:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]  # (sequence, chunk length)


class Scheduler:
    def __init__(self, num_slots: int, token_budget: int):
        self.num_slots = num_slots
        self.token_budget = max(token_budget, num_slots + 1)
        self.waiting: deque[Sequence] = deque()
        self.probes: deque[Sequence] = deque()  # liveness probes: they wait only for the probe row
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        (self.probes if seq.request.probe else self.waiting).append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.probes)

    def admit(self, free_slots: Callable[[], int], allocate_slot: Callable[[], int],
              allocate_probe: Callable[[], int | None]) -> list[Sequence]:
        """A probe first, in the probe row; then oldest first, each with a slot for every one of its sequences; a
        request asking for more slots than are free waits (and so do the ones behind it). Returns the admitted
        sequences."""
        admitted = []
        if self.probes and (slot := allocate_probe()) is not None:
            seq = self.probes.popleft()
            seq.slot = slot
            self.running.append(seq)
            admitted.append(seq)
        while self.waiting and free_slots() >= self.waiting[0].request.num_return_sequences:
            seq = self.waiting.popleft()
            seq.slot = allocate_slot()
            seq.siblings = [allocate_slot() for _ in range(seq.request.num_return_sequences - 1)]
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def plan(self) -> StepPlan:
        decode = [s for s in self.running if s.generating]
        budget = self.token_budget - len(decode)
        prefill = []
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.generating:
                chunk = min(budget, seq.prompt_len - seq.prefilled)
                prefill.append((seq, chunk))
                budget -= chunk
        return StepPlan(decode, prefill)

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.probes:
            self.probes.remove(seq)
