"""indexer-scores-to-cuda-kernel: run `torch.day0.indexer_scores` as day0's CUDA kernel
(lowering/kernels/indexer_scores.cu), one IREE external dispatch, on the cuda-sm90 target.

Only the CUDA pipeline sees the op: export decomposes it for every other target into its
reference einsum/ReLU/einsum (frontend.export.DECOMPOSABLE, passes.pipelines.kept_ops). IREE's
own dispatches for that form were the context-dependent part of a DSA decode step on the H200,
and at -O3 they grew to 0.9–20 ms at 32K–1M keys; the kernel reads each key row once per query.

Precondition: every

    %o = torch.operator "torch.day0.indexer_scores"(%q, %keys, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[T,D],f32|bf16>, !torch.vtensor<[S,H],f32>,
            !torch.float) -> !torch.vtensor<[S,T],f32>

has static H <= 64 and D <= 128 (S and T static or dynamic), the scale from torch.constant.float.
Rewrite: a call of @day0_indexer_scores_<kernel>_H<H>_D<D>_T<T|q>_s<scale bits>(qb, kb, wb) whose
body is one flow.dispatch of kernel over the grid (x, S):
  f32        f32 keys: exact f32 FMAs, x = ceil(T / 128).
  bf16_mma   bf16 keys (default): tensor cores, x = min(ceil(T / 128), max(264, ceil(T / 2048)))
             (each CTA takes a contiguous range of ceil(ceil(T / 16) / x) tiles of 16 keys).
  bf16       bf16 keys with option tensor-cores=false: exact f32 FMAs, x = ceil(T / 128).

Numerics of bf16_mma: q · scale is split into two bf16 terms (hi = bf16(q), lo = bf16(q - hi)),
and each key tile is multiplied by both (keys are bf16 already; products are exact and accumulate
in f32), so q enters with 16 significant bits and the scores are within ~1e-5 relative of the
exact kernels. (With q rounded to bf16 alone the error was ~1e-3 and ~3 keys of a top-2048
selection per query swapped on the H200: harmless for a trained model, but enough to make a
random benchmark model diverge from its eager reference.) `tools/bench/gpu_kernel_times.py`
measures the error and the selection overlap; tensor-cores=false keeps the exact kernel.

Options:
  tensor-cores   run bf16 keys on the tensor-core kernel (default true).
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation, ir
from day0.passes import extern_dispatch
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops, operator_name
from day0.passes.dsa_to_cuda_kernel import scale_bits
from day0.passes.extern_dispatch import call_kernels, tensor_text
from day0.passes.torch_ir import TensorType, TorchBuilder, fmt_dims, replace_op, torch_constant

OP_NAME = "torch.day0.indexer_scores"
EXECUTABLE = "day0_indexer_scores"
KERNEL_PTX = "indexer_scores.sm_90.ptx"
THREADS = 256
KEYS_PER_CTA = 128
MAX_H, MAX_D = 64, 128
_KEY_DTYPES = ("f32", "bf16")
# CTAs per query of the tensor-core kernel: one wave (H200: 132 SMs × 2 CTAs) of long CTAs
# amortizes converting q, but at most MMA_MAX_KEYS keys a CTA. On the H200 (tools/gpu_kernel_times)
# 264 CTAs beat 1024 at 128K keys (13.3 vs 21.4 µs), 512 beat 264 at 1M (77.2 vs 81.7 µs).
MMA_CTAS = 264
MMA_MAX_KEYS = 2048
_KERNELS = ("f32", "bf16", "bf16_mma")
# q, keys, w | out ; H, D, T, scale bits ; grid (grid_x(kernel, T), S)
KERNEL_ABI = tuple((f"day0_indexer_scores_{kernel}", (True, True, True, False), 4, 2) for kernel in _KERNELS)


def grid_x(kernel: str, T: int) -> int:
    """The grid's x (CTAs per query) that the pass dispatches `kernel` with over T keys."""
    x = -(-T // KEYS_PER_CTA)
    return min(x, max(MMA_CTAS, -(-T // MMA_MAX_KEYS))) if kernel == "bf16_mma" else x


@dataclass(frozen=True)
class _Site:
    op: Operation
    S: int | None
    H: int
    D: int
    T: int | None
    key_dtype: str
    scale: float


def _check(op: Operation, diag: DiagnosticEngine) -> _Site | None:
    def fail(message: str) -> None:
        diag.error(op, f"indexer_scores: {message}")

    if len(op.operands) != 4 or len(op.results) != 1:
        return fail("expected 4 operands (q, keys, weights, scale) and 1 result")
    q, keys, w, out = (TensorType.of(v) for v in (*op.operands[:3], op.result))
    for what, t, rank in (("q", q, 3), ("keys", keys, 2), ("weights", w, 2), ("result", out, 2)):
        if t is None or len(t.dims) != rank:
            return fail(f"{what} must be a rank-{rank} !torch.vtensor")
    (S, H, D), (T, Dk) = q.dims, keys.dims
    if q.dtype != "f32" or w.dtype != "f32" or out.dtype != "f32":
        return fail(f"q, weights and result must be f32, got {q.dtype}, {w.dtype}, {out.dtype}")
    if keys.dtype not in _KEY_DTYPES:
        return fail(f"keys must be f32 or bf16, got {keys.dtype}")
    if None in (H, D, Dk):
        return fail("H and D must be static (the query count S and key count T may be dynamic)")
    if Dk != D or w.dims != (S, H) or out.dims != (S, T):
        return fail(f"shapes disagree: q {fmt_dims(q.dims)}, keys {fmt_dims(keys.dims)}, weights "
                    f"{fmt_dims(w.dims)}, result {fmt_dims(out.dims)}")
    if H > MAX_H or D > MAX_D:
        return fail(f"the CUDA kernel takes H <= {MAX_H} heads of D <= {MAX_D}, got H={H}, D={D}")
    scale = torch_constant(op.operands[3], "torch.constant.float")
    if scale is None:
        return fail("scale must come from torch.constant.float")
    return _Site(op, S, H, D, T, keys.dtype, scale)


def function_name(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    return f"day0_indexer_scores_{kernel}_H{H}_D{D}_T{'q' if T is None else T}_s{scale_bits(scale) & 0xFFFFFFFF:08x}"


def function_text(kernel: str, H: int, D: int, T: int | None, scale: float) -> str:
    dt = kernel.split("_")[0]  # the keys' element type
    q_t, k_t, w_t, o_t = (f"tensor<?x{H}x{D}xf32>", tensor_text((T, D), dt), f"tensor<?x{H}xf32>",
                          tensor_text((None, T), "f32"))
    if T is None:
        gx = "%gx"
        if kernel == "bf16_mma":
            gx = "%gx0"
            cap = f"""
    %most = arith.constant {MMA_MAX_KEYS} : index
    %long = arith.ceildivui %t, %most : index
    %wave = arith.constant {MMA_CTAS} : index
    %cap = arith.maxui %wave, %long : index
    %gx = arith.minui %gx0, %cap : index"""
        else:
            cap = ""
        t_lines = f"""    %t = tensor.dim %k, %c0 : {k_t}
    %per = arith.constant {KEYS_PER_CTA} : index
    {gx} = arith.ceildivui %t, %per : index{cap}
    %T = arith.index_cast %t : index to i32"""
        k_dims, o_dims = "{%t}", "{%s, %t}"
    else:
        t_lines = f"""    %gx = arith.constant {grid_x(kernel, T)} : index
    %T = arith.constant {T} : i32"""
        k_dims, o_dims = "", "{%s}"
    return f"""
  func.func private @{function_name(kernel, H, D, T, scale)}(%q: {q_t}, %k: {k_t}, %w: {w_t}) -> {o_t} {{
    %c0 = arith.constant 0 : index
    %s = tensor.dim %q, %c0 : {q_t}
{t_lines}
    %H = arith.constant {H} : i32
    %D = arith.constant {D} : i32
    %scale = arith.constant {scale_bits(scale)} : i32
    %o = flow.dispatch @{EXECUTABLE}::@day0_indexer_scores_{kernel}[%gx, %s](%H, %D, %T, %scale, %q, %k, %w)
        : (i32, i32, i32, i32, {q_t}{{%s}}, {k_t}{k_dims}, {w_t}{{%s}}) -> {o_t}{o_dims}
    return %o : {o_t}
  }}"""


@dataclass(frozen=True)
class IndexerScoresToCudaKernel(ModulePass):
    """Options:
    tensor-cores  bf16 keys run on the tensor-core kernel (q as two bf16 terms; default true); false
                  keeps the exact f32-FMA kernel for them. f32 keys always take the exact kernel.
    """

    name = "indexer-scores-to-cuda-kernel"
    tensor_cores: bool = True

    def kernel(self, key_dtype: str) -> str:
        return "bf16_mma" if key_dtype == "bf16" and self.tensor_cores else key_dtype

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites = [s for op in collect_ops(module_op, lambda op: operator_name(op) == OP_NAME)
                 if (s := _check(op, diag)) is not None]
        if not sites or diag.diagnostics:
            return
        call_kernels(module_op, sites, lambda s: (self.kernel(s.key_dtype), s.H, s.D, s.T, s.scale),
                     function_name, function_text, _rewrite,
                     extern_dispatch.executable_source_text(EXECUTABLE, KERNEL_PTX, KERNEL_ABI, THREADS))


def _rewrite(site: _Site, fn: str) -> None:
    op = site.op
    b = TorchBuilder(op)
    S, H, D, T = site.S, site.H, site.D, site.T
    q, keys, w, _ = op.operands
    args = [b.op("torch_c.to_builtin_tensor", [q], tensor_text((S, H, D), "f32")),
            b.op("torch_c.to_builtin_tensor", [keys], tensor_text((T, D), site.key_dtype)),
            b.op("torch_c.to_builtin_tensor", [w], tensor_text((S, H), "f32"))]
    if S is not None:
        args[0] = b.op("tensor.cast", [args[0]], tensor_text((None, H, D), "f32"))
        args[2] = b.op("tensor.cast", [args[2]], tensor_text((None, H), "f32"))
    y = b.op("func.call", args, tensor_text((None, T), "f32"), {"callee": ir.FlatSymbolRefAttr.get(fn)})
    if S is not None:
        y = b.op("tensor.cast", [y], tensor_text((S, T), "f32"))
    replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((S, T), "f32"))])
