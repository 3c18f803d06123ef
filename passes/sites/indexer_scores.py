"""`torch.day0.indexer_scores` (frontend/ops.py), as indexer-scores-to-cuda-kernel reads it:

    %o = torch.operator "torch.day0.indexer_scores"(%q, %keys, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[T,D],f32|bf16>, !torch.vtensor<[S,H],f32>,
            !torch.float) -> !torch.vtensor<[S,T],f32>

with H and D static (S and T static or dynamic) and `%scale` from torch.constant.float. (Export
keeps the op whole only for targets whose pipeline lowers it: lowering/targets.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation
from day0.passes.base import DiagnosticEngine
from day0.passes.sites.contract import Broken, constant, operands, report
from day0.passes.torch_ir import TensorType, fmt_dims

OP_NAME = "torch.day0.indexer_scores"
KEY_DTYPES = ("f32", "bf16")


@dataclass(frozen=True)
class IndexerScoresSite:
    """An indexer_scores op that keeps the contract; its operands are the op's (q, keys, w, scale)."""

    op: Operation
    S: int | None
    H: int
    D: int
    T: int | None
    key_dtype: str
    scale: float


def match_indexer_scores(op: Operation, diag: DiagnosticEngine) -> IndexerScoresSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, "indexer_scores", indexer_scores_site)


def indexer_scores_site(op: Operation) -> IndexerScoresSite:
    """The site of `op`, or Broken."""
    *tensors, scale_v = operands(op, ("q", "keys", "weights", "scale"))
    q, keys, w, out = (TensorType.of(v) for v in (*tensors, op.result))
    for what, t, rank in (("q", q, 3), ("keys", keys, 2), ("weights", w, 2), ("result", out, 2)):
        if t is None or len(t.dims) != rank:
            raise Broken(f"{what} must be a rank-{rank} !torch.vtensor")
    (S, H, D), (T, Dk) = q.dims, keys.dims
    if q.dtype != "f32" or w.dtype != "f32" or out.dtype != "f32":
        raise Broken(f"q, weights and result must be f32, got {q.dtype}, {w.dtype}, {out.dtype}")
    if keys.dtype not in KEY_DTYPES:
        raise Broken(f"keys must be f32 or bf16, got {keys.dtype}")
    if None in (H, D, Dk):
        raise Broken("H and D must be static (the query count S and key count T may be dynamic)")
    if Dk != D or w.dims != (S, H) or out.dims != (S, T):
        raise Broken(
            f"shapes disagree: q {fmt_dims(q.dims)}, keys {fmt_dims(keys.dims)}, weights "
            f"{fmt_dims(w.dims)}, result {fmt_dims(out.dims)}"
        )
    scale = constant(scale_v, "torch.constant.float", "scale")
    return IndexerScoresSite(op, S, H, D, T, keys.dtype, scale)
