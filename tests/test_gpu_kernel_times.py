"""tools/bench/gpu_kernel_times.py launches day0's kernels without IREE: its launch tables must stay what
the passes dispatch (entry, grid, push constants, binding count) and what the PTX declares."""

import ctypes
import re

import pytest
import torch

from day0.passes import dsa_to_cuda_kernel, indexer_scores_to_cuda_kernel, mxfp4_to_cuda_matvec
from day0.passes.extern_dispatch import kernel_ptx
from day0.tools.bench import cuda_launch, gpu_kernel_times as gkt

PASSES = {gkt.INDEXER_PTX: indexer_scores_to_cuda_kernel, gkt.DSA_PTX: dsa_to_cuda_kernel,
          gkt.MXFP4_PTX: mxfp4_to_cuda_matvec, gkt.MXFP4_GEMM_PTX: mxfp4_to_cuda_matvec}
ABIS = {gkt.MXFP4_GEMM_PTX: mxfp4_to_cuda_matvec.GEMM_ABI}  # a PTX's kernels, where not its pass's KERNEL_ABI


def _entries(ptx: str) -> dict[str, list[str]]:
    return {m.group(1): re.findall(r"\.param \.(\w+)", m.group(2))
            for m in re.finditer(r"\.entry (\w+)\(\s*(.*?)\)", ptx, re.S)}


