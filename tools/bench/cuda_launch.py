"""Launch day0's hand-written kernels (a PTX of lowering/kernels/) through the CUDA driver on torch
tensors, and time them inside CUDA graphs: the kernels' own device time, without IREE.

GPU-host tool (PyTorch and the CUDA driver; no IREE, no compiler). Used by gpu_topk_check.py
(`kernels`) and gpu_kernel_times.py.

    mod = PtxModule(path)                       # loads into torch's primary context
    mod.launch("day0_x", (gx, gy), [tensor, ..., 7, ...])   # pointers, then i32 push constants
    graph_us([lambda: mod.launch(...)])         # µs per round, median over graph replays

A launch goes to torch's current stream at call time, so the same callable can be captured into
a CUDA graph (torch.cuda.graph makes its capture stream current).
"""

from __future__ import annotations

import ctypes
import statistics
from pathlib import Path


def _driver():
    return ctypes.CDLL("libcuda.so.1")


def c_args(args) -> list:
    """ctypes values of a kernel's arguments: a torch tensor is its device pointer (u64), an int
    a 32-bit push constant (u32 in the PTX; negative values keep their bits)."""
    out = []
    for a in args:
        if isinstance(a, int):
            out.append(ctypes.c_uint32(a & 0xFFFFFFFF))
        elif hasattr(a, "data_ptr"):
            out.append(ctypes.c_void_p(a.data_ptr()))
        else:
            raise TypeError(f"kernel argument {a!r}: expected a torch tensor or an int")
    return out


class PtxModule:
    """A PTX module loaded with cuModuleLoadData into torch's (primary) CUDA context."""

    def __init__(self, ptx: Path | bytes):
        import torch

        self.cuda = _driver()
        torch.zeros(1, device="cuda")  # make torch's primary context current
        self.handle = ctypes.c_void_p()
        data = (ptx if isinstance(ptx, bytes) else Path(ptx).read_bytes()) + b"\0"
        rc = self.cuda.cuModuleLoadData(ctypes.byref(self.handle), data)
        assert rc == 0, f"cuModuleLoadData failed: {rc}"
        self._functions: dict[str, ctypes.c_void_p] = {}

    def function(self, name: str) -> ctypes.c_void_p:
        if name not in self._functions:
            fn = ctypes.c_void_p()
            rc = self.cuda.cuModuleGetFunction(ctypes.byref(fn), self.handle, name.encode())
            assert rc == 0, f"cuModuleGetFunction({name}) failed: {rc}"
            self._functions[name] = fn
        return self._functions[name]

    def launch(self, name: str, grid, args, block: int = 256, shared: int = 0) -> None:
        """One launch of kernel `name` over grid (x[, y[, z]]) on torch's current stream."""
        import torch

        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        if gx * gy * gz == 0:
            return  # an empty grid: nothing to do (IREE dispatches nothing either)
        cargs = c_args(args)
        params = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self.cuda.cuLaunchKernel(self.function(name), gx, gy, gz, block, 1, 1, shared, stream, params, None)
        assert rc == 0, f"cuLaunchKernel({name}) failed: {rc}"


def graph_us(fns, rounds: int = 20, replays: int = 30) -> float:
    """Device µs of one round of `fns` (called in order): a CUDA graph holds `rounds` rounds (no
    launch gaps), it is replayed `replays` times, each timed with CUDA events; the median replay
    over rounds. fns may also be a list of rounds' lists (round i uses fns[i % len(fns)]) to
    rotate among copies of the buffers."""
    import torch

    per_round = [fns] if fns and callable(fns[0]) else list(fns)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (module loads, lazy init) outside the capture
        for group in per_round:
            for f in group:
                f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for r in range(rounds):
            for f in per_round[r % len(per_round)]:
                f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / rounds)
    return statistics.median(times)
