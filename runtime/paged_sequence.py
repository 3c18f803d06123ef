"""One sequence over an artifact's paged entry points, its pools grown with it: Session's state
on a long-context artifact (runtime/session.py).

The dense entry points hold max_seq_len rows per cache from load on, and a step scores all of
them (docs/perf.md, 'Long context on the CPU'). Here the pools start at a few blocks and double
(up to the artifact's max_seq_len) when the sequence needs more: device memory and a step's work
follow the tokens held. The layout is the Engine's (runtime/engine.py) for one sequence: block
SCRATCH_BLOCK and slot SCRATCH_SLOT are the entry points' scratch, the sequence's table is
blocks 1..n in order and its slot is 1.

Growing copies the old pools into new ones on the device (one command buffer) and zero-fills the
rest; the slot tensors do not change size. Old and new pools live together while it copies, so
when the device cannot hold the doubled pools it tries the blocks the call needs alone, and when
it cannot hold those either the call is refused (`error`, naming the bytes) before anything runs:
the sequence stays as it was.
"""

from __future__ import annotations

import numpy as np
from iree import runtime as rt

from day0.runtime.artifact import PAGED_IMAGE_PREFILL, Manifest
from day0.runtime.blocks import SCRATCH_BLOCK, blocks_for
from day0.runtime.state_file import np_dtype
from day0.runtime.step_call import PagedCaller, _device_buffer, _fence

INITIAL_BLOCKS = 4  # besides the scratch block
SLOT = 1  # the sequence's slot (0: scratch)


