"""`torch.day0.mxfp4_linear` and `torch.day0.mxfp4_moe` (frontend/ops.py), as fuse-mxfp4-matmul and
mxfp4-to-cuda-matvec read them:

    %y = torch.operator "torch.day0.mxfp4_linear"(%x, %packed, %scales)
         : (!torch.vtensor<[M,K],f32>, !torch.vtensor<[N,K/2],ui8>, !torch.vtensor<[N,K/32],ui8>)
         -> !torch.vtensor<[M,N],f32>
    %y = torch.operator "torch.day0.mxfp4_moe"(%x, %packed, %scales, %experts)
         : (!torch.vtensor<[T,K],f32>, !torch.vtensor<[E,N,K/2],ui8>, !torch.vtensor<[E,N,K/32],ui8>,
            !torch.vtensor<[T,k],i>) -> !torch.vtensor<[T,k,N],f32>

    %y = torch.operator "torch.day0.mxfp4_moe_swiglu"(%gate_up, %packed, %scales, %experts, %limit)
         : (!torch.vtensor<[T,2K],f32>, <as mxfp4_moe's>, !torch.float) -> !torch.vtensor<[T,k,N],f32>

with N, K, E, k static, K a multiple of 32 (one E8M0 scale byte per 32 values, two E2M1 codes a
packed byte), i any integer dtype; only the row count M / T may be dynamic. mxfp4_moe_swiglu is
mxfp4_moe of x = silu(clamp(gate, max=limit)) · clamp(up, ±limit) from gate_up's halves, its
`%limit` from torch.constant.float (inf: no clamp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from day0.frontend.ir import Operation
from day0.passes.base import DiagnosticEngine, operator_name
from day0.passes.sites.contract import Broken, constant, operands, ranked_vtensors, report
from day0.passes.torch_ir import fmt_dim, fmt_dims

LINEAR = "torch.day0.mxfp4_linear"
MOE = "torch.day0.mxfp4_moe"
SWIGLU = "torch.day0.mxfp4_moe_swiglu"
OP_NAMES = (LINEAR, MOE, SWIGLU)
_LABELS = {LINEAR: "mxfp4_linear", MOE: "mxfp4_moe", SWIGLU: "mxfp4_moe_swiglu"}
EXPERT_DTYPES = ("si64", "si32", "ui8", "si8", "si16", "ui16", "ui32", "ui64")


@dataclass(frozen=True)
class Mxfp4Site:
    """An mxfp4_linear (moe False), mxfp4_moe or mxfp4_moe_swiglu (moe and swiglu True) op that
    keeps the contract; its operands are the op's (x, packed, scales[, experts[, limit]]), x being
    gate_up [T, 2K] for mxfp4_moe_swiglu."""

    op: Operation
    moe: bool
    lead: int | None  # M (linear) or T (moe); None = dynamic
    N: int
    K: int
    E: int = 0  # moe: experts in the weight stack
    k: int = 0  # moe: experts per token
    experts_dtype: str = "si64"
    swiglu: bool = False  # mxfp4_moe_swiglu: x is gate_up, staged through the SwiGLU
    limit: float = math.inf  # mxfp4_moe_swiglu's clamp (inf: none)

    @property
    def label(self) -> str:
        return _LABELS[operator_name(self.op)]


def match_mxfp4(op: Operation, diag: DiagnosticEngine) -> Mxfp4Site | None:
    """The site if `op` (an mxfp4_linear or mxfp4_moe) keeps the contract, else one error at the op
    and None."""
    return report(op, diag, _LABELS[operator_name(op)], mxfp4_site)


def mxfp4_site(op: Operation) -> Mxfp4Site:
    """The site of `op`, or Broken."""
    swiglu = operator_name(op) == SWIGLU
    moe = swiglu or operator_name(op) == MOE
    x_name = "gate_up" if swiglu else "x"
    names = (x_name, "packed", "scales", "experts") if moe else ("x", "packed", "scales")
    values = operands(op, (*names, "limit") if swiglu else names)
    limit = constant(values.pop(), "torch.constant.float", "limit") if swiglu else math.inf
    ranks = (2, 3, 3, 2, 3) if moe else (2, 2, 2, 2)
    x, packed, scales, *rest = ranked_vtensors(tuple(zip((*names, "result"), (*values, op.result), ranks)))
    if x.dtype != "f32":
        raise Broken(f"{x_name} must be f32, got {x.dtype}")
    for name, t in (("packed", packed), ("scales", scales)):
        if t.dtype != "ui8":
            raise Broken(f"{name} must be ui8, got {t.dtype}")
    lead, K = x.dims
    if K is None or None in packed.dims or None in scales.dims:
        raise Broken("K and the weight's dims must be static (only the row count may be dynamic)")
    *E, N, half = packed.dims
    if swiglu:  # K: the down projection's, half of gate_up's width
        if x.dims[1] != 4 * half:  # 2·K, K = 2 · packed's bytes a row
            raise Broken(f"gate_up has {K} columns, expected 2·K = {4 * half} for packed's K = {2 * half}")
        K //= 2
    if K % 32:
        raise Broken(f"K={K} (from {x_name}) is not a multiple of 32")
    if half * 2 != K:
        raise Broken(f"packed has {half} bytes a row, expected K/2 = {K // 2} for x's K={K}")
    want_scales = (*E, N, K // 32)
    if scales.dims != want_scales:
        raise Broken(f"scales must be {fmt_dims(want_scales)} (one byte per 32 values), got {fmt_dims(scales.dims)}")
    if not moe:
        out = rest[0]
        if out.dtype != "f32" or out.dims != (lead, N):
            raise Broken(f"result must be f32 {fmt_dims((lead, N))}, got {out.dtype} {fmt_dims(out.dims)}")
        return Mxfp4Site(op, False, lead, N, K)
    experts, out = rest
    if experts.dtype not in EXPERT_DTYPES:
        raise Broken(f"experts must be integers, got {experts.dtype}")
    if experts.dims[1] is None:
        raise Broken("the number of experts per token k must be static")
    if experts.dims[0] != lead:
        raise Broken(f"experts have {fmt_dim(experts.dims[0])} rows but x has {fmt_dim(lead)} tokens")
    want = (lead, experts.dims[1], N)
    if out.dtype != "f32" or out.dims != want:
        raise Broken(f"result must be f32 {fmt_dims(want)}, got {out.dtype} {fmt_dims(out.dims)}")
    return Mxfp4Site(op, True, lead, N, K, E[0], experts.dims[1], experts.dtype, swiglu, limit)
