"""What a paged artifact's state costs: bytes per token per layer for each cache kind, what one
sequence of a given length holds, the longest context a memory budget allows and how many
sequences of a given length fit in it. `day0 inspect --memory SIZE` prints it (the Engine logs
what its own pools hold at load: `cache pools`, logger `day0.engine`).

The accounting is the Engine's (runtime/engine.py `_block_count`): a budget holds the running
sequences' slots (recurrent state of a fixed size, one per running sequence plus a scratch slot)
and the pools' blocks (`block_size` positions across every position-indexed cache), one block of
which is the scratch block padded table entries point at. A sequence of L positions holds
ceil(L / block_size) blocks: its bytes grow with its own length, never with max_seq_len.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from day0.runtime.blocks import blocks_for

_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS.update({"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12})
_UNITS.update({"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40})
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})


def parse_bytes(text: str) -> int:
    """'80GiB', '141GB', '2.5 TiB', '1048576' as bytes (powers of 1024 for KiB..TiB, of 1000 for
    kB..TB); ValueError naming the text otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m and m.group(2).lower()
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size (e.g. 80GiB, 141GB, 1048576)")
    return int(float(m.group(1)) * _UNITS[unit])


def size_arg(text: str) -> int:
    """parse_bytes for argparse's `type=` (its error names the option and the text)."""
    import argparse

    try:
        return parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@dataclass(frozen=True)
class CacheKind:
    """One kind of position-indexed cache (`mla_latent`, `indexer_keys`, ...) across its layers."""

    kind: str
    layers: int
    dtype: str
    bytes_per_token: float  # a layer's; below one row a position for pooled keys (k-pools)


@dataclass(frozen=True)
class MemoryPlan:
    block_size: int
    block_bytes: int  # one block across every pool
    slot_bytes: int  # one sequence's recurrent state across every slot tensor
    max_seq_len: int
    caches: tuple[CacheKind, ...]

    @property
    def bytes_per_token(self) -> float:
        return self.block_bytes / self.block_size

    def blocks_for(self, length: int) -> int:
        return blocks_for(length, self.block_size)

    def sequence_bytes(self, length: int) -> int:
        """Device bytes one sequence of `length` positions holds: its blocks and its slot."""
        return self.blocks_for(length) * self.block_bytes + self.slot_bytes

    def sequences_fitting(self, budget: int, length: int) -> int:
        """How many sequences of `length` positions `budget` bytes hold at once (0 if `length` is
        past max_seq_len). Memory only: how many run together is also capped by the Engine's
        max_running (the largest compiled batch by default)."""
        if length > self.max_seq_len:
            return 0
        room = budget - self.block_bytes - self.slot_bytes  # the scratch block and slot
        return max(room // self.sequence_bytes(length), 0)

    def longest_context(self, budget: int) -> int:
        """The longest sequence `budget` bytes hold alone (at most max_seq_len; 0: not one block)."""
        blocks = (budget - 2 * self.slot_bytes) // self.block_bytes - 1  # less the scratch block
        return max(min(blocks * self.block_size, self.max_seq_len), 0)

    def lengths(self) -> list[int]:
        """The context lengths a plan is shown for: 4K, 32K, 128K, 1M up to max_seq_len, and it."""
        return sorted({n for n in (4096, 32768, 131072, 1048576) if n < self.max_seq_len} | {self.max_seq_len})

    def to_json(self, budget: int | None = None) -> dict:
        out = {
            "block_size": self.block_size,
            "bytes_per_token": self.bytes_per_token,
            "slot_bytes": self.slot_bytes,
            "caches": [c.__dict__ for c in self.caches],
            "sequence_bytes": {str(n): self.sequence_bytes(n) for n in self.lengths()},
        }
        if budget is not None:
            out["budget"] = {
                "bytes": budget,
                "longest_context": self.longest_context(budget),
                "sequences": {str(n): self.sequences_fitting(budget, n) for n in self.lengths()},
            }
        return out

    def lines(self, budget: int | None = None) -> list[str]:
        """The plan for reading (`day0 inspect`): one line per cache kind, then per length."""
        out = [
            f"{c.kind:<14} {c.layers:>3} layer{'s' if c.layers != 1 else ' '} x {_num(c.bytes_per_token)} B a token a "
            f"layer ({c.dtype})"
            for c in self.caches
        ]
        state = f"; a sequence also holds {size(self.slot_bytes)} of recurrent state" if self.slot_bytes else ""
        out.append(f"{'a token':<14} {_num(self.bytes_per_token)} B across layers{state}")
        for n in self.lengths():
            line = f"{_tokens(n):>6} tokens {size(self.sequence_bytes(n)):>10} a sequence"
            if budget is not None:
                line += f", {self.sequences_fitting(budget, n)} fit in {size(budget)}"
            out.append(line)
        if budget is not None:
            n = self.longest_context(budget)
            cap = " (max_seq_len)" if n == self.max_seq_len else ""
            out.append(f"longest context in {size(budget)}: {n} tokens{cap}")
        return out


def memory_plan(paged, max_seq_len: int) -> MemoryPlan:
    """The plan of a manifest's PagedLayout (runtime/artifact.py)."""
    kinds: dict[str, list] = {}
    for p in paged.pools:
        kinds.setdefault(p.kind, []).append(p)
    caches = tuple(
        CacheKind(
            kind,
            len(ps),
            "/".join(sorted({p.dtype for p in ps})),
            sum(p.nbytes for p in ps) / len(ps) / paged.block_size,
        )
        for kind, ps in kinds.items()
    )
    return MemoryPlan(paged.block_size, paged.block_bytes, paged.slot_bytes, max_seq_len, caches)


def _num(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,.2f}"


def _tokens(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (`1.5 MiB`)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
