"""day0's custom ops: torch.library definitions, fake kernels and eager reference kernels.

Each op survives torch.export and torch-mlir's raw import as `torch.operator "torch.day0.<name>"`;
a pass in `day0.passes` expands it before IREE sees the module. The eager kernels here are the
semantic reference those passes are tested against.
"""

import torch
from torch import Tensor


@torch.library.custom_op("day0::dsa_attention", mutates_args=())
def dsa_attention(q: Tensor, kv: Tensor, indices: Tensor, scale: float, value_dim: int) -> Tensor:
    """Sparse MQA of every query over the KV rows the indexer selected.

    q:       [S, H, D]  f32   queries (absorbed MLA form: latent part then rope part)
    kv:      [T, D]     f32   one shared key row per cached position; values are kv[:, :value_dim]
    indices: [S, K]     i64   selected rows per query, -1 marks an empty slot
    returns: [S, H, value_dim] f32, softmax(scale · q·kᵀ) over the selected rows · v.
    A query whose slots are all empty gets zeros.
    """
    valid = indices >= 0  # [S, K]
    rows = kv[indices.clamp(min=0)]  # [S, K, D]
    scores = torch.einsum("shd,skd->shk", q, rows) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-empty rows: 0 instead of NaN
    return torch.einsum("shk,skv->shv", probs, rows[..., :value_dim])


@dsa_attention.register_fake
def _(q: Tensor, kv: Tensor, indices: Tensor, scale: float, value_dim: int) -> Tensor:
    torch._check(q.dim() == 3 and kv.dim() == 2 and indices.dim() == 2)
    return q.new_empty(q.shape[0], q.shape[1], value_dim)
