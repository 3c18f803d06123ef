"""How a step addresses its position-indexed caches: dense (one cache of max_seq_len rows per
sequence) or paged (rows in fixed-size blocks of a pool shared by many sequences).

A paged pool of NB blocks of P positions is a cache of NB·P rows: block b's i-th position is row
b·P + i. A sequence's block table lists its blocks in order, so its position p lives in row
table[p // P]·P + p % P. A step sees the key range of each query as L slots, slot j being the
sequence's position j, and reaches their rows through `key_rows`:

    dense:  key_rows None           slot j is cache row j (the first L rows; no gather)
    paged:  key_rows [G, L]         slot j of group g is row key_rows[g, j]
            G = 1: every query of the step belongs to one sequence (a prompt chunk)
            G = S: query s is its own sequence's one new token (a batched decode step)

Layers write the new tokens' rows at `rows`, gather keys through `gather`, choose slots (the
indexer's top-k, a causal mask over `visible`) and turn chosen slots into cache rows with
`physical`: the DSA attention op then reads the pool directly, whatever the layout. The pool's
row count (the number of blocks) is the runtime's choice: nothing here depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class CacheView:
    """positions [S] of the new tokens; rows [S]: the cache row of each; key_rows None or [G, L]
    (module docstring); visible [S, L] bool: the slots each query may attend (its own sequence,
    causally); per_query: whether each query has its own key range (G = S: a batched decode
    step, of one sequence too), so that per-key-range work reads the pool in place per query;
    slot_rows [L], a key range shared by every query (G = 1, dense too): the cache row of each
    slot, -1 where its block is hidden (evicted), so that slot t is visible to query s exactly
    when t <= positions[s] and slot_rows[t] >= 0 (ops.indexer_scores' causal form); None per
    query."""

    positions: Tensor
    rows: Tensor
    key_rows: Tensor | None
    visible: Tensor
    per_query: bool = False
    slot_rows: Tensor | None = None

    @property
    def keys(self) -> int:
        """L, the slots of the key range."""
        return self.visible.shape[1]

    def window(self, width: int) -> Tensor:
        """visible, restricted to the last `width` positions up to each query (0: no limit)."""
        if not width:
            return self.visible
        behind = self.positions[:, None] - torch.arange(self.keys, dtype=torch.int64)[None, :]
        return self.visible & (behind < width)

    def gather(self, cache: Tensor) -> Tensor:
        """The key range's rows of `cache` [T, *row]: [L, *row], or [S, L, *row] per query."""
        if self.key_rows is None:
            return cache[: self.keys]
        rows = cache.index_select(0, self.key_rows.reshape(-1)).view(*self.key_rows.shape, *cache.shape[1:])
        return rows if self.per_query else rows[0]

    def indexed_pools(self, cache: Tensor, pool: int) -> tuple[Tensor, Tensor | None]:
        """An indexer's keys for ops.indexer_scores from a cache of one row per `pool` positions
        (see pool_rows): (the key range's pooled rows [L/pool, *row], None), shared by every
        query; or per query (cache, pool rows [S, L/pool]), which the op reads in place."""
        return (cache, self.pool_rows(pool)) if self.per_query else (self.gather_pools(cache, pool), None)

    def pool_rows(self, pool: int) -> Tensor:
        """Rows [G, L/pool] of a cache holding one row per `pool` consecutive positions (the
        k-pool keys): row j of group g holds the pool of slots j·pool .. j·pool + pool - 1. Paged,
        a block holds whole pools (block % pool == 0), so that pool's row is its first slot's
        cache row // pool."""
        if self.key_rows is None:
            return torch.arange(-(-self.keys // pool), dtype=torch.int64)[None, :]
        return self.key_rows[:, ::pool] // pool

    def gather_pools(self, cache: Tensor, pool: int) -> Tensor:
        """The key range's pooled rows of `cache` [T/pool, *row]: [L/pool, *row], or per query."""
        if self.key_rows is None:
            return cache[: -(-self.keys // pool)]
        rows = self.pool_rows(pool)
        pooled = cache.index_select(0, rows.reshape(-1)).view(*rows.shape, *cache.shape[1:])
        return pooled if self.per_query else pooled[0]

    def physical(self, slots: Tensor) -> Tensor:
        """Cache rows [S, K] of chosen slots [S, K] (-1, an empty slot, stays -1)."""
        if self.key_rows is None:
            return slots
        rows = range_rows(self.key_rows, slots.clamp(min=0))
        return torch.where(slots < 0, torch.full_like(rows, -1), rows)


def range_rows(key_rows: Tensor, slots: Tensor) -> Tensor:
    """key_rows[g, slots[s, j]] [S, K] for slots [S, K] in [0, L), g the query's group: s (G = S)
    or 0 (G = 1). With one key range (a prompt chunk) a gather from it, which IREE fuses into its
    consumer: an expand of the range to [S, L] first was a broadcast copy of its own (4.3 GB at
    S = 512, L = 1M; docs/perf.md, long context on the GPU)."""
    if key_rows.shape[0] == 1:
        return key_rows[0].index_select(0, slots.reshape(-1)).view_as(slots)
    return key_rows.gather(1, slots)


def dense_view(positions: Tensor, keys: int) -> CacheView:
    """One sequence in a cache of its own: positions [S] are rows, the first `keys` rows the key range."""
    slots = torch.arange(keys, dtype=torch.int64)
    return CacheView(positions, positions, None, slots[None, :] <= positions[:, None], slot_rows=slots)


EVICTED_BLOCK = 0  # runtime/blocks.py SCRATCH_BLOCK: a table entry whose slots no query sees


def paged_view(positions: Tensor, tables: Tensor, block: int, batched: bool = False) -> CacheView:
    """positions [S] through block tables [G, nb] (G = 1: one sequence; G = S: one per query) of
    blocks of `block` positions; the key range is the tables' nb·block slots. Table entries past a
    sequence's last block may be any block: their slots are never visible. An entry EVICTED_BLOCK
    (the scratch block, never a sequence's) hides its slots: the runtime evicts a block's
    positions by pointing the table there (runtime/engine.py, evict_images). batched: a decode
    step (G = S, also when both are 1: then the indexer reads the pool in place rather than
    gathering the sequence's keys); G > 1 is always one."""
    offsets = torch.arange(block, dtype=torch.int64)
    key_rows = (tables.to(torch.int64)[:, :, None] * block + offsets).reshape(tables.shape[0], -1)  # [G, L]
    group = tables.shape[0] == 1
    rows = range_rows(key_rows, positions[:, None]).reshape(-1)  # slot `position` of the query's own range
    live = (tables != EVICTED_BLOCK)[:, :, None].expand(-1, -1, block).reshape(tables.shape[0], -1)  # [G, L]
    slot = torch.arange(key_rows.shape[1], dtype=torch.int64)[None, :]
    # its own slot stays visible: a padding row of a batched step (all its table the scratch block)
    # sees what it saw before eviction existed, so that no softmax of it is over nothing
    visible = ((slot <= positions[:, None]) & live) | (slot == positions[:, None])
    per_query = batched or not group
    # a prompt chunk's own slots are in live blocks, so `visible` is slot <= position over live slots
    shared = None if per_query else torch.where(live[0], key_rows[0], -1)
    return CacheView(positions, rows, key_rows, visible, per_query=per_query, slot_rows=shared)
