"""`torch.day0.dsa_attention` (frontend/ops.py), as dsa-to-gather-tiles and dsa-to-cuda-kernel read it:

    %o = torch.operator "torch.day0.dsa_attention"(%q, %kv, %idx, %scale, %vdim)
         : (!torch.vtensor<[S,H,D],f>, !torch.vtensor<[T,D],f>, !torch.vtensor<[S,K],i>,
            !torch.float, !torch.int) -> !torch.vtensor<[S,H,V],f32>

with H, D, K static (the query count S and the cache rows T may be `?`: a paged pool's size is
chosen at load), f (q and kv alike) f32, bf16 or f16, i si64
or si32, `%scale` from `torch.constant.float` and `%vdim` = V from `torch.constant.int`, 0 < V <= D
(values are kv[:, :V]). The result is f32 whatever f is.
"""

from __future__ import annotations

from dataclasses import dataclass

from day0.frontend.ir import Operation, Value
from day0.passes.base import DiagnosticEngine
from day0.passes.sites.contract import Broken, constant, operands, ranked_vtensors, report
from day0.passes.torch_ir import fmt_dim, fmt_dims

OP_NAME = "torch.day0.dsa_attention"
FLOAT_DTYPES = ("f32", "bf16", "f16")
INDEX_DTYPES = ("si64", "si32")


@dataclass(frozen=True)
class DsaAttentionSite:
    """A dsa_attention op that keeps the contract: its operands and static sizes."""

    op: Operation
    q: Value  # [S, H, D] dtype
    kv: Value  # [T, D] dtype
    idx: Value  # [S, K] idx_dtype
    S: int | None
    H: int
    D: int
    T: int | None
    K: int
    V: int
    scale: float
    dtype: str  # of q and kv
    idx_dtype: str


def match_dsa_attention(op: Operation, diag: DiagnosticEngine) -> DsaAttentionSite | None:
    """The site if `op` keeps the contract, else one error at the op and None."""
    return report(op, diag, "dsa_attention", dsa_attention_site)


def dsa_attention_site(op: Operation) -> DsaAttentionSite:
    """The site of `op`, or Broken."""
    q_v, kv_v, idx_v, scale_v, vdim_v = operands(op, ("q", "kv", "indices", "scale", "value_dim"))
    q, kv, idx, out = ranked_vtensors((("q", q_v, 3), ("kv", kv_v, 2), ("indices", idx_v, 2), ("result", op.result, 3)))
    if idx.dtype not in INDEX_DTYPES:
        raise Broken(f"indices must be integers (si64 or si32), got {idx.dtype}")
    if q.dtype not in FLOAT_DTYPES or kv.dtype != q.dtype:
        raise Broken(f"q and kv must share one float dtype (f32, bf16 or f16), got {q.dtype}, {kv.dtype}")
    if out.dtype != "f32":
        raise Broken(f"result must be f32 (whatever the q/kv dtype), got {out.dtype}")
    (S, H, D), (T, Dk), (Si, K) = q.dims, kv.dims, idx.dims
    if None in (H, D, Dk, K):
        raise Broken("H, D and K must be static (only the query count S and the cache rows T may be dynamic)")
    if Dk != D:
        raise Broken(f"kv row size {Dk} differs from the query size {D}")
    if Si != S:
        raise Broken(f"indices have {fmt_dim(Si)} rows but there are {fmt_dim(S)} queries")
    scale = constant(scale_v, "torch.constant.float", "scale")
    V = constant(vdim_v, "torch.constant.int", "value_dim")
    if not 0 < V <= D:
        raise Broken(f"value_dim {V} must be in [1, {D}] (values are kv[:, :value_dim])")
    if out.dims[1:] != (H, V) or out.dims[0] != S:
        raise Broken(f"result must be [{fmt_dim(S)},{H},{V}], got {fmt_dims(out.dims)}")
    return DsaAttentionSite(op, q_v, kv_v, idx_v, S, H, D, T, K, V, scale, q.dtype, idx.dtype)
