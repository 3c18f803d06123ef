"""indexer-scores-to-cuda-kernel: run `torch.day0.indexer_scores` and its rows form
`torch.day0.indexer_scores_rows` as day0's CUDA kernels (lowering/kernels/indexer_scores.cu), one
IREE external dispatch each, on the cuda-sm90 target.

Only the CUDA pipeline sees the op: export decomposes it for every other target into its
reference einsum/ReLU/einsum (frontend.export.DECOMPOSABLE; the targets that keep it:
lowering/targets.py). IREE's own dispatches for that form were the context-dependent part of a
DSA decode step on the H200, growing with the context; the kernel reads each key row once per
query (measured: docs/perf.md, "GPU: the H200").

Precondition: every

    %o = torch.operator "torch.day0.indexer_scores"(%q, %keys, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[T,D],f32|bf16>, !torch.vtensor<[S,H],f32>,
            !torch.float) -> !torch.vtensor<[S,T],f32>

keeps the op's contract (passes/sites/indexer_scores.py: static H and D, S and T static or
dynamic, the scale from torch.constant.float), with H <= 64 and D <= 128 (the kernels' shared
memory); and every rows form, whose key t of query s is row rows[s, t] of a pool [R, D]
(a batched decode step over paged caches: each query reads its own rows in place, where IREE's
gather-then-contract took 5.4 ms a layer for 64 queries of 4K keys on the H200, docs/perf.md).
Rewrite: a call of @day0_indexer_scores_<kernel>_H<H>_D<D>_T<T|q>_s<scale bits>(qb, kb, [rb,] wb)
whose body is one flow.dispatch of kernel over the grid (x, S), kernel rows_<kernel> for the
rows form (push constants H, D, T, the scale's bits, and S without rows):
  f32        f32 keys: exact f32 FMAs, x = ceil(T / 128).
  bf16_mma   bf16 keys (default): tensor cores, x = min(ceil(T / 128), max(264, ceil(T / 2048)))
             (each CTA takes a contiguous range of ceil(ceil(T / 16) / x) tiles of 16 keys);
             without rows the grid is (x, ceil(S / qb)): a CTA takes qb = 8 / ceil(H / 8)
             queries (4 at H = 16), which share every key tile a warp loads (a prefill chunk's
             queries all read the same keys: 4× fewer key loads a product at H = 16).
  bf16       bf16 keys with option tensor-cores=false: exact f32 FMAs, x = ceil(T / 128).

Numerics of bf16_mma: q · scale is split into two bf16 terms (hi = bf16(q), lo = bf16(q - hi)),
and each key tile is multiplied by both (keys are bf16 already; products are exact and accumulate
in f32), so q enters with 16 significant bits and the scores are within ~1e-5 relative of the
exact kernels. (With q rounded to bf16 alone, a few keys of a top-2048 selection per query
swapped: harmless for a trained model, but enough to make a random benchmark model diverge from
its eager reference; docs/perf.md, "day0's kernels alone".) `tools/bench/gpu_kernel_times.py`
measures the error and the selection overlap; tensor-cores=false keeps the exact kernel. The
kernels' ABI and grids: lowering/kernel_geometry.py, section indexer_scores.cu.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import ir
from day0.lowering import kernel_geometry as kg
from day0.passes.extern_dispatch import KernelCallPass, scale_tag, tensor_text
from day0.passes.sites.indexer_scores import (
    CAUSAL_OP_NAME,
    OP_NAME,
    ROWS_OP_NAME,
    IndexerScoresSite,
    match_indexer_scores,
)
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.INDEXER_SCORES.executable


def function_name(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    return f"{kg.indexer_entry(kernel)}_H{H}_D{D}_T{'q' if T is None else T}_{scale_tag(scale)}"


def function_text(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    causal, rows = kernel.startswith("causal_"), kernel.startswith("rows_")
    dt = kernel.removeprefix("rows_").removeprefix("causal_").split("_")[0]  # the keys' element type
    q_t, w_t, o_t = f"tensor<?x{H}x{D}xf32>", f"tensor<?x{H}xf32>", tensor_text((None, T), "f32")
    # the T keys, or (rows and causal forms) the pool or cache of any row count and the rows
    k_t = tensor_text((None, D), dt) if rows or causal else tensor_text((T, D), dt)
    r_t = tensor_text((T,), "i64") if causal else tensor_text((None, T), "i64")
    l_t = "tensor<?xi64>"
    if T is None:
        gx = "%gx"
        if kernel.endswith("bf16_mma"):
            gx = "%gx0"
            cap = f"""
    %most = arith.constant {kg.INDEXER_MMA_MAX_KEYS} : index
    %long = arith.ceildivui %t, %most : index
    %wave = arith.constant {kg.INDEXER_MMA_CTAS} : index
    %cap = arith.maxui %wave, %long : index
    %gx = arith.minui %gx0, %cap : index"""
        else:
            cap = ""
        t_of = (
            f"tensor.dim %r, %c0 : {r_t}"
            if causal
            else f"tensor.dim %r, %c1 : {r_t}"
            if rows
            else f"tensor.dim %k, %c0 : {k_t}"
        )
        t_lines = f"""    %t = {t_of}
    %per = arith.constant {kg.INDEXER_KEYS_PER_CTA} : index
    {gx} = arith.ceildivui %t, %per : index{cap}
    %T = arith.index_cast %t : index to i32"""
        o_dims = "{%s, %t}"
    else:
        t_lines = f"""    %gx = arith.constant {kg.indexer_grid_x(kernel, T)} : index
    %T = arith.constant {T} : i32"""
        o_dims = "{%s}"
    r_dims = "{%t}" if T is None else ""  # the causal form's rows [T]
    # a CTA takes qb queries (the tensor-core kernel of one key range: kernel_geometry.indexer_queries_per_cta)
    per_cta = f"""
    %qb = arith.constant {kg.indexer_queries_per_cta(kernel, H)} : index
    %gy = arith.ceildivui %s, %qb : index
    %S = arith.index_cast %s : index to i32"""
    if causal:
        params, operands = f"%q: {q_t}, %k: {k_t}, %r: {r_t}, %l: {l_t}, %w: {w_t}", "%q, %k, %r, %l, %w"
        types = f"{q_t}{{%s}}, {k_t}{{%n}}, {r_t}{r_dims}, {l_t}{{%s}}, {w_t}{{%s}}"
        extra = f"""
    %n = tensor.dim %k, %c0 : {k_t}{per_cta}"""
        consts, const_types, gy = "%H, %D, %T, %scale, %S", "i32, i32, i32, i32, i32", "%gy"
    elif rows:
        params, operands = f"%q: {q_t}, %k: {k_t}, %r: {r_t}, %w: {w_t}", "%q, %k, %r, %w"
        types = f"{q_t}{{%s}}, {k_t}{{%n}}, {r_t}{{{'%s, %t' if T is None else '%s'}}}, {w_t}{{%s}}"
        extra = f"""
    %c1 = arith.constant 1 : index
    %n = tensor.dim %k, %c0 : {k_t}"""
        consts, const_types, gy = "%H, %D, %T, %scale", "i32, i32, i32, i32", "%s"
    else:
        params, operands = f"%q: {q_t}, %k: {k_t}, %w: {w_t}", "%q, %k, %w"
        types = f"{q_t}{{%s}}, {k_t}{'{%t}' if T is None else ''}, {w_t}{{%s}}"
        extra = per_cta
        consts, const_types, gy = "%H, %D, %T, %scale, %S", "i32, i32, i32, i32, i32", "%gy"
    return f"""
  func.func private @{function_name(kernel, H, D, T, scale)}({params}) -> {o_t} {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %q, %c0 : {q_t}{extra}
{t_lines}
    %H = arith.constant {H} : i32
    %D = arith.constant {D} : i32
    %scale = arith.constant {kg.f32_bits(scale)} : i32
    %o = flow.dispatch @{EXECUTABLE}::@{kg.indexer_entry(kernel)}[%gx, {gy}]({consts}, {operands})
        : ({const_types}, {types}) -> {o_t}{o_dims}
    return %o : {o_t}
  }}"""


@dataclass(frozen=True)
class IndexerScoresToCudaKernel(KernelCallPass):
    """Options:
    tensor-cores  bf16 keys run on the tensor-core kernel (q as two bf16 terms; default true); false
                  keeps the exact f32-FMA kernel for them. f32 keys always take the exact kernel.
    """

    name = "indexer-scores-to-cuda-kernel"
    tensor_cores: bool = True

    op_names = (OP_NAME, ROWS_OP_NAME, CAUSAL_OP_NAME)
    kernels = (kg.INDEXER_SCORES,)
    match = staticmethod(match_indexer_scores)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def kernel(self, key_dtype: str, rows: bool = False, causal: bool = False) -> str:
        kernel = "bf16_mma" if key_dtype == "bf16" and self.tensor_cores else key_dtype
        return f"causal_{kernel}" if causal else f"rows_{kernel}" if rows else kernel

    def key(self, site: IndexerScoresSite) -> tuple:
        return (self.kernel(site.key_dtype, site.rows, site.causal), site.H, site.D, site.T, site.scale)

    @staticmethod
    def refuse(site: IndexerScoresSite) -> str | None:
        """What the kernels cannot take (their shared memory holds H <= 64 heads of D <= 128)."""
        if site.H > kg.INDEXER_MAX_H or site.D > kg.INDEXER_MAX_D:
            return (
                f"{site.what}: the CUDA kernel takes H <= {kg.INDEXER_MAX_H} heads of D <= {kg.INDEXER_MAX_D}, "
                f"got H={site.H}, D={site.D}"
            )
        return None

    @staticmethod
    def rewrite(site: IndexerScoresSite, fn: str) -> None:
        """The call of `fn`, each operand cast to its parameter's type (S dynamic; the rows and
        causal forms' pool of any row count)."""
        op = site.op
        b = TorchBuilder(op)
        S, H, D, T, kd = site.S, site.H, site.D, site.T, site.key_dtype
        tensors = op.operands[:-1]  # q, keys, [rows, [last,]] w
        params = [((None, H, D), "f32"), ((None, D) if site.rows or site.causal else (T, D), kd)]
        params += [((None, T), "i64")] if site.rows else [((T,), "i64"), ((None,), "i64")] if site.causal else []
        params += [((None, H), "f32")]
        have = [TensorType.of(v).dims for v in tensors]
        args = [
            b.op("torch_c.to_builtin_tensor", [v], tensor_text(h, elem))
            for v, h, (_, elem) in zip(tensors, have, params)
        ]
        args = [
            x if h == dims else b.op("tensor.cast", [x], tensor_text(dims, elem))
            for x, h, (dims, elem) in zip(args, have, params)
        ]
        y = b.op("func.call", args, tensor_text((None, T), "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
        if S is not None:
            y = b.op("tensor.cast", [y], tensor_text((S, T), "f32"))
        replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((S, T), "f32"))])
