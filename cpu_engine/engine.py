"""The engine loop: admit requests, run one batched step, sample, stream tokens out, free finished slots.

``submit()`` is thread-safe and never blocks; one background thread owns the model, the cache and the
scheduler, so no locks are needed on the hot path.

A failure never stops that thread: what belongs to one sequence (its grammar matcher, its callbacks, its stop
rules) ends that sequence with ``FinishReason.ERROR``; a failed batched step (the model, sampling) ends every
sequence in it. Their slots are freed and the engine goes on with the others and with later requests.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from . import memory
from .admission import Admission
from .block_manager import BlockManager, CommitProgress, prompt_blocks
from .kv_cache import KVCache
from .model import Transformer
from .sampling import LogProbTable, Sampler, TokenCounts, sample
from .stop_strings import StopStrings
from .scheduler import FinishReason, GenerationRequest, Scheduler, Sequence, SlotPool
from .threads import on_scratch_thread
from .token_rules import accept, mask_logits


CANCEL_POLL_S = 0.02  # how stale a cancellation may be before its slot is freed
# A prompt step is never as narrow as a decode step ([B, 1]): a prompt's last rows, whatever a prefix-cache hit left
# of it, run the prompt's attention (SDPA), not the decode step's.
MIN_PROMPT_WIDTH = 2

log = logging.getLogger(__name__)


@dataclass
class TokenEvent:
    """One engine output: a new token (or None) and, on the last event of a sequence, why it finished. A request
    with num_return_sequences = n is over when its n sequences (``sequence_index`` 0..n-1) have each ended."""

    request_id: str
    token_id: int | None
    finish_reason: FinishReason | None
    num_input_tokens: int
    num_output_tokens: int  # of this sequence
    sequence_index: int = 0
    logprob: float | None = None  # of token_id, when the request asked (return_log_probs)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # (token, log-prob), best first, request.top_logprobs of them
    error: str | None = None  # with FinishReason.ERROR: what failed
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (OpenAI's cached_tokens)


@dataclass(frozen=True)
class EngineLimits:
    max_batch_size: int  # sequences decoding at once
    max_seq_len: int
    max_num_tokens: int  # per-step token budget (decode rows + prompt chunks)
    max_queue_size: int  # requests waiting for a slot before new ones are rejected
    # The paged KV cache's size, TensorRT-LLM's names: never more than max_batch_size × max_seq_len (what running
    # sequences can hold; TensorRT-LLM's memory budget caps it the same way, so occupancy can reach 1), never less
    # than one whole sequence and a block to copy (what lets the oldest sequence always proceed: scheduler.py).
    max_tokens_in_paged_kv_cache: int | None = None
    tokens_per_block: int = 32
    enable_kv_cache_reuse: bool = True

    @classmethod
    def from_build(cls, build: Mapping, max_queue_size: int, **narrowed) -> EngineLimits:
        """The limits an engine was built for (its config.json's ``build_config``, TensorRT-LLM's schema), with the
        server's queue bound and whatever a deployment sets apart from the build (``narrowed``)."""
        built = {"max_batch_size": build["max_batch_size"], "max_seq_len": build["max_seq_len"],
                 "max_num_tokens": build["max_num_tokens"],
                 # A TensorRT-LLM engine's is fixed at build (trtllm-build --tokens_per_block); the CPU engine's config
                 # has none and takes the same default.
                 "tokens_per_block": build.get("plugin_config", {}).get("tokens_per_block", 32)}
        return cls(**{**built, "max_queue_size": max_queue_size, **narrowed})

    @property
    def kv_cache_blocks(self) -> int:
        most = self.max_batch_size * self.max_seq_len
        tokens = min(self.max_tokens_in_paged_kv_cache or most, most)
        return max(-(-tokens // self.tokens_per_block), -(-self.max_seq_len // self.tokens_per_block) + 1) + 1


@dataclass
class PrefixCacheStats:
    """Prompts since start: tokens taken from the cache (hit) or computed (missed), and their blocks as
    TensorRT-LLM counts them (a prompt's last, partial block is a missed one); engine thread writes."""

    hit_tokens: int = 0
    missed_tokens: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0

    def add(self, prompt_len: int, cached: int, block_size: int) -> None:
        total, reused = prompt_blocks(prompt_len, cached, block_size)
        self.hit_tokens += cached
        self.missed_tokens += prompt_len - cached
        self.reused_blocks += reused
        self.missed_blocks += total - reused


class LLMEngine:
    def __init__(self, model: Transformer, limits: EngineLimits, on_event: Callable[[TokenEvent], None],
                 token_bytes: list[bytes] | None = None, dtype: torch.dtype = torch.float32,
                 on_queue_full: Callable[[bool], None] | None = None):
        self.model = model.eval()
        self.limits = limits
        # Zeroing the cache and the token counts are parallel ops: off the caller's thread (threads.py; the counts
        # zeroed here cost batch-1 int8 decode 40 %, tests/test_engine.py checks that no pool is left).
        self.cache = on_scratch_thread(KVCache, model.args, limits.kv_cache_blocks, limits.tokens_per_block, dtype)
        self.counts = on_scratch_thread(TokenCounts, limits.max_batch_size + 1, model.args.vocab_size)  # + probe row
        self.blocks = BlockManager(limits.kv_cache_blocks, limits.tokens_per_block, self.cache.probe_blocks,
                                   reuse=limits.enable_kv_cache_reuse)
        self.slots = SlotPool(limits.max_batch_size)
        self.scheduler = Scheduler(limits.max_batch_size, limits.max_num_tokens, self.blocks)
        self.prefix_cache = PrefixCacheStats()
        self.on_event = on_event
        self.token_bytes = token_bytes
        self._inbox: queue.SimpleQueue[Sequence | None] = queue.SimpleQueue()
        self._admission = Admission(limits.max_queue_size, on_queue_full)
        self._cancel_all = False  # set when a shutdown drain times out
        self._next_cancel_check = 0.0
        self._kv_used = 0.0  # share of the KV blocks held by running sequences (engine thread writes)
        self._thread = threading.Thread(target=self._run, name="llm-engine", daemon=True)

    # ---- public API (any thread) -------------------------------------------------------------------
    def start(self) -> "LLMEngine":
        self._thread.start()
        return self

    def submit(self, request: GenerationRequest) -> None:
        if request.num_return_sequences > self.limits.max_batch_size:  # it would wait for slots forever
            raise ValueError(f"num_return_sequences {request.num_return_sequences} exceeds the engine's "
                             f"max_batch_size {self.limits.max_batch_size}")
        if request.probe:  # outside the bounded queue: a full queue is exactly when liveness must still pass
            self._admission.admit_probe()
        else:
            self._admission.admit()
        stops = StopStrings.of(self.token_bytes, request.stop_words) if self.token_bytes is not None else None
        self._inbox.put(Sequence(request, sampler=Sampler(request.sampling), stops=stops))

    @property
    def queued(self) -> int:
        return self._admission.waiting

    @property
    def active(self) -> int:
        return len(self.scheduler.running)

    @property
    def kv_occupancy(self) -> float:
        return self._kv_used

    @property
    def kv_size(self) -> tuple[int, int]:
        """(capacity, cached) token positions: the pool, and the cached prefixes no running sequence holds."""
        stats = self.blocks.stats()
        return stats.total * self.blocks.block_size, stats.cached * self.blocks.block_size

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting work, let in-flight requests finish (up to ``timeout``), then stop the loop."""
        self._admission.stop()
        self._inbox.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():  # drain timed out: cancel the rest so every client gets an answer
            self._cancel_all = True
            self._thread.join()

    # ---- engine thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        worked = False
        with torch.inference_mode():
            while True:
                idle = not self.scheduler.has_work() and not self._admission.stopping
                if idle and worked:  # the heap pages the last burst freed go back before the wait (memory.py)
                    memory.return_freed_memory()
                worked = not idle
                self._drain_inbox(block=idle)
                if self.scheduler.has_work():
                    try:
                        self._step()
                    except Exception as exc:  # noqa: BLE001 - the model or the batch's sampling failed
                        # Every sequence in the step ends. A step runs only running sequences, so a failure
                        # that repeats every step (a broken model) empties the batch instead of spinning.
                        self._fail(list(self.scheduler.running), exc)
                elif self._admission.stopping:
                    return

    def _drain_inbox(self, block: bool) -> None:
        """Move submitted sequences to the scheduler; waits for the first one when idle."""
        while True:
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if item is not None:  # None only wakes the loop (shutdown)
                self.scheduler.add(item)

    def _step(self) -> None:
        sched = self.scheduler
        now = time.monotonic()
        if self._cancel_all or now >= self._next_cancel_check:
            # is_cancelled() may cost an IPC round trip (Triton), so it is polled, not called every step.
            self._next_cancel_check = now + CANCEL_POLL_S
            self._poll_cancellations()
        admitted = sched.admit(lambda: self.slots.free, self.slots.allocate, self.slots.allocate_probe)
        self._admission.left_queue(sum(not s.request.probe for s in admitted), sum(s.request.probe for s in admitted))
        for seq in admitted:
            self._start(seq)
        plan = sched.plan()
        if plan.copies:
            self.cache.copy_blocks(plan.copies)
        seqs, logits = [], []
        if plan.decode:
            decode = plan.decode
            tokens = torch.tensor([[s.output_ids[-1]] for s in decode])
            positions = torch.tensor([[s.length - 1] for s in decode])
            compiled = self.model.compiled_decode
            forward = compiled if compiled is not None and len(decode) <= compiled.max_rows else self.model
            logits.append(forward(tokens, positions, block_tables(decode), self.cache))
            for seq in decode:
                self._commit(seq, seq.length)
            seqs += decode
        if plan.prefill:
            ready, rows = self._prefill(plan.prefill)
            seqs += ready
            logits += rows
        if seqs:
            # Changed in place: a decode-only step's logits are used as they are; prefill rows (a request's last
            # prompt row, expanded to its n sequences) become rows of their own.
            self._accept_batch(seqs, torch.cat(logits) if plan.prefill else logits[0])
        self._count_kv()

    def _commit(self, seq: Sequence, computed: int) -> None:
        """Offer the blocks ``computed`` positions filled to the prefix cache (only when one just filled)."""
        if computed // self.blocks.block_size > seq.progress.blocks and not seq.request.probe:
            ids = seq.prefill_ids if not seq.generating else seq.request.prompt_ids + seq.output_ids
            self.blocks.commit(seq.blocks, ids, seq.progress, computed)

    def _poll_cancellations(self) -> None:
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting) + list(self.scheduler.probes):
            try:
                cancelled = self._cancel_all or seq.request.is_cancelled()
            except Exception as exc:  # noqa: BLE001 - the request's own callback: it alone ends (even if waiting)
                self._fail([seq], exc)
                continue
            if cancelled:
                self._finish(seq, FinishReason.CANCELLED)

    def _count_kv(self) -> None:
        stats = self.blocks.stats()
        self._kv_used = stats.used / stats.total

    def _start(self, seq: Sequence) -> None:
        """A sequence just got its slot(s): the penalties' prompt counts (TensorRT-LLM counts the prompt), the
        grammar's state."""
        req = seq.request
        if req.sampling.penalised:
            self.counts.start(seq.slot, req.prompt_ids)
        if req.guide is not None:
            try:
                seq.matcher = req.guide.matcher(end_id=req.end_id)
            except Exception as exc:  # noqa: BLE001 - this request's grammar: it alone ends, before the step
                self._fail([seq], exc)

    def _spawn(self, seq: Sequence) -> list[Sequence]:
        """Once the prompt is in the cache: sequences 1..n-1 share its KV blocks (a shared block is copied before one
        of them writes into it: scheduler.py), get its counts in the rows held for them, and start decoding from
        the same last-prompt logits. Returns all n."""
        req = seq.request
        if not req.probe:
            self.prefix_cache.add(seq.prompt_len, seq.cached_tokens, self.blocks.block_size)
        children = [Sequence(req, index=i, slot=slot, prefilled=seq.prefilled, sampler=Sampler(req.sampling, i),
                             stops=seq.stops and seq.stops.fresh(), blocks=self.blocks.share(seq.blocks),
                             progress=CommitProgress(seq.progress.blocks, seq.progress.parent),
                             cached_tokens=seq.cached_tokens)
                    for i, slot in enumerate(seq.siblings, start=1)]
        if children:
            for child in children:
                if req.sampling.penalised:
                    self.counts.copy(seq.slot, child.slot)
                if req.guide is not None:
                    child.matcher = req.guide.matcher(end_id=req.end_id)
            seq.siblings = []
            self.scheduler.running.extend(children)
        return [seq, *children]

    def _prefill(self, chunks: list[tuple[Sequence, int]]) -> tuple[list[Sequence], list[torch.Tensor]]:
        """This step's prompt chunks in one [B, T] forward (16 prompts arriving together: a few forwards, not 16).
        Shorter chunks are padded at the end (to ``MIN_PROMPT_WIDTH`` at least); the padding's keys go where the
        chunk's next positions will overwrite them or to block 0 (model.Step), which no sequence reads. Returns the
        sequences whose prompt is now complete (all n of each request) and their logits rows."""
        width = max(MIN_PROMPT_WIDTH, *(n for _, n in chunks))
        tokens = torch.tensor([s.prefill_ids[s.prefilled:s.prefilled + n] + [0] * (width - n) for s, n in chunks])
        positions = torch.tensor([[s.prefilled] for s, _ in chunks]) + torch.arange(width)[None]
        logits = self.model(tokens, positions, block_tables([s for s, _ in chunks]), self.cache,
                            last=torch.tensor([n - 1 for _, n in chunks]))
        ready, rows = [], []
        for (seq, n), row in zip(chunks, logits):
            seq.prefilled += n
            self._commit(seq, seq.prefilled)
            if seq.replay is not None and seq.prefilled == len(seq.replay):
                # Recomputed after a preemption: it decodes its last token next step, as before it was preempted.
                seq.replay, seq.prefilled = None, seq.prompt_len
            elif seq.generating:
                family = self._spawn(seq)
                ready += family
                rows.append(row.expand(len(family), -1))
        return ready, rows

    def _accept_batch(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Choose one token for every row of ``logits`` [B, V] at once, then apply each sequence's stop rules
        (token_rules.py)."""
        asked = [i for i, s in enumerate(seqs) if s.request.return_log_probs]
        table = LogProbTable(logits, asked, [seqs[i].request.top_logprobs for i in asked]) if asked else None
        failed = mask_logits(seqs, logits)
        slots = [s.slot for s in seqs]
        tokens = sample(logits, [s.sampler for s in seqs], slots, self.counts)
        penalised = [i for i, s in enumerate(seqs) if s.request.sampling.penalised]
        if penalised:
            self.counts.add(torch.tensor([slots[i] for i in penalised]), tokens[penalised])
        logprobs = table.pick(tokens) if table else None
        where = {row: j for j, row in enumerate(asked)}
        for i, (seq, token) in enumerate(zip(seqs, tokens.tolist())):
            if i in failed:
                self._fail([seq], failed[i])
                continue
            j = where.get(i)
            try:
                if j is None:
                    self._accept(seq, token)
                else:
                    self._accept(seq, token, logprobs.chosen[j], logprobs.top[j])
            except Exception as exc:  # noqa: BLE001 - its grammar, stop rules or event: it alone ends
                self._fail([seq], exc)

    def _accept(self, seq: Sequence, token: int, logprob: float | None = None,
                top: tuple[tuple[int, float], ...] = ()) -> None:
        kept, reason = accept(seq, token, self.limits.max_seq_len, self.token_bytes)
        if not kept:
            self._finish(seq, reason)
            return
        if reason is not None:
            self._release(seq)  # before the event, so whoever reads the gauges on it sees the slot free
        self._emit(seq, token, reason, logprob, top)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None) -> None:
        # Sequences 1..n-1 exist once the prompt is in (_spawn); ended before that, they end with sequence 0.
        unborn = seq.index == 0 and (seq.slot < 0 or bool(seq.siblings))
        if seq.slot < 0:  # still waiting for a slot
            self._admission.left_queue(probes=int(seq.request.probe), count=int(not seq.request.probe))
        self._release(seq)
        self._emit(seq, None, reason, error=error)
        if unborn:
            for i in range(1, seq.request.num_return_sequences):
                self._emit(Sequence(seq.request, index=i), None, reason, error=error)

    def _fail(self, seqs: list[Sequence], exc: Exception) -> None:
        """End ``seqs`` with ERROR after ``exc`` (logged once, with its traceback); their slots are freed."""
        ids = ", ".join(sorted({s.request.request_id for s in seqs}))
        log.error("engine: ending %d sequence(s) with an error (requests: %s)", len(seqs), ids or "none",
                  exc_info=exc)
        error = f"{type(exc).__name__}: {exc}"
        for seq in seqs:
            if seq.finish_reason is not None:  # its last event went out before the failure
                continue
            try:
                self._finish(seq, FinishReason.ERROR, error)
            except Exception:  # noqa: BLE001 - on_event failing too: the slot is free, the loop goes on
                log.exception("engine: could not report the failure of request %s", seq.request.request_id)

    def _release(self, seq: Sequence) -> None:
        self.scheduler.remove(seq)
        self.blocks.release(seq.blocks)
        if seq.slot >= 0:
            self.slots.release(seq.slot)
            seq.slot = -1
        for slot in seq.siblings:
            self.slots.release(slot)
        seq.siblings = []
        # Counted afresh (at most max_batch_size rows), so the gauge read on this sequence's last event is exact.
        self._count_kv()

    def _emit(self, seq: Sequence, token: int | None, reason: FinishReason | None, logprob: float | None = None,
              top: tuple[tuple[int, float], ...] = (), error: str | None = None) -> None:
        seq.finish_reason = reason
        self.on_event(TokenEvent(seq.request.request_id, token, reason, seq.prompt_len, len(seq.output_ids),
                                 seq.index, logprob, top, error, seq.cached_tokens or 0))


def block_tables(seqs: list[Sequence]) -> torch.Tensor:
    """[B, N] the sequences' block tables, padded with block 0."""
    width = max(len(s.blocks) for s in seqs)
    return torch.tensor([s.blocks + [0] * (width - len(s.blocks)) for s in seqs])