def _dispatches(text: str, dims: dict[str, int]) -> list[tuple[str, str, tuple, list]]:
    """(executable, entry, grid (3 ints), operand values or None for tensors) of each
    flow.dispatch of a pass's function text, its index/i32 SSA values evaluated; `dims` gives
    the tensor.dim results by SSA name."""
    env: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*(%\w+) = (\S+) (.*)", line)
        if not m:
            continue
        name, op, rest = m.groups()
        args = re.findall(r"%\w+", rest)
        if op == "arith.constant":
            env[name] = int(rest.split(":")[0])
        elif op == "tensor.dim":
            env[name] = dims[name]
        elif op == "arith.index_cast":
            env[name] = env[args[0]]
        elif op in ("arith.muli", "arith.ceildivui", "arith.minui", "arith.maxui"):
            a, b = env[args[0]], env[args[1]]
            env[name] = {"arith.muli": a * b, "arith.ceildivui": -(-a // b), "arith.minui": min(a, b),
                         "arith.maxui": max(a, b)}[op]
    out = []
    for m in re.finditer(r"flow\.dispatch @(\w+)::@(\w+)\[([^\]]*)\]\(([^)]*)\)", text):
        grid = tuple(env[g.strip()] for g in m.group(3).split(","))
        out.append((m.group(1), m.group(2), grid + (1,) * (3 - len(grid)),
                    [env.get(a.strip()) for a in m.group(4).split(",")]))
    return out


def _abi_row(ptx: str, entry: str):
    return next(row for row in ABIS.get(ptx, PASSES[ptx].KERNEL_ABI) if row[0] == entry)


def _same(launch: gkt.Launch, dispatch) -> None:
    _, entry, grid, operands = dispatch
    name, read_only, constants, workload = _abi_row(launch.ptx, entry)
    assert launch.entry == entry
    assert launch.grid == grid, entry
    assert launch.block == PASSES[launch.ptx].THREADS
    assert len(launch.buffers) == len(read_only) and len(launch.constants) == constants, entry
    # push constants first (i32 bits), then the operand tensors
    assert [c & 0xFFFFFFFF for c in launch.constants] == [v & 0xFFFFFFFF for v in operands[:constants]], entry
    assert all(v is None for v in operands[constants:]), entry


def test_script_geometry_constants_are_the_passes():
    P = indexer_scores_to_cuda_kernel
    assert (gkt.INDEXER_PTX, gkt.INDEXER_KEYS_PER_CTA, gkt.INDEXER_MMA_CTAS, gkt.INDEXER_MMA_MAX_KEYS) == (
        P.KERNEL_PTX, P.KEYS_PER_CTA, P.MMA_CTAS, P.MMA_MAX_KEYS)
    assert (gkt.DSA_PTX, gkt.DSA_ROWS_PER_SPLIT, gkt.DSA_HEADS_PER_CTA) == (
        dsa_to_cuda_kernel.KERNEL_PTX, dsa_to_cuda_kernel.ROWS_PER_SPLIT, dsa_to_cuda_kernel.HEADS_PER_CTA)
    P2 = dsa_to_cuda_kernel
    assert (gkt.DSA_MMA_HEADS_PER_CTA, gkt.DSA_MMA_MAX_V, gkt.DSA_MMA_V_PER_CTA, gkt.DSA_MMA_ROWS_DECODE,
            gkt.DSA_MMA_ROWS_PREFILL) == (P2.MMA_HEADS_PER_CTA, P2.MMA_MAX_V, P2.MMA_V_PER_CTA, P2.MMA_ROWS_DECODE,
                                          P2.MMA_ROWS_PREFILL)
    for dt in ("f32", "bf16"):
        for S in (1, 2, None):
            for D, V in ((512, 512), (576, 512), (64, 64), (72, 64), (100, 64), (576, 520), (64, 72), (1024, 1024)):
                assert gkt.dsa_mma_rows(dt, S, D, V) == P2.mma_rows(dt, S, D, V), (dt, S, D, V)
    assert (gkt.MXFP4_PTX, gkt.MXFP4_ROWS_PER_CTA) == (mxfp4_to_cuda_matvec.KERNEL_PTX, mxfp4_to_cuda_matvec.ROWS_PER_CTA)
    assert (gkt.MXFP4_GEMM_PTX, gkt.MXFP4_GEMM_COLS_PER_CTA) == (mxfp4_to_cuda_matvec.GEMM_PTX,
                                                             mxfp4_to_cuda_matvec.GEMM_COLS_PER_CTA)
    assert gkt.THREADS == P.THREADS == dsa_to_cuda_kernel.THREADS == mxfp4_to_cuda_matvec.THREADS
    for T in (1, 127, 128, 129, 32768, 131072, 1 << 20, 5_000_000):
        for kernel in ("f32", "bf16", "bf16_mma"):
            assert gkt.indexer_grid_x(kernel, T) == P.grid_x(kernel, T)


@pytest.mark.parametrize("T", gkt.CONTEXTS)
def test_indexer_launch_is_the_pass_dispatch(T):
    P = indexer_scores_to_cuda_kernel
    H, D, scale = gkt.INDEXER["H"], gkt.INDEXER["D"], gkt.INDEXER["scale"]
    for kernel in ("f32", "bf16", "bf16_mma"):
        launch = gkt.indexer_launch(kernel, 1, H, D, T, scale)
        for static_t in (T, None):  # the dynamic-T form computes the same grid at run time
            (d,) = _dispatches(P.function_text(kernel, H, D, static_t, scale), {"%s": 1, "%t": T})
            assert d[0] == P.EXECUTABLE
            _same(launch, d)
    launches = gkt.all_launches()
    assert launches[f"indexer_bf16_mma_T{T}"] == gkt.indexer_launch("bf16_mma", 1, H, D, T, scale)


@pytest.mark.parametrize("T", gkt.CONTEXTS)
def test_dsa_launches_are_the_pass_dispatches(T):
    c = gkt.DSA
    rows = dsa_to_cuda_kernel.mma_rows("bf16", 1, c["D"], c["V"])
    assert rows == dsa_to_cuda_kernel.MMA_ROWS_DECODE  # the benchmark times the tensor-core kernels
    text = dsa_to_cuda_kernel.function_text("bf16", c["H"], c["D"], T, c["K"], c["V"], c["D"] ** -0.5, rows)
    partial, combine = _dispatches(text, {"%s": 1})
    launches = gkt.all_launches()
    _same(launches[f"dsa_partial_T{T}"], partial)
    _same(launches[f"dsa_combine_T{T}"], combine)
    _dsa_out_is_f32(text, c["H"], c["V"])


def _dsa_out_is_f32(text: str, H: int, V: int) -> None:
    """The combine dispatch (and the function) returns what the script's out buffer holds: f32
    for either q/kv dtype."""
    (result,) = re.findall(r"flow\.dispatch @\w+::@day0_dsa_combine_\w+\[[^\n]*\n[^\n]*-> (tensor<[^>]*>)", text)
    assert result == f"tensor<?x{H}x{V}x{gkt.DSA_OUT_DTYPE}>" == f"tensor<?x{H}x{V}xf32>"
    assert re.search(r"-> " + re.escape(result) + r" \{", text), "the function's result type"


@pytest.mark.parametrize("dt,S,H,D,T,K,V", [("bf16", 3, 64, 576, 4096, 2048, 512), ("bf16", 1, 40, 72, 100, 77, 64),
                                            ("bf16", 2, 128, 576, 700, 100, 512), ("bf16", 1, 16, 100, 64, 300, 64),
                                            ("f32", 1, 64, 576, 4096, 2048, 512), ("f32", 2, 8, 96, 64, 300, 64)])
def test_dsa_launch_tables_for_other_shapes(dt, S, H, D, T, K, V):
    """dsa_launches (the check cases') against the pass for prefill, odd shapes and f32; and the
    f32-arithmetic launches (fma=True) against the pass's text without the tensor-core kernels."""
    rows = dsa_to_cuda_kernel.mma_rows(dt, S, D, V)
    for fma in (False, True):
        text = dsa_to_cuda_kernel.function_text(dt, H, D, T, K, V, D ** -0.5, None if fma else rows)
        partial, combine = _dispatches(text, {"%s": S})
        p, c = gkt.dsa_launches(dt, S, H, D, T, K, V, D ** -0.5, fma=fma)
        _same(p, partial)
        _same(c, combine)
        _dsa_out_is_f32(text, H, V)


def test_moe_launches_are_the_pass_dispatches():
    c = gkt.MOE
    E, k, hid, inter = c["E"], c["k"], c["hidden"], c["intermediate"]
    launches = gkt.all_launches()
    (gu,) = _dispatches(mxfp4_to_cuda_matvec.function_text(True, E, 2 * inter, hid, k), {"%t": 1})
    (dn,) = _dispatches(mxfp4_to_cuda_matvec.function_text(True, E, hid, inter, 1), {"%t": k})
    _same(launches["moe_gate_up"], gu)
    _same(launches["moe_down"], dn)


def test_moe_gemm_launches_are_the_pass_dispatches():
    """moe_gemm's launches (the prefill chunk's shapes, and its T = 3 case, which a dynamic-T site
    dispatches at run time) are the pass's GEMM dispatch; its matvec launches are the pass's text
    with gemm off. The pass takes the GEMM for the prefill chunk and keeps the matvec for the
    `moe` piece's decode shapes."""
    P = mxfp4_to_cuda_matvec
    E = gkt.PREFILL_MOE["E"]
    launches = gkt.all_launches()
    for name, (T, k, N, K) in gkt.moe_gemm_shapes().items():
        assert launches[f"moe_gemm_{name}"] == gkt.mxfp4_gemm_launch(T, k, E, N, K)
        assert P.takes_gemm(True, T, k) and P.takes_gemm(True, None, k)
        for t in (T, 3):
            gemm_launch, matvec_launch = gkt.mxfp4_gemm_launch(t, k, E, N, K), gkt.mxfp4_launch(t, k, E, N, K)
            for gemm, launch in ((True, gemm_launch), (False, matvec_launch)):
                (d,) = _dispatches(P.function_text(True, E, N, K, k, gemm), {"%t": t})
                assert d[0] == (P.GEMM_EXECUTABLE if gemm else P.EXECUTABLE)
                _same(launch, d)
    k = gkt.MOE["k"]
    assert not P.takes_gemm(True, 1, k) and not P.takes_gemm(True, k, 1)  # decode: gate_up, down


def test_launches_match_the_ptx_entries():
    entries = {}
    for launch in gkt.all_launches().values():
        if launch.ptx not in entries:
            entries[launch.ptx] = _entries(kernel_ptx(launch.ptx).decode())
        params = entries[launch.ptx].get(launch.entry)
        assert params is not None, f"{launch.entry} is not an entry of {launch.ptx}"
        assert params == ["u64"] * len(launch.buffers) + ["u32"] * len(launch.constants), launch.entry
    assert "day0_topk_hist" in _entries(kernel_ptx(gkt.TOPK_PTX).decode())


def test_c_args():
    t = torch.zeros(4)
    a = cuda_launch.c_args([t, 7, -1])
    assert isinstance(a[0], ctypes.c_void_p) and a[0].value == t.data_ptr()
    assert [x.value for x in a[1:]] == [7, 0xFFFFFFFF]
    assert all(ctypes.sizeof(x) == 4 for x in a[1:])
    with pytest.raises(TypeError):
        cuda_launch.c_args([1.5])
