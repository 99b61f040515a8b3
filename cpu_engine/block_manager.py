"""Paged KV-cache bookkeeping: which block holds what, who holds it, and which blocks a new prompt can reuse.

Blocks are ``block_size`` token positions (kv_cache.py holds the tensors; this file never touches them). A block
is handed out when a sequence's next position needs it, not up front, so KV memory is bounded by the pool, not by
slots × max_seq_len (TensorRT-LLM's paged KV cache, vLLM's block manager).

Prefix reuse (TensorRT-LLM's ``enable_kv_cache_reuse``): a block whose every position holds KV is *committed*
under a key made of its tokens and the exact identity of the block before it, (parent id, parent generation,
tokens). A later context starting with the same tokens takes those blocks instead of recomputing them. The key
compares tokens, not a hash of them, and a block's generation changes each time it is recycled, so a match is
exact by construction: a request can only ever read KV computed for the very same prefix. A committed block
nobody holds stays cached, least recently released first to go when a fresh block is needed; a held block is
never evicted. Blocks shared by several sequences (a reused prefix, the ``n`` sequences of one prompt) are read
only: a sequence about to write into a shared block gets its own copy first (``writable``).

Block 0 is never handed out: padded rows read from it and write their padding into it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

SINK = 0
_ROOT = (SINK, 0)  # the parent of a context's first block


@dataclass
class CommitProgress:
    """How far a sequence's blocks are committed, and the identity the next one chains to."""

    blocks: int = 0
    parent: tuple[int, int] = _ROOT


