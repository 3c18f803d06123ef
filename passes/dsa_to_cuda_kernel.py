"""dsa-to-cuda-kernel: run `torch.day0.dsa_attention` as day0's CUDA sparse-attention kernels
(lowering/kernels/dsa_attention.cu), two IREE external dispatches, on the cuda-sm90 target.

Why not dsa-to-gather-tiles on CUDA: its K/tile unrolled tiles are a chain of small dependent
dispatches, latency-bound whatever the context (measured: docs/perf.md, "GPU: the H200"). Here
one kernel takes a split of the selected slots for a group of heads per CTA (rows staged in shared
memory, online softmax in f32), and a second merges the splits (flash-decoding).

Precondition: every dsa_attention keeps the op's contract (passes/sites/dsa_attention.py: q
[S,H,D], kv [T,D], indices [S,K] integers, result [S,H,V] f32; H, D, K static; T static, or
dynamic for a paged pool, whose rows the kernels take as a push constant read at run time), with q and kv
both f32 or both bf16, D <= 576 and V <= 1024 (the kernel's shared-memory and register layout).
Rewrite:
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
tiles, the second prefetched during the first; the fastest of 16, 32, 64 and 128 there, as
tools/bench/gpu_kernel_times.py measures them: docs/perf.md, "day0's kernels alone") and 128
otherwise (prefill: fewer partials per query), splits = ceil(K / rows); the function name then
ends in `_r<rows>`. Sites of at most 32 heads (kernel_geometry.dsa_mma_vparts: VP = 8 / ceil(H / 8)
warps a head group) take the partial `day0_dsa_partial_bf16_mma_vp<VP>`, whose VP warps of a head
group split the scores' k-steps; the function name then ends in `_vp<VP>`. H100, 64 sequences of
the 4.9B benchmark model (16 heads) at 4K: 254 -> 131 us a layer (docs/perf.md, "Where the
64-sequence step goes"). The option split-scores=false keeps the general entry, each of whose
warps computes all of its head group's scores. The option tensor-cores=false keeps every site on
the f32-arithmetic kernels.
The kernels' ABI and grids: lowering/kernel_geometry.py, section dsa_attention.cu.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import ir
from day0.lowering import kernel_geometry as kg
from day0.passes.extern_dispatch import KernelCallPass, scale_tag, tensor_text
from day0.passes.sites.dsa_attention import OP_NAME, DsaAttentionSite, match_dsa_attention
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.DSA_ATTENTION.executable


def function_name(
    dt: str, H: int, D: int, T: int | None, K: int, V: int, scale: float, rows: int | None = None, vp: int = 1
) -> str:
    """T None (a paged pool's rows, known at run time) is spelled `Tdyn`."""
    tail = ("" if rows is None else f"_r{rows}") + (f"_vp{vp}" if vp > 1 else "")
    return f"day0_dsa_{dt}_H{H}_D{D}_T{'dyn' if T is None else T}_K{K}_V{V}_{scale_tag(scale)}{tail}"


def function_text(
    dt: str, H: int, D: int, T: int | None, K: int, V: int, scale: float, rows: int | None = None, vp: int = 1
) -> str:
    """rows None: the f32-arithmetic kernels; else the bf16 tensor-core kernels with `rows` slots
    per split (a `rows` push constant, and the combine also split over V). T None: the cache's
    row count is read from the tensor (a paged pool) for the kernels' T push constant."""
    mma = rows is not None
    partial, combine = kg.dsa_entries(dt, rows, vp)
    splits, groups = kg.dsa_splits(K, rows), kg.dsa_head_groups(H, rows)
    q_t, kv_t, idx_t = f"tensor<?x{H}x{D}x{dt}>", f"tensor<{'?' if T is None else T}x{D}x{dt}>", f"tensor<?x{K}xi64>"
    ml_t, acc_t, out_t = (
        f"tensor<?x{splits}x{H}x2xf32>",
        f"tensor<?x{splits}x{H}x{V}xf32>",
        f"tensor<?x{H}x{V}xf32>",
    )  # the result is f32 for either dtype
    vblocks = f"\n    %vblocks = arith.constant {kg.dsa_value_blocks(V)} : index" if mma else ""
    rows_const = f"\n    %rows = arith.constant {rows} : i32" if mma else ""
    rows_arg, rows_type = (", %rows", ", i32") if mma else ("", "")
    combine_grid = "%vblocks, %nh, %s" if mma else "%nh, %s"
    if T is None:  # the pool's rows, at run time
        t_value = f"%t = tensor.dim %kv, %c0 : {kv_t}\n    %T = arith.index_cast %t : index to i32"
        kv_dims = "{%t}"
    else:
        t_value, kv_dims = f"%T = arith.constant {T} : i32", ""
    return f"""
  func.func private @{function_name(dt, H, D, T, K, V, scale, rows, vp)}(%q: {q_t}, %kv: {kv_t}, %idx: {idx_t}) -> {out_t} {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %q, %c0 : {q_t}
    %splits = arith.constant {splits} : index
    %groups = arith.constant {groups} : index{vblocks}
    %nh = arith.constant {H} : index
    %H = arith.constant {H} : i32
    %D = arith.constant {D} : i32
    %K = arith.constant {K} : i32
    %V = arith.constant {V} : i32
    {t_value}
    %scale = arith.constant {kg.f32_bits(scale)} : i32{rows_const}
    %nsplits = arith.constant {splits} : i32
    %ml, %acc = flow.dispatch @{EXECUTABLE}::@{partial}[%splits, %groups, %s](%H, %D, %K, %V, %T, %scale{rows_arg}, %q, %kv, %idx)
        : (i32, i32, i32, i32, i32, i32{rows_type}, {q_t}{{%s}}, {kv_t}{kv_dims}, {idx_t}{{%s}}) -> ({ml_t}{{%s}}, {acc_t}{{%s}})
    %out = flow.dispatch @{EXECUTABLE}::@{combine}[{combine_grid}](%H, %V, %nsplits, %ml, %acc)
        : (i32, i32, i32, {ml_t}{{%s}}, {acc_t}{{%s}}) -> {out_t}{{%s}}
    return %out : {out_t}
  }}"""


@dataclass(frozen=True)
class DsaToCudaKernel(KernelCallPass):
    """Options:
    tensor-cores  bf16 sites that fit run on the tensor-core kernels (P as two bf16 terms for P·V;
                  default true); false keeps the f32-arithmetic kernels for them.
    split-scores  tensor-core sites of at most 32 heads take the `_vp<VP>` partial (module
                  docstring; default true); false keeps the partial whose every warp computes
                  all of its head group's score k-steps.
    """

    name = "dsa-to-cuda-kernel"
    tensor_cores: bool = True
    split_scores: bool = True

    op_names = (OP_NAME,)
    kernels = (kg.DSA_ATTENTION,)
    match = staticmethod(match_dsa_attention)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def key(self, site: DsaAttentionSite) -> tuple:
        rows = kg.dsa_mma_rows(site.dtype, site.S, site.D, site.V) if self.tensor_cores else None
        vp = kg.dsa_mma_vparts(site.H) if rows is not None and self.split_scores else 1
        return (site.dtype, site.H, site.D, site.T, site.K, site.V, site.scale, rows, vp)

    @staticmethod
    def refuse(site: DsaAttentionSite) -> str | None:
        """What the kernels cannot take (their dtypes and their shared-memory and register layout)."""
        problem = (
            f"dtype {site.dtype} (the kernel takes f32 or bf16)"
            if site.dtype not in kg.DSA_DTYPES
            else f"D={site.D} > {kg.DSA_MAX_D}"
            if site.D > kg.DSA_MAX_D
            else f"V={site.V} > {kg.DSA_MAX_V}"
            if site.V > kg.DSA_MAX_V
            else None
        )
        return problem and f"dsa_attention: the CUDA kernel cannot take {problem}"

    @staticmethod
    def rewrite(site: DsaAttentionSite, fn: str) -> None:
        op, dt = site.op, site.dtype
        b = TorchBuilder(op)
        S, H, D, K, V = site.S, site.H, site.D, site.K, site.V
        idx = site.idx
        if site.idx_dtype != "si64":
            idx = b.to_dtype(idx, TensorType((S, K), "si64"))
        qb = b.op("torch_c.to_builtin_tensor", [site.q], tensor_text((S, H, D), dt))
        kvb = b.op("torch_c.to_builtin_tensor", [site.kv], tensor_text((site.T, D), dt))
        ib = b.op("torch_c.to_builtin_tensor", [idx], tensor_text((S, K), "i64"))
        if S is not None:
            qb = b.op("tensor.cast", [qb], tensor_text((None, H, D), dt))
            ib = b.op("tensor.cast", [ib], tensor_text((None, K), "i64"))
        y = b.op("func.call", [qb, kvb, ib], tensor_text((None, H, V), "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
        if S is not None:
            y = b.op("tensor.cast", [y], tensor_text((S, H, V), "f32"))
        # (the scale and value_dim constants go too, if nothing else reads them)
        replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((S, H, V), "f32"))])
