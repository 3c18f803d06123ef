"""topk-to-linalg-ext: rewrite `torch.aten.topk` over the last dim into `iree_linalg_ext.topk`.

Without this pass torch-mlir lowers topk to a full `iree_linalg_ext.sort` of every row (orders of
magnitude slower than `iree_linalg_ext.topk` for a decode step's long row on the CPU), and a
function with two sorted topk's over rows masked by one causal mask with a dynamic row count
returned wrong indices for the second one.

Precondition: every

    %values, %indices = torch.aten.topk %x, %k, %dim, %largest, %sorted
        : !torch.vtensor<[...,N],f>, !torch.int, !torch.int, !torch.bool, !torch.bool
        -> !torch.vtensor<[...,k],f>, !torch.vtensor<[...,k],si64>

keeps the contract of passes/sites/topk.py: k, dim, largest and sorted from torch constants, dim
the last dim (-1 or rank-1), a float input and 1 <= k <= N when N is static (leading dims and N
may be dynamic). Afterwards no such topk is left, except over static rows shorter than
`min-size`, which keep torch-mlir's lowering.

Rewrite (shown for largest=true; largest=false flips `ogt` to `olt` and -inf to +inf):
    xb       = torch_c.to_builtin_tensor x                         # tensor<...xNxf>
    vals0    = linalg.fill(-inf)       : tensor<...xkxf>           # empty slots
    idx0     = linalg.fill(INT32_MAX)  : tensor<...xkxi32>
    v, i32   = iree_linalg_ext.topk dimension(r-1) ins(xb) outs(vals0, idx0) { a > b }
    values   = torch_c.from_builtin_tensor v
    indices  = aten.to.dtype(torch_c.from_builtin_tensor i32, int64)

Selection rule, from IREE's topk (each row element is inserted into the k slots; a slot is
displaced when the comparator says the element comes first, or when the comparator calls the
two equal in both directions and the element has the lower index): the result is the first k
of the row ordered by (value descending, index ascending) — exactly a stable descending sort.
So among equal values the lower index wins, and values come out sorted (sorted=false is
served the same way). The empty slots start as (-inf, INT32_MAX): any row element, -inf
included, beats that sentinel on the index, so a row with fewer than k finite values still
returns the lowest-index -inf positions, as a stable sort does. (With index 0 as the
sentinel, as IREE's own examples use, such a row would return index 0 repeatedly.)
Not matched to torch: NaN (torch ranks it above +inf; `>` never selects it), and a dynamic row
shorter than k at run time (torch raises; here the missing slots keep the sentinel).
IREE's optional topk split reduction (`--iree-dispatch-creation-topk-split-reduction`, off by
default) uses the same (-inf, INT32_MAX) sentinel for its partial results, and the merge keeps
the same lexicographic order (checked: ratio 4, tied and -inf-padded rows, same selection).

Cost: the CPU code inserts every row element into the k slots, O(N·k) a row, so a large k costs
in proportion.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import (
    FloatAttr,
    InsertionPoint,
    IntegerAttr,
    IntegerType,
    Operation,
    RankedTensorType,
    Type,
    Value,
    ir,
)
from day0.passes.base import DiagnosticEngine, ModulePass, collect_sites
from day0.passes.sites.topk import OP_NAME, TopkSite, match_topk
from day0.passes.torch_ir import TensorType, TorchBuilder, replace_op

_INDEX_SENTINEL = 2**31 - 1  # the index of an empty slot: loses every tie
_CMPF = {True: 2, False: 4}  # largest -> arith.cmpf predicate (2 = ogt, 4 = olt)


def _builtin(dims, elem: Type) -> Type:
    return RankedTensorType.get([ir.ShapedType.get_dynamic_size() if d is None else d for d in dims], elem)


def _rewrite(site: TopkSite) -> tuple[Value, Value]:
    """Emit the linalg_ext topk before `site.op`; return the torch (values, indices)."""
    op, loc = site.op, site.op.location
    ip = InsertionPoint(op)

    def create(name, results, operands, attrs=None, regions=0):
        return Operation.create(
            name, results=results, operands=operands, attributes=attrs or {}, regions=regions, loc=loc, ip=ip
        )

    rank = len(site.dims)
    elem = Type.parse(site.dtype)  # f16, bf16, f32, f64: the same spelling as in torch
    i32, i64, index = IntegerType.get_signless(32), IntegerType.get_signless(64), ir.IndexType.get()
    out_dims = (*site.dims[:-1], site.k)

    xb = create("torch_c.to_builtin_tensor", [_builtin(site.dims, elem)], [site.x]).result
    # Output shapes: the leading dims of the input, k last; dynamic ones read with tensor.dim.
    sizes = []
    for i, d in enumerate(site.dims[:-1]):
        if d is None:
            c = create("arith.constant", [index], [], {"value": IntegerAttr.get(index, i)}).result
            sizes.append(create("tensor.dim", [index], [xb, c]).result)

    def filled(elem_type: Type, value_attr) -> Value:
        empty = create("tensor.empty", [_builtin(out_dims, elem_type)], sizes).result
        fill_value = create("arith.constant", [elem_type], [], {"value": value_attr}).result
        fill = create(
            "linalg.fill",
            [empty.type],
            [fill_value, empty],
            {"operandSegmentSizes": ir.DenseI32ArrayAttr.get([1, 1])},
            regions=1,
        )
        block = fill.regions[0].blocks.append(elem_type, elem_type, arg_locs=[loc, loc])
        with InsertionPoint(block):
            Operation.create("linalg.yield", operands=[block.arguments[0]], loc=loc)
        return fill.result

    empty_value = float("-inf") if site.largest else float("inf")
    vals0 = filled(elem, FloatAttr.get(elem, empty_value))
    idx0 = filled(i32, IntegerAttr.get(i32, _INDEX_SENTINEL))
    # topk keeps, per row, the first k under (value by the comparator, then lower index first).
    topk = create(
        "iree_linalg_ext.topk",
        [vals0.type, idx0.type],
        [xb, vals0, idx0],
        {"dimension": IntegerAttr.get(i64, rank - 1)},
        regions=1,
    )
    block = topk.regions[0].blocks.append(elem, elem, arg_locs=[loc, loc])
    with InsertionPoint(block):
        # strict: a > b (largest) or a < b (smallest); equal values fall to the index rule
        cmp = Operation.create(
            "arith.cmpf",
            results=[IntegerType.get_signless(1)],
            operands=list(block.arguments),
            attributes={"predicate": IntegerAttr.get(i64, _CMPF[site.largest])},
            loc=loc,
        )
        Operation.create("iree_linalg_ext.yield", operands=[cmp.result], loc=loc)

    values = create("torch_c.from_builtin_tensor", [TensorType(out_dims, site.dtype).mlir()], [topk.results[0]]).result
    idx32 = create("torch_c.from_builtin_tensor", [TensorType(out_dims, "si32").mlir()], [topk.results[1]]).result
    # indices = aten.to.dtype(idx32, int64): torch's topk returns si64
    b = TorchBuilder(op)
    indices = b.to_dtype(idx32, TensorType(out_dims, "si64"))
    return values, indices


@dataclass(frozen=True)
class TopkToLinalgExt(ModulePass):
    """Options:
    min-size  rewrite only topk's whose static row length is >= min-size (default 0: all);
              shorter rows keep torch-mlir's sort lowering. A dynamic row length always counts
              as long enough.
    """

    name = "topk-to-linalg-ext"
    option_minimums = {"min_size": 0}
    min_size: int = 0

    def apply(self, module_op: Operation, diag: DiagnosticEngine) -> None:
        for site in collect_sites(module_op, lambda op: op.name == OP_NAME, match_topk, diag):
            n = site.dims[-1]
            if n is not None and n < self.min_size:
                continue
            with site.op.location:  # the location type builders fall back on
                replace_op(site.op, _rewrite(site))
