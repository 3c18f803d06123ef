"""Launch geometry of day0's hand-written CUDA kernels (lowering/kernels/*.cu), one section per
kernel set (one .cu, its committed PTX, one `hal.executable.source`): the entries' ABI, the
constants of the .cu that fix the grid, and the grid each entry is launched over.

The passes that dispatch the kernels (passes/*_to_cuda_*.py, topk_to_radix_select.py) and the
GPU-host tools that launch them without IREE (tools/bench/gpu_kernel_times.py, gpu_topk_check.py)
read this one module, so a tool launches exactly what a pass emits. Standard library only: a GPU
host has PyTorch but no IREE compiler, and imports this file on its own (bench packages ship it).

ABI (IREE's CUDA ABI of an external dispatch): one pointer per binding, in dispatch order (the
operands, then the results not tied to an operand), then one 32-bit value per push constant. The
dispatch's workload is the CUDA grid (x, y, z), missing dims 1. Every kernel runs THREADS threads
a CTA. Adding a kernel: the .cu (and its PTX), its section here, its pass, and tests.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import NamedTuple

THREADS = 256  # CTA size of every kernel (THREADS in the .cu files; mxfp4_matvec.cu: 8 warps)


class Entry(NamedTuple):
    """One kernel of a set: entry name, read-only flag per binding (in binding order), number of
    i32 push constants, and how many grid dims the dispatch's workload gives."""

    name: str
    read_only: tuple[bool, ...]
    constants: int
    workload: int


@dataclass(frozen=True)
class KernelSet:
    """The kernels of one .cu: `executable` names the `hal.executable.source` that declares them,
    `ptx` the committed lowering/kernels/ file it embeds; entries in ordinal order."""

    executable: str
    source: str
    ptx: str
    entries: tuple[Entry, ...]
    threads: int = THREADS

    def entry(self, name: str) -> Entry:
        return next(e for e in self.entries if e.name == name)


