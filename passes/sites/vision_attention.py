"""`torch.day0.vision_attention` (frontend/ops.py), as vision-attention-to-cuda-kernel reads it:

    %o = torch.operator "torch.day0.vision_attention"(%q, %k, %v, %segments, %scale)
         : (!torch.vtensor<[P,H,D],f32>, !torch.vtensor<[P,H,D],f32>, !torch.vtensor<[P,H,D],f32>,
            !torch.vtensor<[P],si64>, !torch.float) -> !torch.vtensor<[P,H,D],f32>

with P, H and D static (the tower's entry points are compiled at static patch counts) and
`%scale` from torch.constant.float. (Export keeps the op whole only for targets whose pipeline
lowers it, and only at head dims the kernel takes: frontend/ops.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation
from day0.passes.base import DiagnosticEngine
from day0.passes.sites.contract import Broken, constant, operands, ranked_vtensors, report
from day0.passes.torch_ir import fmt_dims

OP_NAME = "torch.day0.vision_attention"


@dataclass(frozen=True)
class VisionAttentionSite:
    """A vision_attention op that keeps the contract; its operands are (q, k, v, segments, scale)."""

    op: Operation
    P: int
    H: int
    D: int
    scale: float


def match_vision_attention(op: Operation, diag: DiagnosticEngine) -> VisionAttentionSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, "vision_attention", vision_attention_site)


def vision_attention_site(op: Operation) -> VisionAttentionSite:
    """The site of `op`, or Broken."""
    q_v, k_v, v_v, seg_v, scale_v = operands(op, ("q", "k", "v", "segments", "scale"))
    q, k, v, seg, out = ranked_vtensors(
        [("q", q_v, 3), ("k", k_v, 3), ("v", v_v, 3), ("segments", seg_v, 1), ("result", op.result, 3)]
    )
    if any(t.dtype != "f32" for t in (q, k, v, out)):
        raise Broken(f"q, k, v and result must be f32, got {q.dtype}, {k.dtype}, {v.dtype}, {out.dtype}")
    if seg.dtype != "si64":
        raise Broken(f"segments must be si64, got {seg.dtype}")
    if None in q.dims:
        raise Broken(f"q must have a static shape [P, H, D], got {fmt_dims(q.dims)}")
    if not (k.dims == v.dims == out.dims == q.dims and seg.dims == q.dims[:1]):
        shapes = [
            f"{n} {fmt_dims(t.dims)}" for n, t in (("q", q), ("k", k), ("v", v), ("segments", seg), ("result", out))
        ]
        raise Broken("shapes disagree: " + ", ".join(shapes))
    return VisionAttentionSite(op, *q.dims, constant(scale_v, "torch.constant.float", "scale"))