class PagedSequence:
    """The pools and slots of one sequence (module docstring) and the calls that advance it."""

    def __init__(self, manifest: Manifest, vm, error: type[Exception] = RuntimeError):
        self.layout, self._vm, self._error = manifest.paged, vm, error
        self.max_seq_len, self.vocab_size = manifest.max_seq_len, manifest.vocab_size
        self.static_chunk = manifest.paged_prefill_chunk
        most = blocks_for(self.max_seq_len, self.layout.block_size)
        longest = max(self.max_seq_len, self.static_chunk)
        # prev [largest batch]: the entry points' shape for it (this Session never reads it)
        self._caller = PagedCaller(vm, [longest, longest, most, 1], max(self.layout.batch_sizes), self.vocab_size)
        self._decode = f"paged_decode_{min(self.layout.batch_sizes)}"
        self.capacity = 0  # blocks in the pools, the scratch block included
        self._state: list = []
        self.reset()

    def reset(self) -> None:
        """Empty pools of INITIAL_BLOCKS blocks and zero slots."""
        self._state = [self._zeros(p, 1 + INITIAL_BLOCKS) for p in self.layout.pools]
        self._state += [
            self._vm.to_device(np.zeros((SLOT + 1, *s.shape), np_dtype(s.dtype))) for s in self.layout.slots
        ]
        self.capacity = 1 + INITIAL_BLOCKS

    def _zeros(self, pool, blocks: int):
        return self._vm.to_device(np.zeros((blocks * pool.shape[0], *pool.shape[1:]), np_dtype(pool.dtype)))

    def ensure(self, positions: int) -> None:
        """Pools that hold `positions` positions: doubled (at most to max_seq_len's blocks) when
        they do not."""
        need = 1 + blocks_for(positions, self.layout.block_size)
        if need <= self.capacity:
            return
        most = 1 + blocks_for(self.max_seq_len, self.layout.block_size)
        for blocks in dict.fromkeys((min(max(need, 2 * self.capacity), most), need)):  # doubled, else exact
            try:
                buffers = [_device_buffer(self._vm.device, blocks * p.nbytes) for p in self.layout.pools]
            except (RuntimeError, ValueError, MemoryError) as e:  # the device is out of memory
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                continue
            self._grow(blocks, buffers)
            return
        raise self._error(
            f"the sequence needs {positions} positions: pools of {need} blocks ({need * self.layout.block_bytes} "
            f"bytes) beside the {self.capacity} blocks it holds ({self.capacity * self.layout.block_bytes} bytes), "
            f"which the device could not allocate ({why})"
        )

    def _grow(self, blocks: int, buffers: list) -> None:
        device = self._vm.device
        copy = rt.HalCommandBuffer(device)
        grown = []
        for p, old, buffer in zip(self.layout.pools, self._state, buffers):
            have, want = self.capacity * p.nbytes, blocks * p.nbytes
            copy.copy(old._buffer_view.get_buffer(), buffer, 0, 0, have)
            copy.fill(buffer, np.zeros(1, np.uint32), have, want - have)
            view = rt.HalBufferView(buffer, [blocks * p.shape[0], *p.shape[1:]], old._buffer_view.element_type)
            grown.append(rt.DeviceArray(device, view))
        copy.end()
        self._caller.drain()
        semaphore = device.create_semaphore(0)
        device.queue_execute(copy, _fence(), _fence((semaphore, 1)))
        _fence((semaphore, 1)).wait()
        self._state[: len(grown)] = grown
        self.capacity = blocks

    def table(self, positions: int) -> np.ndarray:
        """The block table [1, n] of the first `positions` positions."""
        n = blocks_for(positions, self.layout.block_size)
        return np.arange(SCRATCH_BLOCK + 1, SCRATCH_BLOCK + 1 + n, dtype=np.int64)[None, :]

    def run(self, ids: np.ndarray, start: int, logits: bool, extra=()) -> tuple[np.ndarray | None, int]:
        """Append ids at positions start.. (one call: a decode step for one id, the static chunk
        for exactly its length when only the last row is wanted, else the dynamic prefill;
        `extra`: paged_prefill_mm's features and feature rows, DeviceArrays). Returns (the logits
        rows [len(ids), vocab] when `logits`, else None; the greedy next token)."""
        n = ids.size
        self.ensure(start + n)
        positions = np.arange(start, start + n, dtype=np.int64)
        if extra:
            name = PAGED_IMAGE_PREFILL
        elif n == 1:
            name = self._decode
        elif n == self.static_chunk and not logits:
            name = "paged_prefill_chunk"
        else:
            name = "paged_prefill"
        rows = 1 if name == "paged_prefill_chunk" else n
        pending, self._state = self._caller.submit(
            name, [ids, positions, self.table(start + n), np.array([SLOT])], self._state, rows, logits, extra=extra
        )
        host, nxt = self._caller.finish(pending)
        return host, int(nxt[-1])

    def state_bytes(self) -> dict[str, int]:
        """Bytes per kind the pools and the slot tensors hold on the device now."""
        out: dict[str, int] = {}
        for p in self.layout.pools:
            out[p.kind] = out.get(p.kind, 0) + self.capacity * p.nbytes
        for s in self.layout.slots:
            out[s.kind] = out.get(s.kind, 0) + (SLOT + 1) * s.nbytes
        return out

    def host_state(self, positions: int) -> dict[str, np.ndarray]:
        """By state tensor name: the sequence's rows of every pool (the blocks of its first
        `positions` positions, as the dense tensor's first rows) and its slot of every slot
        tensor, on the host (Session.save_state)."""
        n = blocks_for(positions, self.layout.block_size)
        self._caller.drain()
        out = {}
        for p, a in zip(self.layout.pools, self._state):
            rows = np.asarray(a.to_host())
            out[p.name] = np.array(rows[p.shape[0] : (1 + n) * p.shape[0]], copy=True)
        for s, a in zip(self.layout.slots, self._state[len(self.layout.pools) :]):
            out[s.name] = np.array(np.asarray(a.to_host())[SLOT], copy=True)
        return out

    def load_host_state(self, positions: int, arrays: dict[str, np.ndarray]) -> None:
        """Replace the state with a sequence of `positions` positions: by state tensor name, a
        pool's first rows (host_state's, or a dense tensor, any number of rows: the sequence's
        blocks take what they hold) and a slot tensor's one sequence."""
        n = blocks_for(positions, self.layout.block_size)
        blocks = max(1 + n, 1 + INITIAL_BLOCKS)
        state = []
        for p in self.layout.pools:
            pool = np.zeros((blocks * p.shape[0], *p.shape[1:]), np_dtype(p.dtype))
            rows = arrays[p.name][: n * p.shape[0]]
            pool[p.shape[0] : p.shape[0] + rows.shape[0]] = rows
            state.append(self._vm.to_device(pool))
        for s in self.layout.slots:
            slots = np.zeros((SLOT + 1, *s.shape), np_dtype(s.dtype))
            slots[SLOT] = arrays[s.name]
            state.append(self._vm.to_device(slots))
        self._caller.drain()
        self._state, self.capacity = state, blocks