def prompt_blocks(prompt_len: int, cached_tokens: int, block_size: int) -> tuple[int, int]:
    """(blocks a prompt's KV takes, of which reused from the prefix cache), as TensorRT-LLM counts them: the last,
    partial block is a newly allocated (missed) one."""
    return -(-prompt_len // block_size), cached_tokens // block_size


@dataclass
class BlockStats:
    total: int  # blocks sequences can use (the probe reserve and the sink excluded)
    used: int  # held by at least one sequence
    cached: int  # committed and held by nobody: reusable, evicted when space is needed
    free: int  # never used or evicted


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, probe_blocks: int = 0, reuse: bool = True):
        if num_blocks < 2:
            raise ValueError(f"a paged KV cache needs at least 2 blocks, got {num_blocks}")
        self.block_size = block_size
        self.reuse = reuse
        total = num_blocks + probe_blocks
        self._refs = [0] * total
        self._generation = [0] * total
        self._key: list[tuple | None] = [None] * total
        self._committed: dict[tuple, int] = {}
        self._cached: OrderedDict[int, None] = OrderedDict()  # committed, refs 0; oldest release first
        # A heap (lowest id first) with a set beside it: a block taken out of turn (_fresh's ``after``) leaves its
        # heap entry behind, skipped when popped.
        self._free = list(range(1, num_blocks))
        self._free_set = set(self._free)
        self._probe_free = list(range(num_blocks, total))
        self._probe_ids = frozenset(self._probe_free)
        self.num_blocks = num_blocks - 1

    # ---- capacity ----------------------------------------------------------------------------------
    def available(self, probe: bool = False) -> int:
        """Blocks a sequence could get now (free, or cached and evictable)."""
        return len(self._free_set) + len(self._cached) + (len(self._probe_free) if probe else 0)

    def stats(self) -> BlockStats:
        free = len(self._free_set)
        return BlockStats(self.num_blocks, self.num_blocks - free - len(self._cached), len(self._cached), free)

    # ---- a sequence's blocks -----------------------------------------------------------------------
    def take_prefix(self, tokens: list[int], limit: int, progress: CommitProgress) -> list[int]:
        """The committed blocks holding ``tokens``' longest cached prefix of whole blocks (at most ``limit``
        tokens), now held by the caller; ``progress`` starts after them."""
        blocks, bs = [], self.block_size
        for start in range(0, limit - bs + 1, bs) if self.reuse else ():
            block = self._committed.get((*progress.parent, tuple(tokens[start:start + bs])))
            if block is None:
                break
            self._hold(block)
            blocks.append(block)
            progress.parent = (block, self._generation[block])
        progress.blocks = len(blocks)
        return blocks

    def grow(self, blocks: list[int], length: int, probe: bool = False) -> bool:
        """Append blocks until ``blocks`` covers ``length`` positions; False (nothing taken) when the pool is short."""
        need = -(-length // self.block_size) - len(blocks)
        if need > self.available(probe):
            return False
        for _ in range(need):
            blocks.append(self._fresh(probe, blocks[-1] if blocks else None))
        return True

    def writable(self, blocks: list[int], position: int) -> tuple[int, int] | None:
        """Make the block holding ``position`` the sequence's own before it writes there: a shared block is
        replaced by a fresh one. Returns (source, copy) for the caller to copy the KV, or None when no copy is
        needed. Call ``available()`` first: this takes one block."""
        index = position // self.block_size
        block = blocks[index] if index < len(blocks) else None
        if block is None or self._refs[block] == 1:
            return None
        copy = self._fresh(block in self._probe_ids)
        self.release([block])
        blocks[index] = copy
        return block, copy

    def needs_copy(self, blocks: list[int], position: int) -> bool:
        index = position // self.block_size
        return index < len(blocks) and self._refs[blocks[index]] > 1

    def commit(self, blocks: list[int], tokens: list[int], progress: CommitProgress, computed: int) -> None:
        """Commit the blocks that ``computed`` positions now fill, from where ``progress`` stopped (``tokens``: the
        context's tokens from its start)."""
        full = computed // self.block_size
        if not self.reuse:
            progress.blocks = max(progress.blocks, full)
            return
        bs = self.block_size
        for i in range(progress.blocks, full):
            block = blocks[i]
            key = (*progress.parent, tuple(tokens[i * bs:(i + 1) * bs]))
            owner = self._committed.setdefault(key, block) if self._key[block] is None else block
            if owner == block:
                self._key[block] = key
            # A block computed beside an identical committed one stays private; what follows chains to the owner.
            progress.parent = (owner, self._generation[owner])
        progress.blocks = max(progress.blocks, full)

    def share(self, blocks: list[int]) -> list[int]:
        """Another holder of ``blocks`` (the n sequences of one prompt)."""
        for block in blocks:
            self._refs[block] += 1
        return list(blocks)

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block]:
                continue
            if block in self._probe_ids:
                self._probe_free.append(block)
            elif self._key[block] is not None:
                self._cached[block] = None
            else:
                heapq.heappush(self._free, block)
                self._free_set.add(block)
        blocks.clear()

    # ---- internals ---------------------------------------------------------------------------------
    def _hold(self, block: int) -> None:
        if self._refs[block] == 0:
            del self._cached[block]
        self._refs[block] += 1

    def _fresh(self, probe: bool = False, after: int | None = None) -> int:
        """A block nobody holds: the one right after ``after`` if it is free (a row whose blocks are adjacent is read
        as a view where attention runs in ATen ops: model.Step), else the lowest free one, else the least recently
        released cached one. A cached block is never evicted for adjacency while a free one is left: that threw away
        other prompts' prefixes (16 prompts sent twice: the second burst missed the cache in about half the runs)."""
        nxt = None if after is None or probe else after + 1
        if probe and self._probe_free:
            block = self._probe_free.pop()
        elif nxt in self._free_set:
            block = nxt
            self._free_set.discard(block)
            if len(self._free) > 2 * len(self._free_set) + 64:  # too many stale heap entries: rebuild
                self._free = sorted(self._free_set)
        elif self._free_set:
            block = heapq.heappop(self._free)
            while block not in self._free_set:  # taken out of turn earlier
                block = heapq.heappop(self._free)
            self._free_set.discard(block)
        else:
            block = self._evict(next(iter(self._cached)))
        self._generation[block] += 1
        self._refs[block] = 1
        return block

    def _evict(self, block: int) -> int:
        del self._cached[block]
        del self._committed[self._key[block]]
        self._key[block] = None
        return block
