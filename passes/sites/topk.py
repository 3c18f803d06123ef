"""`torch.aten.topk`, as topk-to-linalg-ext and topk-to-radix-select read it:

    %values, %indices = torch.aten.topk %x, %k, %dim, %largest, %sorted
        : !torch.vtensor<[...,N],f>, !torch.int, !torch.int, !torch.bool, !torch.bool
        -> !torch.vtensor<[...,k],f>, !torch.vtensor<[...,k],si64>

with k, dim, largest and sorted from torch constants, dim the last dim (-1 or rank-1), f a float
dtype, rank >= 1, 1 <= k and k <= N when N is static (leading dims and N may be dynamic).
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation, Value
from day0.passes.base import DiagnosticEngine
from day0.passes.sites.contract import Broken, constant, report
from day0.passes.torch_ir import TensorType, fmt_dims

OP_NAME = "torch.aten.topk"
FLOAT_DTYPES = ("f16", "bf16", "f32", "f64")


@dataclass(frozen=True)
class TopkSite:
    """A topk op that keeps the contract."""

    op: Operation
    x: Value
    dims: tuple[int | None, ...]  # input dims, the row last
    dtype: str
    k: int
    largest: bool
    sorted: bool


def static_row_length(op: Operation) -> int | None:
    """The static length of a topk's rows (its input's last dim), else None; the op unchecked."""
    x = TensorType.of(op.operands[0])
    return x.dims[-1] if x is not None and x.dims else None


def match_topk(op: Operation, diag: DiagnosticEngine) -> TopkSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, "topk", topk_site)


def topk_site(op: Operation) -> TopkSite:
    """The site of `op`, or Broken."""
    x_v, k_v, dim_v, largest_v, sorted_v = op.operands
    x = TensorType.of(x_v)
    if x is None:
        raise Broken(f"input must be a !torch.vtensor, got {x_v.type}")
    if x.dtype not in FLOAT_DTYPES:
        raise Broken(f"input must be a float tensor ({', '.join(FLOAT_DTYPES)}), got {x.dtype}")
    rank = len(x.dims)
    if rank == 0:
        raise Broken("input must have rank >= 1")
    k = constant(k_v, "torch.constant.int", "k")
    dim = constant(dim_v, "torch.constant.int", "dim")
    if dim not in (-1, rank - 1):
        raise Broken(f"dim {dim} is not the last dim of the rank-{rank} input (only -1 or {rank - 1})")
    largest = constant(largest_v, "torch.constant.bool", "largest")
    sorted_ = constant(sorted_v, "torch.constant.bool", "sorted")
    n = x.dims[-1]
    if k < 1:
        raise Broken(f"k must be >= 1, got {k}")
    if n is not None and k > n:
        raise Broken(f"k={k} is larger than the row length {n}")
    want = (*x.dims[:-1], k)
    for what, res, dtype in (("values", op.results[0], x.dtype), ("indices", op.results[1], "si64")):
        t = TensorType.of(res)  # exactly: a rewrite's results replace these values
        if t is None or t.dtype != dtype or t.dims != want:
            raise Broken(f"{what} must be !torch.vtensor<{fmt_dims(want)},{dtype}>, got {res.type}")
    return TopkSite(op, x_v, x.dims, x.dtype, k, bool(largest), bool(sorted_))
