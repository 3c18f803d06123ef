"""indexer-scores-to-cuda-kernel: run `torch.day0.indexer_scores` as day0's CUDA kernel
(lowering/kernels/indexer_scores.cu), one IREE external dispatch, on the cuda-sm90 target.

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
memory).
Rewrite: a call of @day0_indexer_scores_<kernel>_H<H>_D<D>_T<T|q>_s<scale bits>(qb, kb, wb) whose
body is one flow.dispatch of kernel over the grid (x, S):
  f32        f32 keys: exact f32 FMAs, x = ceil(T / 128).
  bf16_mma   bf16 keys (default): tensor cores, x = min(ceil(T / 128), max(264, ceil(T / 2048)))
             (each CTA takes a contiguous range of ceil(ceil(T / 16) / x) tiles of 16 keys).
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
from day0.passes.sites.indexer_scores import OP_NAME, IndexerScoresSite, match_indexer_scores
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

EXECUTABLE = kg.INDEXER_SCORES.executable


def function_name(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    return f"{kg.indexer_entry(kernel)}_H{H}_D{D}_T{'q' if T is None else T}_{scale_tag(scale)}"


def function_text(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    dt = kernel.split("_")[0]  # the keys' element type
    q_t, k_t, w_t, o_t = (
        f"tensor<?x{H}x{D}xf32>",
        tensor_text((T, D), dt),
        f"tensor<?x{H}xf32>",
        tensor_text((None, T), "f32"),
    )
    if T is None:
        gx = "%gx"
        if kernel == "bf16_mma":
            gx = "%gx0"
            cap = f"""
    %most = arith.constant {kg.INDEXER_MMA_MAX_KEYS} : index
    %long = arith.ceildivui %t, %most : index
    %wave = arith.constant {kg.INDEXER_MMA_CTAS} : index
    %cap = arith.maxui %wave, %long : index
    %gx = arith.minui %gx0, %cap : index"""
        else:
            cap = ""
        t_lines = f"""    %t = tensor.dim %k, %c0 : {k_t}
    %per = arith.constant {kg.INDEXER_KEYS_PER_CTA} : index
    {gx} = arith.ceildivui %t, %per : index{cap}
    %T = arith.index_cast %t : index to i32"""
        k_dims, o_dims = "{%t}", "{%s, %t}"
    else:
        t_lines = f"""    %gx = arith.constant {kg.indexer_grid_x(kernel, T)} : index
    %T = arith.constant {T} : i32"""
        k_dims, o_dims = "", "{%s}"
    return f"""
  func.func private @{function_name(kernel, H, D, T, scale)}(%q: {q_t}, %k: {k_t}, %w: {w_t}) -> {o_t} {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %q, %c0 : {q_t}
{t_lines}
    %H = arith.constant {H} : i32
    %D = arith.constant {D} : i32
    %scale = arith.constant {kg.f32_bits(scale)} : i32
    %o = flow.dispatch @{EXECUTABLE}::@{kg.indexer_entry(kernel)}[%gx, %s](%H, %D, %T, %scale, %q, %k, %w)
        : (i32, i32, i32, i32, {q_t}{{%s}}, {k_t}{k_dims}, {w_t}{{%s}}) -> {o_t}{o_dims}
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

    op_names = (OP_NAME,)
    kernels = (kg.INDEXER_SCORES,)
    match = staticmethod(match_indexer_scores)
    function_name = staticmethod(function_name)
    function_text = staticmethod(function_text)

    def kernel(self, key_dtype: str) -> str:
        return "bf16_mma" if key_dtype == "bf16" and self.tensor_cores else key_dtype

    def key(self, site: IndexerScoresSite) -> tuple:
        return (self.kernel(site.key_dtype), site.H, site.D, site.T, site.scale)

    @staticmethod
    def refuse(site: IndexerScoresSite) -> str | None:
        """What the kernels cannot take (their shared memory holds H <= 64 heads of D <= 128)."""
        if site.H > kg.INDEXER_MAX_H or site.D > kg.INDEXER_MAX_D:
            return (
                f"indexer_scores: the CUDA kernel takes H <= {kg.INDEXER_MAX_H} heads of D <= {kg.INDEXER_MAX_D}, "
                f"got H={site.H}, D={site.D}"
            )
        return None

    @staticmethod
    def rewrite(site: IndexerScoresSite, fn: str) -> None:
        op = site.op
        b = TorchBuilder(op)
        S, H, D, T = site.S, site.H, site.D, site.T
        q, keys, w, _ = op.operands
        args = [
            b.op("torch_c.to_builtin_tensor", [q], tensor_text((S, H, D), "f32")),
            b.op("torch_c.to_builtin_tensor", [keys], tensor_text((T, D), site.key_dtype)),
            b.op("torch_c.to_builtin_tensor", [w], tensor_text((S, H), "f32")),
        ]
        if S is not None:
            args[0] = b.op("tensor.cast", [args[0]], tensor_text((None, H, D), "f32"))
            args[2] = b.op("tensor.cast", [args[2]], tensor_text((None, H), "f32"))
        y = b.op("func.call", args, tensor_text((None, T), "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
        if S is not None:
            y = b.op("tensor.cast", [y], tensor_text((S, T), "f32"))
        replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((S, T), "f32"))])
