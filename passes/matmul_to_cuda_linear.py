"""matmul-to-cuda-linear: a linear layer of a batched decode step (few rows of x against a bf16
weight the model widens to f32) runs as day0's CUDA kernel (lowering/kernels/linear_bf16.cu), one
IREE external dispatch, on the cuda-sm90 target.

Why: IREE 3.13 runs these products at 5-17x their weight bytes' time for 64 rows (stacked
bf16-term matmuls of 192 rows, matmul-to-bf16-terms) and as f32 SIMT matmuls for 4 or 16 rows;
the kernel splits x into three bf16 terms itself (f32 accuracy, as matmul-to-bf16-terms'
default) and spreads the weight over a cluster of CTAs along K. It beats IREE's products at
every 64-row shape of the benchmark model but the dense gate (tools/bench/gpu_linear_check.py;
docs/perf.md, "Where the 64-sequence step goes"), so cuda-sm90 runs it before
matmul-to-bf16-terms. One row (a single sequence's matvec) stays with IREE by default
(min-rows=2): its matvec is near the bytes' time there, and IREE fuses its neighbours into it,
where an external dispatch is a launch of its own. That cost remains where IREE fused a
neighbour into a matmul of more rows (the indexer's per-column factor on the fused projections
of x, a slice of the result): those become launches of their own (tiny bench config,
paged_decode_4: 66 -> 70).

Matched: `torch.aten.mm` of x f32 [M, K] (static, not itself a widened bf16 value) and an operand
that is a bf16 weight [N, K] widened to f32 and transposed (through layout ops, as
matmul_to_bf16_terms.widened_chain reads them: export's widen then permute [1, 0], or the
transpose of the bf16 value then the widen), with min-rows <= M <= 64 and K a multiple of 8
(kernel_geometry.linear_limits); any other matmul is left alone, no errors.
Rewrite (the weight's layout ops before the transpose rebuilt on the bf16 value):
    %y = torch.aten.mm %x, %wt      (%wt = permute(widen(%w)))
 -> %y = func.call @day0_linear_bf16_<M>x<N>x<K>(x, w)  (builtin tensors)
with the function holding one flow.dispatch of @day0_linear_bf16_c<S> over (ceil(N / 64), S),
S the cluster size kernel_geometry.linear_cluster picks, push constants M, N, K.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation, Value, ir
from day0.lowering import kernel_geometry as kg
from day0.passes.base import DiagnosticEngine, ModulePass, collect_ops
from day0.passes.extern_dispatch import call_kernels, executable_source_text
from day0.passes.matmul_to_bf16_terms import _erase_dead, _rebuild, widened_chain
from day0.passes.torch_ir import TensorType, TorchBuilder, defining_op, replace_op, torch_constant

EXECUTABLE = kg.LINEAR_BF16.executable


def _list_ints(v: Value) -> list[int] | None:
    op = defining_op(v)
    if op is None or op.name != "torch.prim.ListConstruct":
        return None
    items = [torch_constant(i, "torch.constant.int") for i in op.operands]
    return None if None in items else items


def is_transpose_2d(op: Operation) -> bool:
    """op swaps the two dims of a 2-D tensor (aten.t, transpose.int of dims 0 and 1, permute [1, 0])."""
    t = TensorType.of(op.operands[0])
    if t is None or len(t.dims) != 2:
        return False
    if op.name == "torch.aten.t":
        return True
    if op.name == "torch.aten.transpose.int":
        dims = [torch_constant(v, "torch.constant.int") for v in list(op.operands)[1:3]]
        return None not in dims and sorted(d % 2 for d in dims) == [0, 1]
    if op.name == "torch.aten.permute":
        return _list_ints(op.operands[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0])
    return False


@dataclass(frozen=True)
class _Site:
    op: Operation
    M: int
    N: int
    K: int
    weight: tuple  # (bf16 source, layout ops to rebuild on it) whose result is the [N, K] weight
    dead: tuple[Operation, ...]  # the f32 chain's ops, erased when nothing reads them


def _weight(v: Value):
    """(bf16 src, chain to rebuild, f32 ops left dead) when `v` is a transposed widened bf16 [N, K]
    value, else None."""
    w = widened_chain(v)
    if w is None:
        return None
    dead = (*reversed(w.chain), w.widen)
    if w.chain and is_transpose_2d(w.chain[-1]):
        return w.src, w.chain[:-1], dead
    src = defining_op(w.src)
    if not w.chain and src is not None and is_transpose_2d(src):
        return src.operands[0], [], (*dead, src)
    return None


def match_site(op: Operation, min_rows: int) -> _Site | None:
    a, b = (TensorType.of(v) for v in op.operands)
    out = TensorType.of(op.results[0])
    if any(t is None or t.dtype != "f32" or None in t.dims or len(t.dims) != 2 for t in (a, b, out)):
        return None
    (M, K), N = a.dims, b.dims[1]
    if min_rows > M or kg.linear_limits(M, K) is not None or widened_chain(op.operands[0]) is not None:
        return None
    weight = _weight(op.operands[1])
    if weight is None:
        return None
    src, chain, dead = weight
    return _Site(op, M, N, K, (src, chain), dead)


def function_name(M: int, N: int, K: int) -> str:
    return f"day0_linear_bf16_{M}x{N}x{K}"


def function_text(M: int, N: int, K: int) -> str:
    S = kg.linear_cluster(M, N, K)
    gx, gy, _ = kg.linear_grid(N, S)
    x_t, w_t, o_t = f"tensor<{M}x{K}xf32>", f"tensor<{N}x{K}xbf16>", f"tensor<{M}x{N}xf32>"
    return f"""
  func.func private @{function_name(M, N, K)}(%x: {x_t}, %w: {w_t}) -> {o_t} {{
    %gx = arith.constant {gx} : index
    %gy = arith.constant {gy} : index
    %M = arith.constant {M} : i32
    %N = arith.constant {N} : i32
    %K = arith.constant {K} : i32
    %o = flow.dispatch @{EXECUTABLE}::@{kg.linear_entry(S)}[%gx, %gy](%M, %N, %K, %x, %w)
        : (i32, i32, i32, {x_t}, {w_t}) -> {o_t}
    return %o : {o_t}
  }}"""


def _rewrite(site: _Site, fn: str) -> None:
    op = site.op
    b = TorchBuilder(op)
    src, chain = site.weight
    w = _rebuild(b, src, list(chain))
    xb = b.op("torch_c.to_builtin_tensor", [op.operands[0]], f"tensor<{site.M}x{site.K}xf32>")
    wb = b.op("torch_c.to_builtin_tensor", [w], f"tensor<{site.N}x{site.K}xbf16>")
    y = b.op("func.call", [xb, wb], f"tensor<{site.M}x{site.N}xf32>", {"callee": ir.FlatSymbolRefAttr.get(fn)})
    replace_op(op, [b.op("torch_c.from_builtin_tensor", [y], TensorType((site.M, site.N), "f32"))])


@dataclass(frozen=True)
class MatmulToCudaLinear(ModulePass):
    """Options:
    min-rows  rewrite matmuls of at least this many rows of x (default 2: one row keeps IREE's
              matvec, which fuses its neighbours).
    """

    name = "matmul-to-cuda-linear"
    option_minimums = {"min_rows": 1}
    min_rows: int = 2

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        sites = [
            s
            for s in (
                match_site(op, self.min_rows) for op in collect_ops(module_op, lambda o: o.name == "torch.aten.mm")
            )
            if s is not None
        ]
        if not sites:
            return
        call_kernels(
            module_op,
            sites,
            lambda s: (s.M, s.N, s.K),
            function_name,
            function_text,
            _rewrite,
            executable_source_text(kg.LINEAR_BF16),
        )
        dead: list[Operation] = []
        for s in sites:
            dead += [o for o in s.dead if o not in dead]
        _erase_dead(dead)
