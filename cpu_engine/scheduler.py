"""In-flight batching: which sequences run in the next step, how much of each prompt, and in which KV blocks.

Each step first gives every generating sequence one token, then spends the rest of the per-step token
budget on prompt chunks (chunked prefill), oldest first. Sequences join and leave between steps.

KV blocks are taken as positions need them (block_manager.py). A prompt first takes the longest prefix another
request left in the cache and prefills only the rest. When a generating sequence needs a block and none is left,
the youngest running sequence is preempted: its blocks go back and it is recomputed later from its prompt and
the tokens it already streamed (vLLM's recompute preemption), so the oldest always proceeds: the pool holds at least
one whole sequence, and the engine can never wedge on memory.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .block_manager import BlockManager, CommitProgress
from .sampling import Sampler, SamplingParams
from .stop_strings import StopStrings

# The engine's own bounds on a request; the serving edge (serving/request_params.py) refuses the same with a message.
MAX_SEQUENCES = 8  # num_return_sequences: OpenAI's n
MAX_TOP_LOGPROBS = 20  # OpenAI's top_logprobs limit


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
    top_logprobs: int = 0  # alternatives per token (0..MAX_TOP_LOGPROBS), with return_log_probs
    # 1..MAX_SEQUENCES: the prompt is prefilled once, then its KV blocks are shared; sequence i samples with seed + i.
    num_return_sequences: int = 1
    # A compiled grammar: guide.matcher(end_id=...) gives each sequence an object with fill(bitmask, row),
    # accept(token) and finished() (cpu_engine/grammar.py); end_id is the stop token it allows once complete.
    guide: object | None = None
    # A liveness probe (serving/health.py): one token in the cache's reserved row, ahead of every waiting request.
    probe: bool = False

    def __post_init__(self):
        if not 1 <= self.num_return_sequences <= MAX_SEQUENCES:
            raise ValueError(f"num_return_sequences must be in [1, {MAX_SEQUENCES}], got {self.num_return_sequences}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")


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
    blocks: list[int] = field(default_factory=list)  # KV block table: position p is in blocks[p // block_size]
    progress: CommitProgress = field(default_factory=CommitProgress)
    cached_tokens: int | None = None  # prompt tokens whose KV came from the prefix cache (set when it first runs)
    replay: list[int] | None = None  # after a preemption: prompt + output but the last, whose KV is recomputed

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def prefill_ids(self) -> list[int]:
        """What the prefill phase computes: the prompt, or after a preemption everything before the last token."""
        return self.request.prompt_ids if self.replay is None else self.replay

    @property
    def generating(self) -> bool:
        return self.replay is None and self.prefilled == self.prompt_len

    @property
    def length(self) -> int:
        return self.prompt_len + len(self.output_ids)


@dataclass
class StepPlan:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]  # (sequence, chunk length)
    copies: list[tuple[int, int]] = field(default_factory=list)  # (shared block, its copy) to fill before the step


class Scheduler:
    def __init__(self, num_slots: int, token_budget: int, blocks: BlockManager):
        self.num_slots = num_slots
        self.token_budget = max(token_budget, num_slots + 1)
        self.blocks = blocks
        self.preemptions = 0
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
        copies = []
        decode = [s for s in list(self.running) if s.generating and self._room_to_decode(s, copies)]
        budget = self.token_budget - len(decode)
        prefill = []
        for seq in self.running:
            if budget <= 0:
                break
            if seq.generating:
                continue
            if seq.prefilled == 0 and not seq.blocks:
                self._take_cached_prefix(seq)
            probe = seq.request.probe
            room = (len(seq.blocks) + self.blocks.available(probe)) * self.blocks.block_size - seq.prefilled
            chunk = min(budget, len(seq.prefill_ids) - seq.prefilled, room)
            if chunk <= 0:  # the pool is full: younger prompts wait too, oldest first
                break
            self.blocks.grow(seq.blocks, seq.prefilled + chunk, probe)
            prefill.append((seq, chunk))
            budget -= chunk
        return StepPlan(decode, prefill, copies)

    def _take_cached_prefix(self, seq: Sequence) -> None:
        """Start a prefill after the longest cached prefix of whole blocks; the last token is always computed (its
        logits pick the first output token)."""
        ids = seq.prefill_ids
        seq.blocks = [] if seq.request.probe else self.blocks.take_prefix(ids, len(ids) - 1, seq.progress)
        seq.prefilled = len(seq.blocks) * self.blocks.block_size
        if seq.cached_tokens is None:
            seq.cached_tokens = seq.prefilled

    def _room_to_decode(self, seq: Sequence, copies: list[tuple[int, int]]) -> bool:
        """A block (of its own) for the position ``seq`` writes next, preempting younger sequences if the pool is
        short; False when ``seq`` itself had to be preempted."""
        if not seq.generating:  # preempted a moment ago for an older sequence
            return False
        position, probe, bs = seq.length - 1, seq.request.probe, self.blocks.block_size
        need = int(position // bs >= len(seq.blocks)) + int(self.blocks.needs_copy(seq.blocks, position))
        while need > self.blocks.available(probe):
            younger = self.running[self.running.index(seq) + 1:]  # older ones may already hold this step's block
            victim = next((s for s in reversed(younger) if s.blocks and not s.request.probe), None)
            self.preempt(victim or seq)
            if victim is None:
                return False
        if (pair := self.blocks.writable(seq.blocks, position)) is not None:
            copies.append(pair)
        self.blocks.grow(seq.blocks, seq.length, probe)
        return True

    def preempt(self, seq: Sequence) -> None:
        """Give back ``seq``'s blocks; it recomputes its KV when blocks are free again (its streamed tokens stay)."""
        self.blocks.release(seq.blocks)
        seq.progress = CommitProgress()
        seq.prefilled = 0
        if seq.output_ids:
            seq.replay = seq.request.prompt_ids + seq.output_ids[:-1]
        self.preemptions += 1

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.probes:
            self.probes.remove(seq)


class SlotPool:
    """Row numbers for the sequences decoding at once (the penalties' token counts are kept per row); one more row
    is the liveness probe's, so a probe runs even when every row is taken."""

    def __init__(self, num_slots: int):
        self._free = list(range(num_slots - 1, -1, -1))
        self.probe_slot = num_slots
        self._probe_free = True

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        return self._free.pop()

    def allocate_probe(self) -> int | None:
        """The probe's row, or None while another probe holds it."""
        if not self._probe_free:
            return None
        self._probe_free = False
        return self.probe_slot

    def release(self, slot: int) -> None:
        if slot == self.probe_slot:
            self._probe_free = True
        else:
            self._free.append(slot)
