"""tools/bench/gpu_kernel_times.py launches day0's kernels without IREE, with the geometry of
lowering/kernel_geometry.py that the passes read too. Pinned here: each launch is what the pass's
dispatch text says (executable, entry, grid, push constants, binding count, CTA size), for sizes
the text computes at run time too, and each launch's entry is in the PTX with those parameters."""

import ctypes
import re

import pytest
import torch

from day0.lowering import kernel_geometry as kg
from day0.passes import (
    dsa_to_cuda_kernel,
    indexer_scores_to_cuda_kernel,
    matmul_to_cuda_linear,
    mxfp4_to_cuda_matvec,
    topk_to_radix_select,
    vision_attention_to_cuda_kernel,
)
from day0.passes.extern_dispatch import kernel_ptx
from day0.tools import build_kernels
from day0.tools.bench import cuda_launch
from day0.tools.bench import gpu_kernel_times as gkt
from day0.tools.bench import gpu_linear_check as glc
from day0.tools.bench import gpu_vision_attention_check as gvc

KERNEL_SETS = {ks.ptx: ks for ks in kg.KERNEL_SETS}


def _entries(ptx: str) -> dict[str, list[str]]:
    return {
        m.group(1): re.findall(r"\.param \.(\w+)", m.group(2))
        for m in re.finditer(r"\.entry (\w+)\(\s*(.*?)\)", ptx, re.S)
    }


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
            env[name] = {
                "arith.muli": a * b,
                "arith.ceildivui": -(-a // b),
                "arith.minui": min(a, b),
                "arith.maxui": max(a, b),
            }[op]
    out = []
    for m in re.finditer(r"flow\.dispatch @(\w+)::@(\w+)\[([^\]]*)\]\(([^)]*)\)", text):
        grid = tuple(env[g.strip()] for g in m.group(3).split(","))
        out.append(
            (m.group(1), m.group(2), grid + (1,) * (3 - len(grid)), [env.get(a.strip()) for a in m.group(4).split(",")])
        )
    return out


def _check_dispatch(dispatch, kernels: kg.KernelSet, grid: tuple, constants: tuple) -> None:
    """A pass's dispatch is of an entry of `kernels` over `grid` with push constants `constants`
    (compared as i32 bits), then only tensors."""
    executable, entry, got_grid, operands = dispatch
    _, read_only, n_constants, workload = kernels.entry(entry)
    assert executable == kernels.executable, entry
    assert got_grid == grid and grid[workload:] == (1,) * (3 - workload), entry
    assert len(constants) == n_constants, entry
    assert [c & 0xFFFFFFFF for c in constants] == [v & 0xFFFFFFFF for v in operands[:n_constants]], entry
    assert all(v is None for v in operands[n_constants:]) and len(operands) - n_constants <= len(read_only), entry


def _same(launch: gkt.Launch, dispatch) -> None:
    """The tool's launch is the pass's dispatch."""
    kernels = KERNEL_SETS[launch.ptx]
    assert launch.entry == dispatch[1] and launch.block == kernels.threads
    assert len(launch.buffers) == len(kernels.entry(launch.entry).read_only), launch.entry
    _check_dispatch(dispatch, kernels, launch.grid, launch.constants)


@pytest.mark.parametrize("S,T", [(1, T) for T in gkt.CONTEXTS] + [(3, 1), (2, 127), (1, 5_000_000)])
def test_indexer_launches_are_the_pass_dispatches(S, T):
    P = indexer_scores_to_cuda_kernel
    H, D, scale = gkt.INDEXER["H"], gkt.INDEXER["D"], gkt.INDEXER["scale"]
    for kernel in kg.INDEXER_KERNELS:
        launch = gkt.indexer_launch(kernel, S, H, D, T, scale)
        for static_t in (T, None):  # the dynamic-T form computes the same grid at run time
            (d,) = _dispatches(P.function_text(kernel, H, D, static_t, scale), {"%s": S, "%t": T})
            _same(launch, d)
    if S == 1 and T in gkt.CONTEXTS:
        assert gkt.all_launches()[f"indexer_bf16_mma_T{T}"] == gkt.indexer_launch("bf16_mma", 1, H, D, T, scale)


DSA_CASES = [("bf16", 1, 64, 512, T, 2048, 512) for T in gkt.CONTEXTS] + [
    ("bf16", 512, 16, 576, 4224, 2048, 512),
    ("bf16", 3, 64, 576, 4096, 2048, 512),
    ("bf16", 1, 40, 72, 100, 77, 64),
    ("bf16", 2, 128, 576, 700, 100, 512),
    ("bf16", 1, 16, 100, 64, 300, 64),
    ("f32", 1, 64, 576, 4096, 2048, 512),
    ("f32", 2, 8, 96, 64, 300, 64),
]


@pytest.mark.parametrize("dt,S,H,D,T,K,V", DSA_CASES)
def test_dsa_launches_are_the_pass_dispatches(dt, S, H, D, T, K, V):
    """The pass's kernels for the site (the bench's decode shapes, its prefill chunk, the check
    cases), the f32-arithmetic ones (fma=True: the pass with tensor-cores=false) and the other
    split sizes the bench times; the combine returns f32 for either dtype (the tool's out buffer)."""
    P, scale = dsa_to_cuda_kernel, D**-0.5
    rows = kg.dsa_mma_rows(dt, S, D, V)
    variants = [(None, False, rows), (None, True, None)] + [(r, False, r) for r in (16, 64) if rows is not None]
    for bench_rows, fma, pass_rows in variants:
        text = P.function_text(dt, H, D, T, K, V, scale, pass_rows)
        partial, combine = _dispatches(text, {"%s": S})
        p, c = gkt.dsa_launches(dt, S, H, D, T, K, V, scale, rows=bench_rows, fma=fma, split=False)
        _same(p, partial)
        _same(c, combine)
        assert re.search(rf"-> tensor<\?x{H}x{V}xf32>\{{%s\}}\n    return", text), "the combine's f32 result"
    vp = kg.dsa_mma_vparts(H)
    if rows is not None and vp > 1:  # the pass's default (split-scores=true): the _vp partial
        partial, combine = _dispatches(P.function_text(dt, H, D, T, K, V, scale, rows, vp), {"%s": S})
        p, c = gkt.dsa_launches(dt, S, H, D, T, K, V, scale, split=True)
        assert p.entry == f"day0_dsa_partial_bf16_mma_vp{vp}"
        _same(p, partial)
        _same(c, combine)
    if S == 1 and dict(H=H, D=D, K=K, V=V) == gkt.DSA:  # a shape `dsa` times
        assert rows == kg.DSA_MMA_ROWS_DECODE  # the benchmark times the tensor-core kernels
        launches = gkt.all_launches()
        assert (launches[f"dsa_partial_T{T}"], launches[f"dsa_combine_T{T}"]) == gkt.dsa_launches(
            dt, S, H, D, T, K, V, scale
        )


def test_moe_launches_are_the_pass_dispatches():
    """The matvec at the `moe` piece's decode shapes (which the pass keeps on the matvec), the
    grouped GEMM at the prefill chunk's shapes and at T = 3 (what a dynamic-T site dispatches at
    run time), the few-rows GEMM at a batched decode step's shapes, the same inputs on the other
    kernels (the pass with gemm=false or few=false), and mxfp4_linear (the matvec with one
    expert)."""
    P = mxfp4_to_cuda_matvec
    E, k, hid, inter = gkt.MOE["E"], gkt.MOE["k"], gkt.MOE["hidden"], gkt.MOE["intermediate"]
    launches = gkt.all_launches()
    for name, (T, kk, N, K) in (("moe_gate_up", (1, k, 2 * inter, hid)), ("moe_down", (k, 1, hid, inter))):
        assert kg.mxfp4_kernel(True, T, kk, E) == "matvec"
        (d,) = _dispatches(P.function_text(True, E, N, K, kk), {"%t": T})
        _same(launches[name], d)
    # one token's down projection from its experts' gate_up rows (mxfp4_moe_swiglu): the matvec's
    # SwiGLU entry, the clamp's bits a fifth constant
    (d,) = _dispatches(P.function_text(True, E, hid, inter, 1, "matvec", gkt.SWIGLU_LIMIT), {"%t": k})
    _same(launches["moe_down_swiglu"], d)
    E = gkt.PREFILL_MOE["E"]
    shapes = [(n, shape, "gemm") for n, shape in gkt.moe_gemm_shapes().items()]
    shapes += [(n, shape, "few") for n, shape in gkt.moe_batch_shapes().items()]
    for name, (T, kk, N, K), kernel in shapes:
        assert kg.mxfp4_kernel(True, T, kk, E) == kernel
        assert kg.mxfp4_kernel(True, None, kk, E) == "gemm"  # a dynamic T: prefill
        assert launches[f"moe_gemm_{name}"] == gkt.mxfp4_gemm_launch(T, kk, E, N, K, kernel)
        for t in (T, 3):
            for fn_kernel, launch in (
                ("gemm", gkt.mxfp4_gemm_launch(t, kk, E, N, K)),
                ("few", gkt.mxfp4_gemm_launch(t, kk, E, N, K, "few")),
                ("matvec", gkt.mxfp4_launch(t, kk, E, N, K)),
            ):
                (d,) = _dispatches(P.function_text(True, E, N, K, kk, fn_kernel), {"%t": t})
                _same(launch, d)
    (d,) = _dispatches(P.function_text(False, 1, 100, 64, 1), {"%t": 5})
    _same(gkt.mxfp4_launch(5, 1, 1, 100, 64), d)


def test_moe_kernel_choice():
    """One sequence's decode (k rows) keeps the matvec; a batched decode step with at most 16 rows an
    expert on average takes the few-rows GEMM; more rows, or a dynamic T, the 64-row GEMM."""
    assert kg.mxfp4_kernel(False, 64, 1, 1) == "matvec"  # mxfp4_linear
    assert kg.mxfp4_kernel(True, 1, 8, 64) == "matvec"
    assert kg.mxfp4_kernel(True, 7, 8, 64) == "matvec"  # 56 rows < one 64-row tile
    assert kg.mxfp4_kernel(True, 8, 8, 64) == "few"
    assert kg.mxfp4_kernel(True, 128, 8, 64) == "few"  # 16 an expert
    assert kg.mxfp4_kernel(True, 129, 8, 64) == "gemm"
    assert kg.mxfp4_kernel(True, 512, 8, 64) == "gemm"  # a static prefill chunk
    assert kg.mxfp4_kernel(True, None, 8, 256) == "gemm"


@pytest.mark.parametrize("rows,n,k", [(1, 32768, 2048), (1, 1 << 20, 2048), (64, 4096, 8), (3, 8193, 64)])
def test_topk_grids_are_the_pass_dispatches(rows, n, k):
    """gpu_topk_check launches the radix select over kernel_geometry.topk_grid, with (n, segments[,
    k]) or (n, k) as push constants: what the pass's functions dispatch."""
    P = topk_to_radix_select
    forms = [(P.select_function_text(k), ("day0_topk_hist", "day0_topk_collect", "day0_topk_finish"))]
    if kg.topk_is_small(n):
        forms.append((P.small_function_text(k), ("day0_topk_small",)))
    segs = kg.topk_segments(n)
    constants = {
        "day0_topk_hist": (n, segs),
        "day0_topk_collect": (n, segs, k),
        "day0_topk_finish": (n, k),
        "day0_topk_small": (n, k),
    }
    for text, entries in forms:
        dispatches = _dispatches(text, {"%t": rows, "%n": n})
        assert tuple(d[1] for d in dispatches) == entries
        for d in dispatches:
            _check_dispatch(d, kg.TOPK_SELECT, kg.topk_grid(d[1], rows, n), constants[d[1]])


def test_linear_launches_are_the_pass_dispatches():
    """gpu_linear_check launches the linear kernel as the pass dispatches it, at the bench's shapes
    and rows and at the check cases; at another cluster size too (the bench times them all)."""
    cases = [(M, N, K) for (N, K) in glc.SHAPES.values() for M in (64, 16, 4, 1)] + glc.CHECKS
    for M, N, K in cases:
        (d,) = _dispatches(matmul_to_cuda_linear.function_text(M, N, K), {})
        _same(glc.linear_launch(M, N, K), d)
        S = kg.linear_cluster(M, N, K)
        assert glc.linear_launch(M, N, K).entry == kg.linear_entry(S)
        for other in kg.LINEAR_CLUSTERS:
            launch = glc.linear_launch(M, N, K, other)
            assert launch.grid == (kg.cdiv(N, kg.LINEAR_COLS), other, 1) and launch.constants == (M, N, K)
    entries = _entries(kernel_ptx(kg.LINEAR_BF16.ptx).decode())
    for S in kg.LINEAR_CLUSTERS:
        assert entries[kg.linear_entry(S)] == ["u64"] * 3 + ["u32"] * 3


def test_vision_attention_launches_are_the_pass_dispatches():
    """gpu_vision_attention_check launches the kernel as the pass dispatches it, for every entry
    at its check shapes and at the release tower's (16 heads of 64) bench patch counts."""
    cases = [(P, H, D) for D in kg.VISION_HEAD_DIMS for P, H, _ in gvc.CHECKS]
    cases += [(P, gvc.RELEASE["H"], gvc.RELEASE["D"]) for P in gvc.BENCH_P]
    for P, H, D in cases:
        for terms in kg.VISION_TERMS:
            (d,) = _dispatches(vision_attention_to_cuda_kernel.function_text(P, H, D, terms, D**-0.5), {})
            _same(gvc.launch(P, H, D, terms, D**-0.5), d)
            assert d[2] == (kg.cdiv(P, kg.VISION_QROWS), H, 1)
    entries = _entries(kernel_ptx(kg.VISION_ATTENTION.ptx).decode())
    assert {kg.vision_entry(D, t) for D in kg.VISION_HEAD_DIMS for t in kg.VISION_TERMS} == set(entries)


def test_linear_cluster_choice():
    """The largest cluster whose grid stays within two CTAs an SM while each CTA keeps two stages
    of K; large N (many column tiles) or short K take smaller clusters, down to none."""
    assert kg.linear_cluster(64, 2048, 2048) == 8  # 32 column tiles × 8
    assert kg.linear_cluster(64, 1488, 2048) == 8
    assert kg.linear_cluster(64, 3072, 768) == 4  # 48 tiles; K = 768 is 6 stages of 128 for 8
    assert kg.linear_cluster(16, 3072, 768) == 2  # stages of 128 below 33 rows
    assert kg.linear_cluster(64, 18432, 2048) == 1  # 288 tiles
    assert kg.linear_cluster(64, 32000, 2048) == 1
    assert kg.linear_cluster(64, 2048, 18432) == 8
    assert kg.linear_cluster(4, 100, 64) == 1  # K below two stages
    assert kg.linear_limits(65, 64) and kg.linear_limits(4, 12) and kg.linear_limits(64, 2048) is None


def test_launches_match_the_ptx_entries():
    launches = [*gkt.all_launches().values(), *(gkt.dsa_launches("f32", 2, 8, 96, 64, 300, 64, 0.1))]
    entries = {}
    for launch in launches:
        if launch.ptx not in entries:
            entries[launch.ptx] = _entries(kernel_ptx(launch.ptx).decode())
        params = entries[launch.ptx].get(launch.entry)
        assert params is not None, f"{launch.entry} is not an entry of {launch.ptx}"
        assert params == ["u64"] * len(launch.buffers) + ["u32"] * len(launch.constants), launch.entry
    topk = _entries(kernel_ptx(kg.TOPK_SELECT.ptx).decode())
    for name, read_only, constants, _ in kg.TOPK_SELECT.entries:
        assert topk[name] == ["u64"] * len(read_only) + ["u32"] * constants, name


def test_each_kernel_source_has_one_kernel_set():
    """Every lowering/kernels/*.cu is described once, with its PTX and executable named after it."""
    sources = sorted(p.name for p in build_kernels.KERNELS.glob("*.cu"))
    assert sorted(ks.source for ks in kg.KERNEL_SETS) == sources
    for ks in kg.KERNEL_SETS:
        assert ks.ptx == build_kernels.ptx_path(build_kernels.KERNELS / ks.source).name
        assert ks.executable == "day0_" + ks.source.removesuffix(".cu")
    assert len({ks.executable for ks in kg.KERNEL_SETS}) == len(kg.KERNEL_SETS)


def test_kernel_geometry_imports_nothing_but_the_standard_library():
    """A GPU host imports it without IREE, torch or numpy (bench packages ship it alone)."""
    import subprocess
    import sys

    code = (
        "import sys; import day0.lowering.kernel_geometry; "
        "bad = sorted(m for m in ('iree', 'torch', 'numpy', 'day0.passes', 'day0.frontend') if m in sys.modules); "
        "assert not bad, bad"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_c_args():
    t = torch.zeros(4)
    a = cuda_launch.c_args([t, 7, -1])
    assert isinstance(a[0], ctypes.c_void_p) and a[0].value == t.data_ptr()
    assert [x.value for x in a[1:]] == [7, 0xFFFFFFFF]
    assert all(ctypes.sizeof(x) == 4 for x in a[1:])
    with pytest.raises(TypeError):
        cuda_launch.c_args([1.5])


def test_moe_route_launches_are_the_pass_dispatches():
    """The router piece launches what moe-route-to-cuda-kernel dispatches, for every router it
    checks and token counts that fill the last CTA or not; each router is within the kernel's
    limits."""
    from day0.passes import moe_route_to_cuda_kernel as P

    launches = gkt.all_launches()
    for name, router in gkt.ROUTERS.items():
        assert kg.moe_route_limits(*router[:4]) is None, name
        assert launches[f"moe_route_{name}"] == gkt.moe_route_launch(64, *router)
        for S in (1, 5, 64, 65):
            (d,) = _dispatches(P.function_text(*router), {"%dim": S, "%s": S})
            _same(gkt.moe_route_launch(S, *router), d)
