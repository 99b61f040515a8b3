"""The paged KV cache's bookkeeping alone (cpu_engine/block_manager.py): no model, no tensors."""

from __future__ import annotations

import random

from cpu_engine.block_manager import SINK, BlockManager, CommitProgress

BS = 4


def filled(manager: BlockManager, tokens: list[int]) -> tuple[list[int], CommitProgress]:
    """A sequence that computed ``tokens`` and committed its full blocks."""
    progress = CommitProgress()
    blocks = manager.take_prefix(tokens, len(tokens) - 1, progress)
    assert manager.grow(blocks, len(tokens))
    manager.commit(blocks, tokens, progress, len(tokens))
    return blocks, progress


def test_a_committed_prefix_is_found_whole_blocks_only_and_never_the_last_token():
    manager = BlockManager(16, BS)
    tokens = list(range(10))  # 2 full blocks + 2 tokens
    first, _ = filled(manager, tokens)
    assert manager.stats().used == 3
    progress = CommitProgress()
    taken = manager.take_prefix(tokens, len(tokens) - 1, progress)
    assert taken == first[:2] and progress.blocks == 2  # the partial third block is never shared
    # A prompt of exactly two blocks reuses one: its last token must be computed for the first output token.
    other = CommitProgress()
    assert manager.take_prefix(tokens[:8], 7, other) == first[:1]


