"""`torch.day0.indexer_scores` (frontend/ops.py), as indexer-scores-to-cuda-kernel reads it:

    %o = torch.operator "torch.day0.indexer_scores"(%q, %keys, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[T,D],f32|bf16>, !torch.vtensor<[S,H],f32>,
            !torch.float) -> !torch.vtensor<[S,T],f32>

with H and D static (S and T static or dynamic) and `%scale` from torch.constant.float; and its
rows form `torch.day0.indexer_scores_rows` (a batched decode step over a paged pool),

    %o = torch.operator "torch.day0.indexer_scores_rows"(%q, %pool, %rows, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[R,D],f32|bf16>, !torch.vtensor<[S,T],si64>,
            !torch.vtensor<[S,H],f32>, !torch.float) -> !torch.vtensor<[S,T],f32>

(R, the pool's rows, any); and its causal form `torch.day0.indexer_scores_causal` (a prompt chunk:
one key range for every query, read in place, slots past each query's position empty),

    %o = torch.operator "torch.day0.indexer_scores_causal"(%q, %cache, %rows, %last, %w, %scale)
         : (!torch.vtensor<[S,H,D],f32>, !torch.vtensor<[R,D],f32|bf16>, !torch.vtensor<[T],si64>,
            !torch.vtensor<[S],si64>, !torch.vtensor<[S,H],f32>, !torch.float) -> !torch.vtensor<[S,T],f32>

(R any). (Export keeps the ops whole only for targets whose pipeline lowers
them: lowering/targets.py.)
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation
from day0.passes.base import DiagnosticEngine, operator_name
from day0.passes.sites.contract import Broken, constant, operands, report
from day0.passes.torch_ir import TensorType, fmt_dims

OP_NAME = "torch.day0.indexer_scores"
ROWS_OP_NAME = "torch.day0.indexer_scores_rows"
CAUSAL_OP_NAME = "torch.day0.indexer_scores_causal"
KEY_DTYPES = ("f32", "bf16")


@dataclass(frozen=True)
class IndexerScoresSite:
    """An indexer_scores op that keeps the contract; its operands are the op's (q, keys, w, scale),
    (q, pool, rows, w, scale) for the rows form, or (q, cache, rows, last, w, scale) for the causal
    form (causal: rows [T] shared by every query)."""

    op: Operation
    S: int | None
    H: int
    D: int
    T: int | None
    key_dtype: str
    scale: float
    rows: bool = False
    causal: bool = False

    @property
    def what(self) -> str:
        """The op's name in messages: indexer_scores, indexer_scores_rows or indexer_scores_causal."""
        return label(self.op)


def label(op: Operation) -> str:
    return operator_name(op).removeprefix("torch.day0.")


def match_indexer_scores(op: Operation, diag: DiagnosticEngine) -> IndexerScoresSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, label(op), indexer_scores_site)


def indexer_scores_site(op: Operation) -> IndexerScoresSite:
    """The site of `op`, or Broken."""
    causal, per_query = operator_name(op) == CAUSAL_OP_NAME, operator_name(op) == ROWS_OP_NAME
    names = ("q", "keys", "rows", "weights", "scale") if per_query else ("q", "keys", "weights", "scale")
    names = ("q", "keys", "rows", "last", "weights", "scale") if causal else names
    *tensors, scale_v = operands(op, names)
    types = [TensorType.of(v) for v in (*tensors, op.result)]
    ranks = (3, 2, 1, 1, 2, 2) if causal else (3, 2, 2, 2, 2) if per_query else (3, 2, 2, 2)
    for what, t, rank in zip((*names[:-1], "result"), types, ranks):
        if t is None or len(t.dims) != rank:
            raise Broken(f"{what} must be a rank-{rank} !torch.vtensor")
    named = dict(zip((*names[:-1], "result"), types))
    q, keys, r, last, w, out = (named.get(n) for n in ("q", "keys", "rows", "last", "weights", "result"))
    (S, H, D), Dk = q.dims, keys.dims[1]
    if q.dtype != "f32" or w.dtype != "f32" or out.dtype != "f32":
        raise Broken(f"q, weights and result must be f32, got {q.dtype}, {w.dtype}, {out.dtype}")
    if keys.dtype not in KEY_DTYPES:
        raise Broken(f"keys must be f32 or bf16, got {keys.dtype}")
    for what, t in (("rows", r), ("last", last)):
        if t is not None and t.dtype != "si64":
            raise Broken(f"{what} must be si64, got {t.dtype}")
    if None in (H, D, Dk):
        raise Broken("H and D must be static (the query count S and key count T may be dynamic)")
    T = r.dims[-1] if r is not None else keys.dims[0]
    bad_rows = causal and last.dims[0] != S or per_query and r.dims[0] != S
    if Dk != D or w.dims != (S, H) or out.dims != (S, T) or bad_rows:
        shapes = [f"q {fmt_dims(q.dims)}", f"keys {fmt_dims(keys.dims)}"]
        shapes += [f"rows {fmt_dims(r.dims)}"] if r is not None else []
        shapes += [f"last {fmt_dims(last.dims)}"] if causal else []
        shapes += [f"weights {fmt_dims(w.dims)}", f"result {fmt_dims(out.dims)}"]
        raise Broken("shapes disagree: " + ", ".join(shapes))
    scale = constant(scale_v, "torch.constant.float", "scale")
    return IndexerScoresSite(op, S, H, D, T, keys.dtype, scale, per_query, causal)
