"""The block pool of paged caches (models/paging.py): which blocks each running sequence holds.

Every position-indexed cache of an artifact is a pool of `num_blocks` blocks of `block_size`
positions, and the same block number means the same positions in every layer's pool, so one
table per sequence serves them all. Block 0 is never handed out: padded rows of a batched step
(a batch smaller than its compiled size) write there, where no sequence reads.

    pool = BlockPool(num_blocks=1024, block_size=64)
    pool.reserve(seq, positions=130)   # grows seq's table to 3 blocks (False if the pool is short)
    pool.table(seq)                    # [b0, b1, b2], in position order
    pool.evict(seq, [1])               # block 1 of its table is free again, SCRATCH_BLOCK in its place
    pool.release(seq)                  # its blocks are free again

The pool decides nothing about who runs: the scheduler asks `can_reserve` and chooses.
"""

from __future__ import annotations

from collections.abc import Hashable

SCRATCH_BLOCK = 0  # where padding rows of a batched step write; never in a sequence's table


class BlockPoolError(ValueError):
    pass


def blocks_for(positions: int, block_size: int) -> int:
    """Blocks of `block_size` positions holding `positions` positions."""
    return -(-positions // block_size)


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        if not isinstance(block_size, int) or block_size < 1:
            raise BlockPoolError(f"block_size must be an integer >= 1, got {block_size!r}")
        if not isinstance(num_blocks, int) or num_blocks < 2:
            raise BlockPoolError(
                f"the pool needs at least 2 blocks (one scratch block and one for a sequence), got {num_blocks!r}"
            )
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks - 1, SCRATCH_BLOCK, -1))  # pop() hands out low numbers first
        self._tables: dict[Hashable, list[int]] = {}

    @property
    def capacity(self) -> int:
        """Blocks a sequence may ever hold (all but the scratch block)."""
        return self.num_blocks - 1

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.capacity - len(self._free)

    def blocks_for(self, positions: int) -> int:
        """Blocks holding `positions` positions."""
        return blocks_for(positions, self.block_size)

    def can_reserve(self, seq: Hashable, positions: int) -> bool:
        """Whether `seq` can grow to `positions` positions with the blocks free now."""
        return self.blocks_for(positions) - len(self._tables.get(seq, ())) <= len(self._free)

    def reserve(self, seq: Hashable, positions: int) -> bool:
        """Grow `seq`'s table to hold `positions` positions (a new sequence gets a table);
        False, and nothing changed, when not enough blocks are free."""
        if not self.can_reserve(seq, positions):
            return False
        table = self._tables.setdefault(seq, [])
        while len(table) < self.blocks_for(positions):
            table.append(self._free.pop())
        return True

    def table(self, seq: Hashable) -> list[int]:
        """`seq`'s blocks in position order (a copy)."""
        if seq not in self._tables:
            raise KeyError(f"sequence {seq!r} holds no blocks")
        return list(self._tables[seq])

    def evict(self, seq: Hashable, indices) -> int:
        """Free the blocks at `indices` of `seq`'s table and put SCRATCH_BLOCK in their place (the
        steps then see none of their positions: models/paging.py); returns how many it freed."""
        table = self._tables[seq]
        freed = 0
        for i in sorted(set(indices), reverse=True):
            if table[i] != SCRATCH_BLOCK:
                self._free.append(table[i])
                table[i] = SCRATCH_BLOCK
                freed += 1
        return freed

    def release(self, seq: Hashable) -> int:
        """Free every block of `seq` (finished, aborted or preempted); returns how many."""
        table = [b for b in self._tables.pop(seq, []) if b != SCRATCH_BLOCK]
        self._free.extend(reversed(table))
        return len(table)

    def __contains__(self, seq: Hashable) -> bool:
        return seq in self._tables
