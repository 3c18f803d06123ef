"""`torch.day0.moe_route` (frontend/ops.py), as moe-route-to-cuda-kernel reads it:

    %w, %e = torch.operator "torch.day0.moe_route"(%logits, %bias, %groups, %topk_group, %top_k,
                                                   %normalize, %scaling)
         : (!torch.vtensor<[S,E],f32>, !torch.vtensor<[E],f32>, !torch.int, !torch.int, !torch.int,
            !torch.bool, !torch.float) -> (!torch.vtensor<[S,k],f32>, !torch.vtensor<[S,k],si64>)

with E static (S static or dynamic), k = top_k, and the five scalars from torch.constant ops.
(Export keeps the op whole only for targets whose pipeline lowers it: lowering/targets.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation
from day0.passes.base import DiagnosticEngine
from day0.passes.sites.contract import Broken, constant, ranked_vtensors, report
from day0.passes.torch_ir import fmt_dims

OP_NAME = "torch.day0.moe_route"
NAMES = ("logits", "bias", "groups", "topk_group", "top_k", "normalize", "scaling")


@dataclass(frozen=True)
class MoeRouteSite:
    """A moe_route op that keeps the contract."""

    op: Operation
    S: int | None
    E: int
    groups: int
    topk_group: int
    top_k: int
    normalize: bool
    scaling: float


def match_moe_route(op: Operation, diag: DiagnosticEngine) -> MoeRouteSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, "moe_route", moe_route_site)


def moe_route_site(op: Operation) -> MoeRouteSite:
    """The site of `op`, or Broken."""
    if len(op.operands) != len(NAMES) or len(op.results) != 2:
        raise Broken(f"expected {len(NAMES)} operands ({', '.join(NAMES)}) and 2 results (weights, experts)")
    logits_v, bias_v, *scalars = op.operands
    logits, bias, weights, experts = ranked_vtensors(
        [("logits", logits_v, 2), ("bias", bias_v, 1), ("weights", op.results[0], 2), ("experts", op.results[1], 2)]
    )
    if (logits.dtype, bias.dtype, weights.dtype, experts.dtype) != ("f32", "f32", "f32", "si64"):
        raise Broken(
            "logits, bias and weights must be f32 and experts si64, got "
            f"{logits.dtype}, {bias.dtype}, {weights.dtype}, {experts.dtype}"
        )
    S, E = logits.dims
    if E is None:
        raise Broken("the expert count (logits' last dim) must be static")
    kinds = ("int", "int", "int", "bool", "float")
    groups, topk_group, top_k, normalize, scaling = (
        constant(v, f"torch.constant.{kind}", name) for v, kind, name in zip(scalars, kinds, NAMES[2:])
    )
    if bias.dims != (E,) or weights.dims != (S, top_k) or experts.dims != (S, top_k):
        shapes = ", ".join(
            f"{n} {fmt_dims(t.dims)}"
            for n, t in zip(("logits", "bias", "weights", "experts"), (logits, bias, weights, experts))
        )
        raise Broken(f"shapes disagree (top_k={top_k}): {shapes}")
    return MoeRouteSite(op, S, E, groups, topk_group, top_k, normalize, scaling)
