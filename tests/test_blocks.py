"""The block pool of paged caches: tables grow by whole blocks, never share a block, never hold
the scratch block, and give every block back on release; a short pool says no without changing."""

import random

import pytest

from day0.runtime.blocks import SCRATCH_BLOCK, BlockPool, BlockPoolError


def test_tables_grow_by_blocks_and_release_returns_them():
    pool = BlockPool(num_blocks=8, block_size=4)
    assert (pool.capacity, pool.free, pool.used) == (7, 7, 0)
    assert pool.reserve("a", 5) and pool.table("a") == [1, 2]
    assert pool.reserve("a", 8) and pool.table("a") == [1, 2]  # still two blocks
    assert pool.reserve("a", 9) and len(pool.table("a")) == 3
    assert pool.reserve("b", 1) and pool.used == 4
    assert pool.release("a") == 3 and "a" not in pool and pool.free == 6
    with pytest.raises(KeyError, match="holds no blocks"):
        pool.table("a")


def test_a_short_pool_refuses_without_changing_anything():
    pool = BlockPool(num_blocks=4, block_size=2)
    assert pool.reserve("a", 4)
    assert not pool.can_reserve("b", 3) and not pool.reserve("b", 3)
    assert "b" not in pool and pool.free == 1 and pool.table("a") == [1, 2]
    assert not pool.reserve("a", 7)  # growing needs 2 more blocks, 1 is free
    assert pool.table("a") == [1, 2]


def test_random_traffic_never_shares_or_leaks_a_block():
    pool, rng, live = BlockPool(num_blocks=33, block_size=3), random.Random(0), {}
    for step in range(2000):
        seq = rng.randrange(12)
        if seq in live and rng.random() < 0.3:
            pool.release(seq)
            del live[seq]
        else:
            want = live.get(seq, 0) + rng.randrange(1, 7)
            if pool.reserve(seq, want):
                live[seq] = want
        held = [b for s in live for b in pool.table(s)]
        assert len(held) == len(set(held)) == pool.used, step
        assert SCRATCH_BLOCK not in held and all(0 < b < 33 for b in held)
        assert all(len(pool.table(s)) == pool.blocks_for(n) for s, n in live.items())
    for s in list(live):
        pool.release(s)
    assert pool.free == pool.capacity


@pytest.mark.parametrize("blocks,size,cause", [(1, 4, "at least 2 blocks"), (8, 0, "block_size"), (8.0, 4, "2 blocks")])
def test_a_pool_too_small_for_one_sequence_block_is_named(blocks, size, cause):
    with pytest.raises(BlockPoolError, match=cause):
        BlockPool(num_blocks=blocks, block_size=size)


def test_evict_frees_blocks_and_leaves_scratch_in_their_place():
    pool = BlockPool(num_blocks=8, block_size=4)
    assert pool.reserve("a", 16) and pool.table("a") == [1, 2, 3, 4]
    assert pool.evict("a", [1, 2, 2]) == 2 and pool.table("a") == [1, SCRATCH_BLOCK, SCRATCH_BLOCK, 4]
    assert pool.evict("a", [1]) == 0  # already gone
    assert (pool.used, pool.free) == (2, 5)
    assert pool.reserve("b", 8) and set(pool.table("b")) <= {2, 3, 5, 6, 7}  # the evicted blocks serve others
    assert pool.release("a") == 2 and pool.used == 2  # the scratch entries are not freed twice
    assert SCRATCH_BLOCK not in pool._free
