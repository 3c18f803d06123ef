"""dsa-to-cuda-kernel: run `torch.day0.dsa_attention` as day0's CUDA sparse-attention kernels
(lowering/kernels/dsa_attention.cu), two IREE external dispatches, on the cuda-sm90 target.

Why not dsa-to-gather-tiles on CUDA: its K/tile unrolled tiles are a chain of small dependent
dispatches; on the H200 a decode step of top-2048 over 64 heads took ~1.1 ms whatever the
context (32K to 1M), against ~0.1–1 ms for PyTorch. Here one kernel takes a split of 128
selected slots × 4 heads per CTA (rows staged in shared memory, online softmax in f32), and a
second merges the splits (flash-decoding).

Precondition: dsa-to-gather-tiles' op checks (q [S,H,D], kv [T,D], indices [S,K] integers,
result [S,H,V] f32; H, D, T, K static), q and kv both f32 or both bf16, plus D <= 576 and
V <= 1024 (the kernel's shared-memory and register layout). Rewrite:
    %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim)
 -> %o = func.call @day0_dsa_<dtype>_H<H>_D<D>_T<T>_K<K>_V<V>_s<scale bits>(qb, kvb, idxb)
whose body is
    %ml, %acc = flow.dispatch @day0_dsa_attention::@day0_dsa_partial_<dtype>[splits, ceil(H/4), S]
    %out      = flow.dispatch @day0_dsa_attention::@day0_dsa_combine_<dtype>[H, S]
with splits = ceil(K / 128). The result is f32 for either dtype (the op's contract): the combine
kernels write f32 (bf16 q and kv are widened exactly; nothing is rounded to bf16). Empty slots
(index < 0 or >= T) contribute nothing; a query with no valid slot gets zeros (as the op's
reference and dsa-to-gather-tiles).

bf16 with D % 8 == 0, V % 8 == 0 and V <= min(D, 512) takes the tensor-core kernels instead
(FlashMLA-style: all heads of a query share each gathered row in one CTA, mma.sync scores and
P·V; P enters P·V as two bf16 terms, hi + lo, the rest is f32):
    %ml, %acc = flow.dispatch @day0_dsa_attention::@day0_dsa_partial_bf16_mma[splits, ceil(H/64), S]
    %out      = flow.dispatch @day0_dsa_attention::@day0_dsa_combine_bf16_mma[ceil(V/64), H, S]
with rows = 32 slots per split for decode (static S = 1: at K = 2048, 64 CTAs of two 16-row
tiles, the second prefetched during the first; not yet measured against 16 and 64, which
tools/bench/gpu_kernel_times.py times beside it) and 128 otherwise (prefill: fewer partials per
query), splits = ceil(K / rows); the function name then ends in `_r<rows>`. The option
tensor-cores=false keeps every site on the f32-arithmetic kernels.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from day0.frontend.ir import Operation, ir
from day0.passes import extern_dispatch
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops, operator_name
from day0.passes.dsa_to_gather_tiles import OP_NAME, _check
from day0.passes.extern_dispatch import call_kernels, tensor_text
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = "day0_dsa_attention"
KERNEL_PTX = "dsa_attention.sm_90.ptx"
THREADS = 256
HEADS_PER_CTA = 4
ROWS_PER_SPLIT = 128
MAX_D = 576
MAX_V = 1024
MMA_HEADS_PER_CTA = 64
MMA_MAX_V = 512
MMA_ROWS_DECODE = 32   # slots per split of the tensor-core kernel at S = 1
MMA_ROWS_PREFILL = 128
MMA_V_PER_CTA = 64     # combine: values of one (query, head) a CTA
_DTYPES = {"f32": "f32", "bf16": "bf16"}  # torch dtype -> kernel suffix / builtin element type
_TORCH_INT64 = 4
KERNEL_ABI = tuple(
    row for dt in _DTYPES.values() for row in (
        # q, kv, idx | partial (m, l), partial acc ; H, D, K, V, T, scale bits ; grid (splits, H/4, S)
        (f"day0_dsa_partial_{dt}", (True, True, True, False, False), 6, 3),
        # partial (m, l), partial acc | out ; H, V, splits ; grid (H, S)
        (f"day0_dsa_combine_{dt}", (True, True, False), 3, 2),
    )) + (
    # q, kv, idx | partial (m, l), partial acc ; H, D, K, V, T, scale bits, rows ; grid (splits, H/64, S)
    ("day0_dsa_partial_bf16_mma", (True, True, True, False, False), 7, 3),
    # partial (m, l), partial acc | out ; H, V, splits ; grid (V/64, H, S)
    ("day0_dsa_combine_bf16_mma", (True, True, False), 3, 3),
)


def executable_source_text() -> str:
    return extern_dispatch.executable_source_text(EXECUTABLE, KERNEL_PTX, KERNEL_ABI, THREADS)


def scale_bits(scale: float) -> int:
    """The f32 bits of `scale` as a signed i32 (push constants are 32-bit integers)."""
    return struct.unpack("<i", struct.pack("<f", scale))[0]


def mma_rows(dt: str, S: int | None, D: int, V: int) -> int | None:
    """Slots per split of the tensor-core kernels for this site (S None: dynamic), or None where
    the f32-arithmetic kernels take it."""
    if dt != "bf16" or D % 8 or V % 8 or V > D or V > MMA_MAX_V:
        return None
    return MMA_ROWS_DECODE if S == 1 else MMA_ROWS_PREFILL


def function_name(dt: str, H: int, D: int, T: int, K: int, V: int, scale: float, rows: int | None = None) -> str:
    tail = "" if rows is None else f"_r{rows}"
    return f"day0_dsa_{dt}_H{H}_D{D}_T{T}_K{K}_V{V}_s{scale_bits(scale) & 0xFFFFFFFF:08x}{tail}"


def function_text(dt: str, H: int, D: int, T: int, K: int, V: int, scale: float, rows: int | None = None) -> str:
    """rows None: the f32-arithmetic kernels; else the bf16 tensor-core kernels with `rows` slots
    per split (a `rows` push constant, and the combine also split over V)."""
    mma = rows is not None
    kernels = "bf16_mma" if mma else dt
    splits = -(-K // (rows if mma else ROWS_PER_SPLIT))
    groups = -(-H // (MMA_HEADS_PER_CTA if mma else HEADS_PER_CTA))
    q_t, kv_t, idx_t = f"tensor<?x{H}x{D}x{dt}>", f"tensor<{T}x{D}x{dt}>", f"tensor<?x{K}xi64>"
    ml_t, acc_t, out_t = (f"tensor<?x{splits}x{H}x2xf32>", f"tensor<?x{splits}x{H}x{V}xf32>",
                          f"tensor<?x{H}x{V}xf32>")  # the result is f32 for either dtype
    vblocks = f"\n    %vblocks = arith.constant {-(-V // MMA_V_PER_CTA)} : index" if mma else ""
    rows_const = f"\n    %rows = arith.constant {rows} : i32" if mma else ""
    rows_arg, rows_type = (", %rows", ", i32") if mma else ("", "")
    combine_grid = "%vblocks, %nh, %s" if mma else "%nh, %s"
    return f"""
  func.func private @{function_name(dt, H, D, T, K, V, scale, rows)}(%q: {q_t}, %kv: {kv_t}, %idx: {idx_t}) -> {out_t} {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %q, %c0 : {q_t}
    %splits = arith.constant {splits} : index
    %groups = arith.constant {groups} : index{vblocks}
    %nh = arith.constant {H} : index
    %H = arith.constant {H} : i32
    %D = arith.constant {D} : i32
    %K = arith.constant {K} : i32
    %V = arith.constant {V} : i32
    %T = arith.constant {T} : i32
    %scale = arith.constant {scale_bits(scale)} : i32{rows_const}
    %nsplits = arith.constant {splits} : i32
    %ml, %acc = flow.dispatch @{EXECUTABLE}::@day0_dsa_partial_{kernels}[%splits, %groups, %s](%H, %D, %K, %V, %T, %scale{rows_arg}, %q, %kv, %idx)
        : (i32, i32, i32, i32, i32, i32{rows_type}, {q_t}{{%s}}, {kv_t}, {idx_t}{{%s}}) -> ({ml_t}{{%s}}, {acc_t}{{%s}})
    %out = flow.dispatch @{EXECUTABLE}::@day0_dsa_combine_{kernels}[{combine_grid}](%H, %V, %nsplits, %ml, %acc)
        : (i32, i32, i32, {ml_t}{{%s}}, {acc_t}{{%s}}) -> {out_t}{{%s}}
    return %out : {out_t}
  }}"""


@dataclass(frozen=True)
class DsaToCudaKernel(ModulePass):
    """Options:
    tensor-cores  bf16 sites that fit run on the tensor-core kernels (P rounded to bf16 for P·V;
                  default true); false keeps the f32-arithmetic kernels for them.
    """

    name = "dsa-to-cuda-kernel"
    tensor_cores: bool = True

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites = []
        for op in collect_ops(module_op, lambda op: operator_name(op) == OP_NAME):
            site = _check(op, diag)
            if site is None:
                continue
            problem = (f"dtype {site.dtype} (the kernel takes f32 or bf16)" if site.dtype not in _DTYPES
                       else f"D={site.D} > {MAX_D}" if site.D > MAX_D
                       else f"V={site.V} > {MAX_V}" if site.V > MAX_V else None)
            if problem:
                diag.error(op, f"dsa_attention: the CUDA kernel cannot take {problem}")
                continue
            sites.append(site)
        if not sites or diag.diagnostics:
            return
        call_kernels(module_op, sites, self._key, function_name, function_text, _rewrite, executable_source_text())

    def _key(self, site) -> tuple:
        dt = _DTYPES[site.dtype]
        rows = mma_rows(dt, site.S, site.D, site.V) if self.tensor_cores else None
        return (dt, site.H, site.D, TensorType.of(site.kv).dims[0], site.K, site.V, site.scale, rows)


def _rewrite(site, fn: str) -> None:
    op, dt = site.op, _DTYPES[site.dtype]
    b = TorchBuilder(op)
    S, H, D, K, V = site.S, site.H, site.D, site.K, site.V
    idx = site.idx
    if site.idx_dtype != "si64":
        idx = b.op("torch.aten.to.dtype", [idx, b.int(_TORCH_INT64), b.bool(False), b.bool(False), b.none()],
                   TensorType((S, K), "si64"))
    qb = b.op("torch_c.to_builtin_tensor", [site.q], tensor_text((S, H, D), dt))
    kvb = b.op("torch_c.to_builtin_tensor", [site.kv], tensor_text(TensorType.of(site.kv).dims, dt))
    ib = b.op("torch_c.to_builtin_tensor", [idx], tensor_text((S, K), "i64"))
    if S is not None:
        qb = b.op("tensor.cast", [qb], tensor_text((None, H, D), dt))
        ib = b.op("tensor.cast", [ib], tensor_text((None, K), "i64"))
    y = b.op("func.call", [qb, kvb, ib], tensor_text((None, H, V), "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
    if S is not None:
        y = b.op("tensor.cast", [y], tensor_text((S, H, V), "f32"))
    # (the scale and value_dim constants go too, if nothing else reads them)
    replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((S, H, V), "f32"))])