def test_a_prefix_that_differs_anywhere_before_a_block_does_not_match_it():
    manager = BlockManager(16, BS)
    filled(manager, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert manager.take_prefix([1, 2, 3, 0, 5, 6, 7, 8, 9], 8, CommitProgress()) == []
    # Same second block, other first block: the chain is keyed by the exact parent, so nothing matches.
    assert manager.take_prefix([0, 2, 3, 4, 5, 6, 7, 8, 9], 8, CommitProgress()) == []
    assert len(manager.take_prefix([1, 2, 3, 4, 0, 6, 7, 8, 9], 8, CommitProgress())) == 1


def test_released_blocks_stay_cached_and_are_evicted_least_recently_used_never_while_held():
    manager = BlockManager(5, BS)  # 4 usable blocks (block 0 is the sink)
    a, _ = filled(manager, [1] * 8)  # 2 blocks
    b, _ = filled(manager, [2] * 8)
    manager.release(a)
    manager.release(b)
    assert manager.stats().cached == 4 and manager.available() == 4
    held = manager.take_prefix([2] * 9, 8, CommitProgress())  # b's blocks in use again
    assert len(held) == 2 and manager.available() == 2
    fresh = []
    assert manager.grow(fresh, 8)  # needs 2: a's (released first) are evicted, b's are held
    assert set(fresh).isdisjoint(held)
    assert manager.take_prefix([1] * 9, 8, CommitProgress()) == []
    assert not manager.grow(fresh, 12)  # nothing left: held blocks are never taken
    assert len(fresh) == 2


def test_an_evicted_parent_does_not_let_its_children_match_another_prefix():
    manager = BlockManager(4, BS)  # 3 usable blocks
    a, _ = filled(manager, [1, 1, 1, 1, 2, 2, 2, 2])
    manager.release(a)  # both cached; evict only the first (the parent) by taking one fresh block
    first = []
    manager.grow(first, 1)
    manager.grow(first, 5)  # the second eviction takes the child too
    manager.release(first)
    # The recycled block now holds [9,9,9,9]; a prompt of [9,9,9,9,2,2,2,2] must not find the old child.
    c, _ = filled(manager, [9, 9, 9, 9, 0])
    assert manager.take_prefix([9, 9, 9, 9, 2, 2, 2, 2, 3], 8, CommitProgress()) == c[:1]


def test_shared_blocks_are_copied_before_a_write_and_counted_once_released():
    manager = BlockManager(8, BS)
    parent, _ = filled(manager, [5] * 6)  # 1 full + 1 partial block
    child = manager.share(parent)
    assert manager.needs_copy(child, 6)
    source, copy = manager.writable(child, 6)
    assert source == parent[1] and copy not in parent and child == [parent[0], copy]
    assert manager.writable(parent, 6) is None  # the parent is now the partial block's only holder
    manager.release(child)
    manager.release(parent)
    stats = manager.stats()
    assert stats.used == 0 and stats.cached + stats.free == stats.total


def test_a_block_computed_beside_an_identical_committed_one_stays_private_and_chains_to_the_owner():
    manager = BlockManager(16, BS)
    tokens = [3] * 4 + [4] * 4 + [5]
    a_progress, b_progress = CommitProgress(), CommitProgress()
    a, b = [], []
    manager.grow(a, 9)
    manager.grow(b, 9)
    manager.commit(a, tokens, a_progress, 4)
    manager.commit(b, tokens, b_progress, 4)  # same first block, computed at the same time
    manager.commit(b, tokens, b_progress, 8)  # b's second block chains to a's first
    found = manager.take_prefix(tokens, 8, CommitProgress())
    assert found == [a[0], b[1]]
    for blocks in (found, a, b):
        manager.release(blocks)
    assert manager.stats().cached == 2  # a's first and b's second; b's private first block went back free


def test_the_probe_reserve_is_used_only_by_probes():
    manager = BlockManager(3, BS, probe_blocks=1)
    taken = []
    assert manager.grow(taken, 8) and not manager.grow(taken, 9)
    probe = []
    assert manager.grow(probe, 3, probe=True)
    assert probe[0] not in taken and SINK not in taken + probe
    manager.release(probe)
    assert manager.available(probe=True) == 1


def test_reuse_off_never_matches():
    manager = BlockManager(8, BS, reuse=False)
    filled(manager, [1] * 9)
    assert manager.take_prefix([1] * 9, 8, CommitProgress()) == []


def test_random_traffic_keeps_the_counts_consistent():
    rng = random.Random(0)
    manager = BlockManager(12, BS)
    live = []
    for _ in range(2000):
        if live and (rng.random() < 0.45 or manager.available() < 3):
            blocks, _ = live.pop(rng.randrange(len(live)))
            manager.release(blocks)
        else:
            tokens = [rng.randrange(3) for _ in range(rng.randrange(2, 10))]
            progress = CommitProgress()
            blocks = manager.take_prefix(tokens, len(tokens) - 1, progress)
            if manager.grow(blocks, len(tokens)):
                manager.commit(blocks, tokens, progress, len(tokens))
                live.append((blocks, tokens))
            else:
                manager.release(blocks)
        held = {b for blocks, _ in live for b in blocks}
        stats = manager.stats()
        assert stats.used == len(held) and stats.used + stats.cached + stats.free == stats.total
    for blocks, tokens in live:  # a live sequence's committed blocks are still found for its tokens
        found = manager.take_prefix(tokens, len(tokens), CommitProgress())
        assert found == blocks[:len(found)]
        manager.release(found)


def test_a_sequence_grows_into_the_block_after_its_last_when_it_is_free_never_evicting_a_prefix_for_it():
    """Adjacent blocks are read as one view (model.Step): the next block is taken when free. A cached block is not
    evicted for that while free blocks are left: it holds another prompt's prefix."""
    manager = BlockManager(16, BS)
    a, _ = filled(manager, [1] * 12)  # blocks 1, 2, 3 committed
    manager.release(a)
    progress = CommitProgress()
    blocks = manager.take_prefix([1] * 8 + [2] * 4, 11, progress)  # blocks 1, 2 again; 3 holds other tokens
    assert blocks == [1, 2] and manager.grow(blocks, 16)
    assert blocks == [1, 2, 4, 5]  # 3 stays cached; 4 is the lowest free block, 5 the one after it
    manager.release(blocks)
    assert manager.take_prefix([1] * 13, 12, CommitProgress()) == [1, 2, 3]
