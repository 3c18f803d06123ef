"""Calling a loaded artifact's entry points without `iree.runtime.FunctionInvoker`'s host cost.

`FunctionInvoker` (what `VmModule.function` hands out) costs more host time than a one-sequence
decode step on the GPU can spare (docs/perf.md, "Host cost of an Engine step"): each numpy
argument becomes a fresh device buffer, allocated and copied synchronously; the synchronous entry
point waits for the device before it returns; each `DeviceArray.to_host()` registers a fresh
numpy array with the driver (pinned memory) and waits again. Here buffers are made once and
reused, and the `$async` entry points are invoked with fences:
  * the step's integer inputs are written into a pinned host buffer and copied by one command
    buffer into device buffers of the largest size any call needs (a buffer view of the call's
    shape over each); the entry point waits for that copy on the device, not on the host;
  * the results the caller reads are copied, on the device, into a pinned read-back buffer after
    the step, and the host waits once, for that copy.

Transient memory: an artifact compiled with `--iree-torch-externalize-transients` (cuda-sm90,
lowering/targets.py) takes its transient memory as an argument after the state (a `!hal.buffer`
of the size its `iree.abi.transients.size[.constant]` reflection names: a constant, or a function
of the call's arguments). `Transients` keeps one device buffer, grown to the largest call.

Two callers:
  * `StepCaller` (Session's dense entry points): the entry point returns its outputs; one call
    at a time, synchronous as seen by the caller.
  * `PagedCaller` (the Engine's paged entry points, frontend/export.py `_PagedStep`): the entry
    point writes its logits and next tokens into caller buffers and returns only the state, so a
    call allocates nothing. `submit` returns a `Pending` call at once and `finish` waits for its
    read-back, so the Engine can submit step N+1 (reading step N's next tokens on the device
    through `prev`) before it waits for step N: the host prepares and records N+1 while the GPU
    runs N (runtime/engine.py). Every step waits on the step before it (they share the state),
    so the device runs them in submission order; each call's inputs, outputs and read-back live
    in a buffer set of its own until `finish`.

IREE's CUDA driver runs `queue_alloca`/`queue_dealloca` on the calling thread and waits there for
their fences: an entry point that allocates holds the host until its inputs have arrived and
again until it has run. That is why the paged steps allocate nothing (with caller transients).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from iree import runtime as rt

_ALIGN = 256  # bytes between the pieces of the staging and read-back buffers
_MT, _BU = rt.MemoryType, rt.BufferUsage
_SIZE = "iree.abi.transients.size"


_UPLOAD_TYPES = {
    np.dtype(np.float32): rt.HalElementType.FLOAT_32,
    np.dtype(np.int64): rt.HalElementType.SINT_64,
    np.dtype(np.int32): rt.HalElementType.SINT_32,
}


def _upload_type(a) -> bool:
    """Whether StepCaller.call uploads `a` through its pinned buffer."""
    return isinstance(a, np.ndarray) and a.dtype in _UPLOAD_TYPES


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _pinned(device, usage, size: int):
    """A host buffer the device reads or writes (`usage`: TRANSFER_SOURCE or _TARGET), mapped for
    its lifetime: (buffer, mapping, its bytes as a uint8 array). Keep the mapping with the array."""
    buffer = device.allocator.allocate_buffer(
        memory_type=int(_MT.HOST_LOCAL | _MT.DEVICE_VISIBLE),
        allowed_usage=int(usage) | int(_BU.MAPPING_SCOPED) | int(_BU.MAPPING_PERSISTENT),
        allocation_size=size,
    )
    mapping = buffer.map()
    return buffer, mapping, mapping.asarray([size], np.dtype(np.uint8))


def _device_buffer(device, size: int):
    return device.allocator.allocate_buffer(
        memory_type=int(_MT.DEVICE_LOCAL), allowed_usage=int(_BU.DEFAULT), allocation_size=max(size, 8)
    )


def _fence(*points) -> rt.HalFence:
    """A fence of (semaphore, value) timepoints."""
    fence = rt.HalFence(max(len(points), 1))
    for sem, value in points:
        fence.insert(sem, value)
    return fence


def _push(args: rt.VmVariantList, views) -> None:
    for x in views:
        args.push_ref(x.ref)


class Transients:
    """The caller-provided transient memory of one module's entry points (module docstring): one
    device buffer, grown (never shrunk) to the largest size a call has needed. A call made while
    an earlier one may still run on the device keeps that one's buffer alive through its own
    `Pending` (`buffer()`'s value), and every entry point's calls are ordered on the device (each
    waits for the previous), so they can share one buffer."""

    def __init__(self, vm):
        self._vm, self._device = vm, vm.device
        self._buffer, self._bytes = None, 0
        self._sizes: dict[tuple, int] = {}  # (function, argument shapes) -> bytes
        self._placeholder = None

    def takes(self, function) -> bool:
        return _SIZE in function.reflection or f"{_SIZE}.constant" in function.reflection

    def buffer(self, name: str, function, views: Sequence, fences: tuple) -> object:
        """The storage for a call of `function` (entry point `name`) on `views` (its buffer view
        arguments, in order): its size is the reflection's constant, else what the size function
        returns for these arguments (cached by their shapes)."""
        r = function.reflection
        size = r.get(f"{_SIZE}.constant")
        if size is None:
            key = (name, *(tuple(v.shape) for v in views))
            size = self._sizes.get(key)
            if size is None:
                size = self._sizes[key] = self._query(r[_SIZE], views, fences)
        size = int(size)
        if size > self._bytes:
            self._bytes = max(_aligned(size), self._bytes + self._bytes // 2)
            self._buffer = _device_buffer(self._device, self._bytes)
        if self._buffer is None:
            self._buffer = _device_buffer(self._device, 8)
        return self._buffer

    def _query(self, size_function: str, views: Sequence, fences: tuple) -> int:
        """Call the module's transient-size function (its arguments: the entry point's)."""
        if self._placeholder is None:
            self._placeholder = _device_buffer(self._device, 8)
        args = rt.VmVariantList(len(views) + 3)
        _push(args, views)
        args.push_ref(self._placeholder.ref)
        for f in fences:
            args.push_ref(f.ref)
        results = rt.VmVariantList(1)
        self._vm.invoke(self._vm.exported_function(size_function), args, results)
        return int(results.get_variant(0))


class _Caller:
    """What both callers share: the `$async` functions, the int64 inputs staged through a pinned
    buffer into device buffers (`input_elements[i]`: the most elements input i of any call
    holds), and an invocation with caller transients and fences."""

    def __init__(self, vm, input_elements: Sequence[int]):
        self._vm, self._device = vm, vm.device
        self._sizes = [8 * int(n) for n in input_elements]
        self._offsets = list(itertools.accumulate((_aligned(s) for s in self._sizes), initial=0))
        self._functions: dict[str, object] = {}
        self._transients = Transients(vm)

    def _function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._vm.async_function(name)
        return fn

    def _stage(self, name: str, inputs: Sequence[np.ndarray], staging, staged: np.ndarray, buffers: list):
        """Write `inputs` into the pinned `staging` (its bytes: `staged`) and record their copy
        into `buffers`: (the ended copy command buffer, a view of each input's shape over its
        buffer). ValueError, nothing written, when an input exceeds what its buffer was sized for."""
        arrays = [np.ascontiguousarray(a, dtype=np.int64) for a in inputs]
        for a, most in zip(arrays, self._sizes):
            if a.nbytes > most:
                raise ValueError(
                    f"{name}: an input of {a.size} elements exceeds the {most // 8} its buffers were sized for"
                )
        copy = rt.HalCommandBuffer(self._device)
        views = []
        for a, off, buf in zip(arrays, self._offsets, buffers):
            staged[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            copy.copy(staging, buf, off, 0, a.nbytes)
            views.append(rt.HalBufferView(buf, list(a.shape), rt.HalElementType.SINT_64))
        copy.end()
        return copy, views

    def _invoke(self, name: str, views: list, fences: tuple, results: int):
        """Invoke entry point `name`'s `$async` function on `views` (then its transient storage,
        when it takes one, then the wait and signal `fences`): (the result list, the storage or
        None)."""
        fn = self._function(name)
        args = rt.VmVariantList(len(views) + 3)
        _push(args, views)
        storage = None
        if self._transients.takes(fn):
            storage = self._transients.buffer(name, fn, views, fences)
            args.push_ref(storage.ref)
        for f in fences:
            args.push_ref(f.ref)
        out = rt.VmVariantList(results)
        self._vm.invoke(fn, args, out)
        return out, storage


class StepCaller(_Caller):
    """Calls entry points of one loaded module (`VmModule`) whose arguments are int64 inputs
    followed by device state (and, with caller transients, their storage), and whose results are
    outputs (the logits, the greedy next token when the entry point has it) followed by the
    state: Session's calls. Synchronous as seen by the caller: when `__call__` returns the step
    has run, the results are on the host and the input buffers may be rewritten."""

    def __init__(self, vm, input_elements: Sequence[int]):
        """`input_elements[i]`: the most elements input i of any call holds."""
        super().__init__(vm, input_elements)
        self._staging, self._staging_map, self._staged = _pinned(self._device, _BU.TRANSFER_SOURCE, self._offsets[-1])
        self._inputs = [_device_buffer(self._device, s) for s in self._sizes]
        self._readback, self._readback_bytes = None, 0
        self._up, self._up_bytes, self._up_buffers = None, 0, []  # call()'s uploads (pinned, device)
        self._semaphore = self._device.create_semaphore(0)
        self._value = 0

    def _read_buffer(self, nbytes: int) -> np.ndarray:
        """The pinned read-back buffer, grown to `nbytes` (kept for later calls)."""
        if nbytes > self._readback_bytes:
            self._readback_bytes = max(_aligned(nbytes), 2 * self._readback_bytes)
            self._readback, self._readback_map, self._read_view = _pinned(
                self._device, _BU.TRANSFER_TARGET, self._readback_bytes
            )
        return self._read_view

    def _fence(self, value: int) -> rt.HalFence:
        return rt.HalFence.create_at(self._semaphore, value)

    def __call__(self, name: str, inputs: Sequence[np.ndarray], state: list, read: Sequence[int], outputs: int = 2):
        """Run entry point `name` on `inputs` (int64 arrays) and `state` (DeviceArrays, consumed
        as by the entry point), whose first `outputs` results precede the state. Returns (host
        copies of the results at indices `read`, the state results as DeviceArrays)."""
        copy, views = self._stage(name, inputs, self._staging, self._staged, self._inputs)
        v = self._value
        self._device.queue_execute(copy, self._fence(v), self._fence(v + 1))
        views += [x._buffer_view for x in state]
        return self._run(name, views, v + 1, len(state) + outputs, read, outputs)

    def call(self, name: str, args: Sequence, results: int, read: Sequence[int], outputs: int):
        """Run entry point `name` on `args`, each a numpy array (float32, int64 or int32: written
        into a pinned buffer and copied on the device into a buffer kept for the next call, so a
        large input, e.g. an image's pixels, uploads at the link's speed rather than through a
        synchronous copy of pageable memory; another dtype: a fresh device buffer) or a
        DeviceArray (consumed as by the entry point); it returns `results` results. Returns (host
        copies of the results at indices `read`, the results after the first `outputs` as
        DeviceArrays): the image entry points (Session, the Engine's encoders)."""
        views, staged = [], []  # staged: the arguments uploaded through the pinned buffer
        for i, a in enumerate(args):
            if _upload_type(a):
                staged.append(i)
                views.append(None)
            else:
                views.append((self._vm.to_device(a) if isinstance(a, np.ndarray) else a)._buffer_view)
        at = self._value
        if staged:
            copy, uploaded = self._upload([args[i] for i in staged])
            self._device.queue_execute(copy, self._fence(at), self._fence(at + 1))
            at += 1
            for i, view in zip(staged, uploaded):
                views[i] = view
        return self._run(name, views, at, results, read, outputs)

    def _upload(self, arrays: Sequence[np.ndarray]):
        """(an ended command buffer copying `arrays` from the pinned upload buffer into their device
        buffers, a view of each), both buffers grown to the call's needs and kept."""
        arrays = [np.ascontiguousarray(a) for a in arrays]
        offsets = list(itertools.accumulate((_aligned(a.nbytes) for a in arrays), initial=0))
        if offsets[-1] > self._up_bytes:
            self._up_bytes = max(offsets[-1], 2 * self._up_bytes)
            self._up = _pinned(self._device, _BU.TRANSFER_SOURCE, self._up_bytes)
        while len(self._up_buffers) < len(arrays):
            self._up_buffers.append((None, 0))
        copy = rt.HalCommandBuffer(self._device)
        views = []
        for i, (a, off) in enumerate(zip(arrays, offsets)):
            buffer, size = self._up_buffers[i]
            if a.nbytes > size:
                size = max(a.nbytes, 2 * size)
                buffer = _device_buffer(self._device, size)
                self._up_buffers[i] = (buffer, size)
            self._up[2][off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            if a.nbytes:
                copy.copy(self._up[0], buffer, off, 0, a.nbytes)
            views.append(rt.HalBufferView(buffer, list(a.shape), _UPLOAD_TYPES[a.dtype]))
        copy.end()
        return copy, views

    def _run(self, name: str, views: list, at: int, results: int, read: Sequence[int], outputs: int):
        """Invoke `name` on `views` once the semaphore reaches `at` (its inputs are on the device
        then), read back the results at `read`: __call__'s results."""
        self._value = at + 2
        fences = (self._fence(at), self._fence(at + 1))
        returned, _ = self._invoke(name, views, fences, results)
        out = [returned.get_as_object(i, rt.HalBufferView) for i in range(len(returned))]

        # IREE's local (CPU) devices resolve a copy's buffers while recording it, and these
        # results are allocated by the step: wait for it first there (a CPU step is milliseconds).
        # The CUDA driver records command buffers for replay and resolves them at issue.
        if self._vm.device_name != "cuda":
            self._fence(at + 1).wait()
        back = rt.HalCommandBuffer(self._device)
        pieces, offset = [], 0
        for i in read:
            bv = out[i]
            dtype = rt.HalElementType.map_to_dtype(bv.element_type)
            pieces.append((offset, bv, np.dtype(dtype)))
            offset += _aligned(bv.byte_length)
        host = self._read_buffer(offset) if read else None
        for at_i, bv, _ in pieces:
            back.copy(bv.get_buffer(), self._readback, 0, at_i, bv.byte_length)
        back.end()
        self._device.queue_execute(back, self._fence(at + 1), self._fence(at + 2))
        self._fence(at + 2).wait()
        copies = [host[at_i : at_i + bv.byte_length].view(dtype).reshape(bv.shape).copy() for at_i, bv, dtype in pieces]
        return copies, [rt.DeviceArray(self._device, bv) for bv in out[outputs:]]


@dataclass
class _Set:
    """One call's buffers (PagedCaller): its inputs staged on the host and on the device, the
    logits and next tokens it writes, and the pinned buffer they are read back into."""

    staging: tuple
    inputs: list
    next: object  # device, `most` int64 (a prev view covers all of it)
    logits: object = None  # device, grown by rows
    logits_rows: int = 0
    back: tuple = ()  # pinned (buffer, mapping, bytes)
    back_bytes: int = 0


@dataclass
class Pending:
    """A submitted paged call: `finish` it (in submission order) for its results; until then a
    later call may read its next tokens on the device (`submit`'s `prev`)."""

    name: str
    set: _Set
    rows: int  # logits rows written
    tokens: int  # next tokens written
    logits: bool  # whether the logits come back
    back_value: int
    keep: list = field(default_factory=list)  # buffers the device may still use
    done: bool = False


class PagedCaller(_Caller):
    """The Engine's paged entry points (module docstring): (ids, positions, tables, slots, prev,
    logits_out, next_out, *state[, transients]) -> (*state)."""

    def __init__(self, vm, input_elements: Sequence[int], most: int, vocab: int):
        """`input_elements`: the most elements of ids, positions, tables, slots any call has;
        `most`: the largest batch (prev's length); `vocab`: the logits' width."""
        super().__init__(vm, input_elements)
        self._most, self._vocab = most, vocab
        # Three timelines, each signalled in order: input copies (a copy writes its own buffer set,
        # so it waits for nothing), steps (each waits for its copy and for the step before it:
        # they share the state), read-backs (each after its step and the read-back before it).
        self._copies = self._device.create_semaphore(0)
        self._steps = self._device.create_semaphore(0)
        self._backs = self._device.create_semaphore(0)
        self._copy_value = self._step_value = self._back_value = 0
        self._free: list[_Set] = []
        self._no_prev = None
        self._cuda = vm.device_name == "cuda"
        self._unfinished: list[Pending] = []

    def _acquire(self) -> _Set:
        if self._free:
            return self._free.pop()
        return _Set(
            staging=_pinned(self._device, _BU.TRANSFER_SOURCE, self._offsets[-1]),
            inputs=[_device_buffer(self._device, s) for s in self._sizes],
            next=_device_buffer(self._device, 8 * self._most),
        )

    def _prev_view(self, prev: Pending | None):
        if prev is not None:
            return rt.HalBufferView(prev.set.next, [self._most], rt.HalElementType.SINT_64)
        if self._no_prev is None:  # no earlier step: a buffer no id points into (its contents unused)
            self._no_prev = _device_buffer(self._device, 8 * self._most)
        return rt.HalBufferView(self._no_prev, [self._most], rt.HalElementType.SINT_64)

    def submit(
        self,
        name: str,
        inputs: Sequence[np.ndarray],
        state: list,
        rows: int,
        logits: bool,
        prev: Pending | None = None,
        extra: Sequence = (),
    ) -> tuple[Pending, list]:
        """Submit entry point `name` on `inputs` (ids, positions, tables, slots: int64 arrays;
        ids < 0 read `prev`'s next tokens, which must not be finished yet), `extra` (DeviceArrays
        after next_out: paged_prefill_mm's features and feature rows) and `state` (DeviceArrays,
        updated in place). `rows`: logits rows it writes; `logits`: read them back. Returns (the
        pending call, the state results as DeviceArrays) at once."""
        s = self._acquire()
        p = Pending(name, s, rows, int(np.asarray(inputs[3]).size), logits, 0)
        try:
            copy, views = self._stage(name, inputs, s.staging[0], s.staging[2], s.inputs)
        except ValueError:
            self._free.append(s)
            raise
        if rows > s.logits_rows:
            s.logits_rows = max(rows, 2 * s.logits_rows)
            s.logits = _device_buffer(self._device, 4 * self._vocab * s.logits_rows)
        views.append(self._prev_view(prev))
        views.append(rt.HalBufferView(s.logits, [rows, self._vocab], rt.HalElementType.FLOAT_32))
        views.append(rt.HalBufferView(s.next, [p.tokens], rt.HalElementType.SINT_64))
        views += [x._buffer_view for x in (*extra, *state)]
        p.keep.extend(extra)  # alive until the call is read

        c, v = self._copy_value, self._step_value
        self._copy_value, self._step_value = c + 1, v + 1
        self._device.queue_execute(copy, _fence(), _fence((self._copies, c + 1)))
        fences = (_fence((self._copies, c + 1), (self._steps, v)), _fence((self._steps, v + 1)))
        if not self._cuda:
            # IREE's local (CPU) devices resolve a step's transient buffer when recording it, which
            # they refuse before its queue_alloca (waiting on this fence) has run: wait here. The
            # order and the results are the same; the host just does not run ahead of a CPU step.
            fences[0].wait()
        results, storage = self._invoke(name, views, fences, len(state))
        if storage is not None:
            p.keep.append(storage)
        out = [rt.DeviceArray(self._device, results.get_as_object(i, rt.HalBufferView)) for i in range(len(results))]

        # the read-back: the next tokens, then (when asked) the logits rows
        nbytes = 8 * p.tokens
        total = _aligned(nbytes) + (4 * self._vocab * rows if logits else 0)
        if total > s.back_bytes:
            s.back_bytes = max(_aligned(total), 2 * s.back_bytes)
            s.back = _pinned(self._device, _BU.TRANSFER_TARGET, s.back_bytes)
        back = rt.HalCommandBuffer(self._device)
        back.copy(s.next, s.back[0], 0, 0, nbytes)
        if logits:
            back.copy(s.logits, s.back[0], 0, _aligned(nbytes), 4 * self._vocab * rows)
        back.end()
        b = self._back_value
        self._back_value = p.back_value = b + 1
        self._device.queue_execute(back, _fence((self._steps, v + 1), (self._backs, b)), _fence((self._backs, b + 1)))
        self._unfinished.append(p)
        return p, out

    def finish(self, p: Pending) -> tuple[np.ndarray | None, np.ndarray]:
        """Wait for `p`'s read-back: (its logits rows [rows, V] or None, its next tokens)."""
        if p.done:
            raise ValueError(f"{p.name}: this call was already finished")
        _fence((self._backs, p.back_value)).wait()
        p.done = True
        self._unfinished.remove(p)
        data = p.set.back[2]
        nxt = data[: 8 * p.tokens].view(np.int64).copy()
        rows = None
        if p.logits:
            at = _aligned(8 * p.tokens)
            rows = data[at : at + 4 * self._vocab * p.rows].view(np.float32).reshape(p.rows, self._vocab).copy()
        self._free.append(p.set)
        p.keep.clear()
        return rows, nxt

    def drain(self) -> None:
        """Wait for every call not yet finished (their results dropped): before the device, its
        buffers and semaphores go away (IREE aborts the process when a semaphore or buffer a
        submission still uses is destroyed)."""
        while self._unfinished:
            self.finish(self._unfinished[0])
