"""`StepCaller`: the Engine's paged entry points called with one host wait a step.

`iree.runtime.FunctionInvoker` (what `VmModule.function` hands out) costs more host time than
a one-sequence decode step on the GPU can spare (docs/perf.md, "Host cost of an Engine step"):
  * each numpy argument becomes a fresh device buffer, allocated and copied synchronously;
  * the synchronous entry point waits for the device before it returns;
  * each `DeviceArray.to_host()` registers a fresh numpy array with the driver (pinned memory)
    and waits again.
Here the buffers are made once and reused by every call:
  * the step's integer inputs are written into one pinned host buffer and copied, by one
    command buffer, into device buffers of the largest size any call needs (a buffer view of
    the call's shape over each);
  * the entry point's `$async` variant waits for that copy on the device, not on the host;
  * the results the caller reads (the next tokens; the logits rows when some request samples
    on the host) are copied into one pinned read-back buffer after the step, also on the
    device, and the host waits once, for that copy.
The three submissions are ordered by one timeline semaphore. That read-back is recorded before
the step has run, while its results are transient buffers not yet allocated: the CUDA driver
records command buffers for later replay (`--cuda_use_streams`' deferred command buffers), so
it resolves them when the copy is issued; IREE's local (CPU) devices resolve them while
recording and refuse, so there the host waits for the step first (two waits; a CPU step is
milliseconds). Calls are synchronous as seen by the caller: when `__call__` returns the step has
run, the results are on the host and the input buffers may be rewritten by the next call.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from iree import runtime as rt

_ALIGN = 256  # bytes between the pieces of the staging and read-back buffers
_MT, _BU = rt.MemoryType, rt.BufferUsage


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


class StepCaller:
    """Calls entry points of one loaded module (`VmModule`) whose arguments are int64 inputs
    followed by device state, and whose results are outputs (the logits, the greedy next tokens
    when the entry point has them) followed by the state: the Engine's paged steps and Session's
    calls."""

    def __init__(self, vm, input_elements: Sequence[int]):
        """`input_elements[i]`: the most elements input i of any call holds."""
        self._vm, self._device = vm, vm.device
        alloc = self._device.allocator
        self._sizes = [8 * int(n) for n in input_elements]
        self._offsets = list(itertools.accumulate((_aligned(s) for s in self._sizes), initial=0))
        self._staging, self._staging_map, self._staged = _pinned(self._device, _BU.TRANSFER_SOURCE, self._offsets[-1])
        self._inputs = [
            alloc.allocate_buffer(
                memory_type=int(_MT.DEVICE_LOCAL), allowed_usage=int(_BU.DEFAULT), allocation_size=max(s, 8)
            )
            for s in self._sizes
        ]
        self._readback, self._readback_bytes = None, 0
        self._semaphore = self._device.create_semaphore(0)
        self._value = 0
        self._functions: dict[str, object] = {}
        self._record_early = vm.device_name == "cuda"  # module docstring

    def _function(self, name: str):
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = self._vm.async_function(name)
        return fn

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
        copy = rt.HalCommandBuffer(self._device)
        views = []
        for a, off, buf, most in zip(inputs, self._offsets, self._inputs, self._sizes):
            a = np.ascontiguousarray(a, dtype=np.int64)
            if a.nbytes > most:
                raise ValueError(
                    f"{name}: an input of {a.size} elements exceeds the {most // 8} its buffers were sized for"
                )
            self._staged[off : off + a.nbytes] = a.reshape(-1).view(np.uint8)
            copy.copy(self._staging, buf, off, 0, a.nbytes)
            views.append(rt.HalBufferView(buf, list(a.shape), rt.HalElementType.SINT_64))
        copy.end()
        v = self._value
        self._value = v + 3
        self._device.queue_execute(copy, self._fence(v), self._fence(v + 1))

        args = rt.VmVariantList(len(views) + len(state) + 2)
        for x in views:
            args.push_ref(x.ref)
        for x in state:
            args.push_ref(x._buffer_view.ref)
        args.push_ref(self._fence(v + 1).ref)
        args.push_ref(self._fence(v + 2).ref)
        results = rt.VmVariantList(len(state) + outputs)
        self._vm.invoke(self._function(name), args, results)
        out = [results.get_as_object(i, rt.HalBufferView) for i in range(len(results))]

        if not self._record_early:
            self._fence(v + 2).wait()
        back = rt.HalCommandBuffer(self._device)
        pieces, at = [], 0
        for i in read:
            bv = out[i]
            dtype = rt.HalElementType.map_to_dtype(bv.element_type)
            pieces.append((at, bv, np.dtype(dtype)))
            at += _aligned(bv.byte_length)
        host = self._read_buffer(at) if read else None
        for at_i, bv, _ in pieces:
            back.copy(bv.get_buffer(), self._readback, 0, at_i, bv.byte_length)
        back.end()
        self._device.queue_execute(back, self._fence(v + 2), self._fence(v + 3))
        self._fence(v + 3).wait()
        copies = [host[at_i : at_i + bv.byte_length].view(dtype).reshape(bv.shape).copy() for at_i, bv, dtype in pieces]
        return copies, [rt.DeviceArray(self._device, bv) for bv in out[outputs:]]