Grid = tuple[int, int, int]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def f32_bits(x: float) -> int:
    """The f32 bits of x as a signed i32: how a float travels as a push constant."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


# ---------------------------------------------------------------------------------------------
# indexer_scores.cu: day0::indexer_scores, out [S, T] f32 = Σ_h w[s, h] · relu(scale · q[s, h]·keys[t])

# f32 keys (exact FMAs) | bf16 keys, exact FMAs | bf16 keys on tensor cores (q as two bf16 terms);
# then the same three reading key t of query s at row rows[s, t] of a pool (day0::indexer_scores_rows)
INDEXER_KERNELS = ("f32", "bf16", "bf16_mma")
INDEXER_ROWS_KERNELS = tuple(f"rows_{k}" for k in INDEXER_KERNELS)
# and reading slot t at row rows[t] of a cache or pool, empty past query s's last[s] (day0::indexer_scores_causal)
INDEXER_CAUSAL_KERNELS = tuple(f"causal_{k}" for k in INDEXER_KERNELS)


def indexer_entry(kernel: str) -> str:
    return f"day0_indexer_scores_{kernel}"


INDEXER_SCORES = KernelSet(
    "day0_indexer_scores",
    "indexer_scores.cu",
    "indexer_scores.sm_90.ptx",
    # q, keys, w | out ; H, D, T, scale bits, S ; grid indexer_grid(kernel, S, T, H)
    tuple(Entry(indexer_entry(kernel), (True, True, True, False), 5, 2) for kernel in INDEXER_KERNELS)
    # q, keys, rows, w | out ; the same constants and grid
    + tuple(Entry(indexer_entry(kernel), (True, True, True, True, False), 4, 2) for kernel in INDEXER_ROWS_KERNELS)
    # q, keys, rows, last, w | out ; H, D, T, scale bits, S ; grid indexer_grid(kernel, S, T, H)
    + tuple(Entry(indexer_entry(kernel), (True,) * 5 + (False,), 5, 2) for kernel in INDEXER_CAUSAL_KERNELS),
)
INDEXER_KEYS_PER_CTA = 128  # KEYS in the .cu
INDEXER_MAX_H, INDEXER_MAX_D = 64, 128  # the kernels' shared-memory layout (MAX_H, MAX_D)
# Tensor-core kernel: at most one wave of CTAs a query (H200: 132 SMs × 2 CTAs), each taking a
# contiguous range of 16-key tiles (long CTAs amortize converting q), but at most
# INDEXER_MMA_MAX_KEYS keys a CTA. Grids compared: docs/perf.md, "day0's kernels alone".
INDEXER_MMA_CTAS = 264
INDEXER_MMA_MAX_KEYS = 2048


def indexer_grid_x(kernel: str, T: int) -> int:
    """CTAs per query for `kernel` over T keys: ceil(T / 128), and for bf16_mma at most
    max(INDEXER_MMA_CTAS, ceil(T / INDEXER_MMA_MAX_KEYS)) (the kernel takes any grid x)."""
    x = cdiv(T, INDEXER_KEYS_PER_CTA)
    return min(x, max(INDEXER_MMA_CTAS, cdiv(T, INDEXER_MMA_MAX_KEYS))) if kernel.endswith("bf16_mma") else x


INDEXER_QUNITS = 8  # QUNITS in the .cu: 8-head units of q fragments a CTA holds


def indexer_queries_per_cta(kernel: str, H: int) -> int:
    """Queries one CTA takes: the tensor-core kernel of one key range for every query (plain or
    causal: a prefill chunk's queries share every key tile) takes as many as INDEXER_QUNITS
    8-head units hold (queries_per_cta in the .cu); every other kernel one."""
    return INDEXER_QUNITS // cdiv(H, 8) if kernel in ("bf16_mma", "causal_bf16_mma") else 1


def indexer_grid(kernel: str, S: int, T: int, H: int) -> Grid:
    return indexer_grid_x(kernel, T), cdiv(S, indexer_queries_per_cta(kernel, H)), 1


# ---------------------------------------------------------------------------------------------
# dsa_attention.cu: day0::dsa_attention as a split over the selected slots (partial) and a merge
# of the splits (combine), flash-decoding; f32 out for f32 or bf16 q and kv.

DSA_DTYPES = ("f32", "bf16")  # q and kv dtypes of the f32-arithmetic kernels (entry suffixes)
DSA_ATTENTION = KernelSet(
    "day0_dsa_attention",
    "dsa_attention.cu",
    "dsa_attention.sm_90.ptx",
    tuple(
        entry
        for dt in DSA_DTYPES
        for entry in (
            # q, kv, idx | partial (m, l), partial acc ; H, D, K, V, T, scale bits ; grid (splits, H/4, S)
            Entry(f"day0_dsa_partial_{dt}", (True, True, True, False, False), 6, 3),
            # partial (m, l), partial acc | out ; H, V, splits ; grid (H, S)
            Entry(f"day0_dsa_combine_{dt}", (True, True, False), 3, 2),
        )
    )
    + (
        # q, kv, idx | partial (m, l), partial acc ; H, D, K, V, T, scale bits, rows ; grid (splits, H/64, S)
        Entry("day0_dsa_partial_bf16_mma", (True, True, True, False, False), 7, 3),
        # the same for at most 64 / VP heads, the scores' k-steps split among VP warps
        *(Entry(f"day0_dsa_partial_bf16_mma_vp{vp}", (True, True, True, False, False), 7, 3) for vp in (2, 4, 8)),
        # partial (m, l), partial acc | out ; H, V, splits ; grid (V/64, H, S)
        Entry("day0_dsa_combine_bf16_mma", (True, True, False), 3, 3),
    ),
)
# f32-arithmetic kernels
DSA_ROWS_PER_SPLIT = 128  # selected slots per partial CTA (ROWS)
DSA_HEADS_PER_CTA = 4  # HEADS
DSA_MAX_D = 576  # kv row width the shared memory holds (MAX_D: MLA latent 512 + rope 64)
DSA_MAX_V = 1024  # value width of the accumulators (MAX_V)
# bf16 tensor-core kernels (FlashMLA-style: every head of a query shares each gathered row)
DSA_MMA_HEADS_PER_CTA = 64  # MMA_HEADS: 8 warps × 8 heads
DSA_MMA_MAX_V = 512  # MMA_MAX_V
DSA_MMA_ROWS_DECODE = 32  # slots per split at S = 1: two 16-row tiles, the second prefetched
DSA_MMA_ROWS_PREFILL = 128  # S != 1: fewer partials per query
DSA_MMA_V_PER_CTA = 64  # combine: values of one (query, head) a CTA


def dsa_mma_rows(dt: str, S: int | None, D: int, V: int) -> int | None:
    """Slots per split of the tensor-core kernels for a site (S None: dynamic), or None where the
    f32-arithmetic kernels take it: they need bf16, D and V multiples of 8, V <= min(D, 512)."""
    if dt != "bf16" or D % 8 or V % 8 or V > D or V > DSA_MMA_MAX_V:
        return None
    return DSA_MMA_ROWS_DECODE if S == 1 else DSA_MMA_ROWS_PREFILL


DSA_MMA_VPARTS = (2, 4, 8)  # the partial entries that split the scores among a head group's warps


def dsa_mma_vparts(H: int) -> int:
    """Warps a head group of the tensor-core partial kernel has (8 / head groups of 8): above 1 (at
    most 32 heads) the `_vp<VP>` entry can split the scores among them (dsa-to-cuda-kernel's
    split-scores option); 1: the general entry only."""
    if H > DSA_MMA_HEADS_PER_CTA // 2:
        return 1
    return 8 // cdiv(H, 8)


def dsa_entries(dt: str, rows: int | None, vp: int = 1) -> tuple[str, str]:
    """(partial, combine) entry names: rows None the f32-arithmetic kernels of dtype dt, else the
    tensor-core kernels (the partial's `_vp<VP>` form for vp > 1, dsa_mma_vparts of the heads)."""
    if rows is None:
        return f"day0_dsa_partial_{dt}", f"day0_dsa_combine_{dt}"
    return f"day0_dsa_partial_bf16_mma{f'_vp{vp}' if vp > 1 else ''}", "day0_dsa_combine_bf16_mma"


def dsa_splits(K: int, rows: int | None) -> int:
    """Partials per (query, head): K selected slots in splits of `rows` (None: DSA_ROWS_PER_SPLIT)."""
    return cdiv(K, DSA_ROWS_PER_SPLIT if rows is None else rows)


def dsa_head_groups(H: int, rows: int | None) -> int:
    return cdiv(H, DSA_HEADS_PER_CTA if rows is None else DSA_MMA_HEADS_PER_CTA)


def dsa_value_blocks(V: int) -> int:
    """The tensor-core combine's CTAs per (query, head)."""
    return cdiv(V, DSA_MMA_V_PER_CTA)


def dsa_grids(S: int, H: int, K: int, V: int, rows: int | None) -> tuple[Grid, Grid]:
    """(partial grid, combine grid) of a site with S queries (rows as for dsa_entries)."""
    partial = (dsa_splits(K, rows), dsa_head_groups(H, rows), S)
    combine = (H, S, 1) if rows is None else (dsa_value_blocks(V), H, S)
    return partial, combine


# ---------------------------------------------------------------------------------------------
# mxfp4_matvec.cu: day0::mxfp4_moe / mxfp4_linear, one (token, slot) row a CTA column on CUDA cores

MXFP4_MATVEC = KernelSet(
    "day0_mxfp4_matvec",
    "mxfp4_matvec.cu",
    "mxfp4_matvec.sm_90.ptx",
    # x, packed, scales, experts (i64) | out ; K, N, k, E ; grid (ceil(N/32), rows)
    (
        Entry("day0_mxfp4_matvec", (True, True, True, True, False), 4, 2),
        # x: gate_up [rows, 2K] staged through the SwiGLU ; the same, then the clamp's f32 bits
        Entry("day0_mxfp4_matvec_swiglu", (True, True, True, True, False), 5, 2),
    ),
)
MXFP4_ROWS_PER_CTA = 32  # output columns (weight rows) a CTA: 8 warps × 4 (ROWS_PER_CTA)
MXFP4_MAX_K = 8192  # x's row is cached in shared memory (MAX_K)


def mxfp4_matvec_grid(rows: int, N: int) -> Grid:
    """rows = T·k (token, slot) pairs, N output columns."""
    return cdiv(N, MXFP4_ROWS_PER_CTA), rows, 1


# ---------------------------------------------------------------------------------------------
# mxfp4_moe_gemm.cu: day0::mxfp4_moe with many rows, a CTA per (64 output columns, expert) that
# multiplies the expert's rows on tensor cores: 64 at a time (prefill), or 16 at a time with the
# weights as the MMA's 16-row side (a batched decode step: few rows an expert)

MXFP4_MOE_GEMM = KernelSet(
    "day0_mxfp4_moe_gemm",
    "mxfp4_moe_gemm.cu",
    "mxfp4_moe_gemm.sm_90.ptx",
    # x, packed, scales, experts (i64) | out ; K, N, k, E, rows ; grid (ceil(N/64), E)
    (
        Entry("day0_mxfp4_moe_gemm", (True, True, True, True, False), 5, 2),
        Entry("day0_mxfp4_moe_gemm_few", (True, True, True, True, False), 5, 2),
    ),
)
MXFP4_GEMM_COLS_PER_CTA = 64  # COLS (and FEW_COLS)
MXFP4_GEMM_MIN_ROWS = 64  # one GEMM tile of rows (ROWS): static sites with fewer keep the matvec
# Static sites with at most this many rows an expert on average (T·k <= it · E) take the few-rows
# kernel: on the H200 it beat the 64-row one at 2, 8 and 16 rows an expert (docs/perf.md).
MXFP4_FEW_ROWS_PER_EXPERT = 16


def mxfp4_kernel(moe: bool, T: int | None, k: int, E: int) -> str:
    """The kernel a site runs: "matvec" (mxfp4_linear, and moe with T·k < MXFP4_GEMM_MIN_ROWS:
    decode's moe calls for one sequence), "few" (static T with T·k <= MXFP4_FEW_ROWS_PER_EXPERT · E:
    a batched decode step) or "gemm" (T dynamic, or more rows: prefill)."""
    if not moe or (T is not None and T * k < MXFP4_GEMM_MIN_ROWS):
        return "matvec"
    if T is not None and T * k <= MXFP4_FEW_ROWS_PER_EXPERT * E:
        return "few"
    return "gemm"


def mxfp4_gemm_grid(E: int, N: int) -> Grid:
    return cdiv(N, MXFP4_GEMM_COLS_PER_CTA), E, 1


# ---------------------------------------------------------------------------------------------
# topk_select.cu: top-k of f32 rows by radix select (histogram, threshold, ordered compaction,
# radix select of the threshold bin's candidates), or in one CTA for short rows

TOPK_SELECT = KernelSet(
    "day0_topk_select",
    "topk_select.cu",
    "topk_select.sm_90.ptx",
    (
        Entry("day0_topk_hist", (True, False, False), 2, 2),  # x, total (tied), cum | n, segs
        # x, total, cum | header, out_idx, out_val, cand ; n, segs, k
        Entry("day0_topk_collect", (True, True, True, False, False, False, False), 3, 2),
        Entry("day0_topk_finish", (True, True, True, False, False), 2, 1),  # x, header, cand, idx, val | n, k
        Entry("day0_topk_small", (True, False, False), 2, 1),  # x | idx, val ; n, k (any n: one CTA a row)
    ),
)
TOPK_SEGMENT = 8192  # row elements per CTA of hist and collect (SEG)
TOPK_BINS = 2048  # first-pass histogram bins: the top 11 key bits (BINS)
TOPK_SMALL_ROW = 8192  # day0_topk_small keeps rows up to this long in shared memory (SMALL_N)
# Rows up to this length take day0_topk_small, one launch; longer ones the four launches of the
# segmented form, whose CTAs share a row. Past SMALL_N the one CTA reads its row from global
# memory (L2) on each of its four passes (docs/perf.md, "Radix top-k kernels alone").
TOPK_ONE_CTA_ROW = 16384


def topk_is_small(n: int | None, bound: int = 0) -> bool:
    """Whether rows of static length n (None: dynamic, at most `bound` long; 0: unbounded) take
    the one-kernel form. The bound is only a cost hint: the kernel is exact at any length."""
    longest = n if n is not None else bound
    return 0 < longest <= TOPK_ONE_CTA_ROW


def topk_segments(n: int) -> int:
    return cdiv(n, TOPK_SEGMENT)


def topk_grid(entry: str, rows: int, n: int) -> Grid:
    """The grid of `entry` over `rows` rows of n elements: (rows, segments) for hist and collect,
    one CTA a row for finish and small."""
    if entry in ("day0_topk_hist", "day0_topk_collect"):
        return rows, topk_segments(n), 1
    return rows, 1, 1


# ---------------------------------------------------------------------------------------------
# moe_route.cu: day0::moe_route, DeepSeek's group-limited sigmoid routing after the router's linear,
# one warp a token

MOE_ROUTE = KernelSet(
    "day0_moe_route",
    "moe_route.cu",
    "moe_route.sm_90.ptx",
    # logits, bias | weights, experts (i64) ; S, E, groups, topk_group, top_k, normalize, scaling bits
    (Entry("day0_moe_route", (True, True, False, False), 7, 1),),
)
MOE_ROUTE_ROWS_PER_CTA = 8  # WARPS: one warp a token
MOE_ROUTE_MAX_E = 1024  # MAX_E: the biased scores of a warp's token in shared memory
MOE_ROUTE_MAX_GROUPS = 32  # a lane a group
MOE_ROUTE_MAX_K = 32  # a lane a chosen expert


def moe_route_limits(E: int, groups: int, topk_group: int, top_k: int) -> str | None:
    """Why the kernel cannot route E experts in `groups` groups (None: it can)."""
    if E > MOE_ROUTE_MAX_E:
        return f"at most {MOE_ROUTE_MAX_E} experts, got {E}"
    if not 1 <= groups <= MOE_ROUTE_MAX_GROUPS or E % groups or E // groups < 2:
        return f"1 to {MOE_ROUTE_MAX_GROUPS} groups of at least 2 experts dividing E={E}, got {groups}"
    if not 1 <= topk_group <= groups:
        return f"topk_group must be in [1, {groups}], got {topk_group}"
    if not 1 <= top_k <= min(MOE_ROUTE_MAX_K, E):
        return f"top_k must be in [1, {min(MOE_ROUTE_MAX_K, E)}], got {top_k}"
    return None


def moe_route_grid(S: int) -> Grid:
    return cdiv(S, MOE_ROUTE_ROWS_PER_CTA), 1, 1


# ---------------------------------------------------------------------------------------------
# linear_bf16.cu: out [M, N] f32 = x [M, K] f32 · w [N, K] bf16ᵀ for few rows (a batched decode
# step's projections), x as three bf16 terms on tensor cores; a cluster of S CTAs along K

LINEAR_CLUSTERS = (1, 2, 4, 8)  # the entries' cluster sizes (__cluster_dims__(1, S, 1))
LINEAR_BF16 = KernelSet(
    "day0_linear_bf16",
    "linear_bf16.cu",
    "linear_bf16.sm_90.ptx",
    # x, w | out ; M, N, K ; grid (ceil(N / LINEAR_COLS), S)
    tuple(Entry(f"day0_linear_bf16_c{S}", (True, True, False), 3, 2) for S in LINEAR_CLUSTERS),
)
LINEAR_COLS = 64  # COLS: output columns a CTA
LINEAR_MAX_M = 64  # MAX_M: rows of x
LINEAR_CTAS = 264  # the grid a cluster size aims at: 2 CTAs on each of the H100's / H200's 132 SMs


def linear_limits(M: int, K: int) -> str | None:
    """Why the kernel cannot take x [M, K] (None: it can)."""
    if not 1 <= M <= LINEAR_MAX_M:
        return f"1 to {LINEAR_MAX_M} rows, got {M}"
    if K % 8:
        return f"K a multiple of 8 (16-byte rows of bf16), got {K}"
    return None


def linear_cluster(M: int, N: int, K: int) -> int:
    """The cluster size S for [M, K] × [N, K]ᵀ: the largest whose grid stays within LINEAR_CTAS
    CTAs while each CTA keeps at least two stages of K (a stage is 128 k up to 32 rows, else 64)."""
    stage = 128 if M <= 32 else 64
    tiles = cdiv(N, LINEAR_COLS)
    fits = [S for S in LINEAR_CLUSTERS if S == 1 or (tiles * S <= LINEAR_CTAS and 2 * stage * S <= K)]
    return max(fits)


def linear_entry(S: int) -> str:
    return f"day0_linear_bf16_c{S}"


def linear_grid(N: int, S: int) -> Grid:
    return cdiv(N, LINEAR_COLS), S, 1


# ---------------------------------------------------------------------------------------------
# vision_attention.cu: day0::vision_attention, dense attention within segments (the vision
# tower), flash-style; q, k, v as stacked bf16 terms [TERMS, P, H, D], f32 out [P, H, D]

VISION_HEAD_DIMS = (16, 32, 64, 128)  # the entries' D
VISION_TERMS = (1, 2)  # the entries' bf16 terms per f32 value of q, k, v and P
VISION_QROWS = 128  # QROWS: query rows a CTA


def vision_entry(D: int, terms: int) -> str:
    return f"day0_vision_attention_d{D}_t{terms}"


VISION_ATTENTION = KernelSet(
    "day0_vision_attention",
    "vision_attention.cu",
    "vision_attention.sm_90.ptx",
    # q, k, v, seg | out ; P, H, scale bits ; grid (ceil(P / VISION_QROWS), H)
    tuple(
        Entry(vision_entry(D, t), (True, True, True, True, False), 3, 2) for D in VISION_HEAD_DIMS for t in VISION_TERMS
    ),
)


def vision_grid(P: int, H: int) -> Grid:
    return cdiv(P, VISION_QROWS), H, 1


KERNEL_SETS = (
    INDEXER_SCORES,
    DSA_ATTENTION,
    MXFP4_MATVEC,
    MXFP4_MOE_GEMM,
    TOPK_SELECT,
    MOE_ROUTE,
    LINEAR_BF16,
    VISION_ATTENTION,
)  # one per .cu
