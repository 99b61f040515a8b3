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


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"


@dataclass
class GenerationRequest:
    request_id: str
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    end_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    is_cancelled: Callable[[], bool] = lambda: False


@dataclass
class Sequence:
    request: GenerationRequest
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the KV cache
    output_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    sampler: Sampler | None = None
    stop_bytes: list[bytes] = field(default_factory=list)  # stop words as text bytes
    tail: bytes = b""  # last bytes of the output, for stop strings that span tokens

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
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self, allocate_slot: Callable[[], int]) -> None:
        while self.waiting and len(self.running) < self.num_slots:
            seq = self.waiting.popleft()
            seq.slot = allocate_slot()
            self.running.append(seq)

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
