"""The DSA lightning indexer: scores every visible cached token for each query, keeps the top-k.

    q_{t,h} = W_qb · q_resid_t               [S, H_I, d_I]
    k_s     = LayerNorm(W_k · x_s)           [T, d_I]   (the indexer key cache holds these rows)
    RoPE (half split) on the first rope_dim dims of q and k
    I_{t,s} = Σ_h w_{t,h} · ReLU(d_I^-½ · q_{t,h}·k_s),   w = W_w · x · H_I^-½
    S_t     = top-k over visible s (s ≤ position of t)

Tie rule: among equal scores the lower position wins. The eager path sorts stably to get exactly
that; the exported path uses aten.topk, which IREE lowers keeping the lower index (tested).
Invisible slots come back as -1, the empty-slot marker `day0::dsa_attention` understands.
They are masked with a large finite negative score, not -inf: IREE's CUDA top-k does not insert
elements equal to its -inf initial value, so a row with fewer visible keys than k came back with
position 0 repeated (seen on the H200 with tools/bench/gpu_op_check.py).
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.frontend import ops
from day0.models.layers import rope_columns
from day0.models.paging import CacheView

INVISIBLE = ops.EMPTY_SCORE  # the score of a position a query may not select


def select_topk(scores: Tensor, k: int) -> Tensor:
    """Indices [S, k] int64 of the k largest scores per row, lower index first on ties, -1 where
    the selected score is INVISIBLE or lower (-inf included)."""
    if torch.compiler.is_exporting():
        # sorted=False: the selection is a set (attention over it is order-free), and the CUDA
        # radix select returns it in position order.
        values, indices = torch.topk(scores, k, dim=-1, sorted=False)
    else:
        values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
        values, indices = values[:, :k], indices[:, :k]
    return torch.where(values <= INVISIBLE, torch.full_like(indices, -1), indices)


class Indexer(nn.Module):
    def __init__(self, hidden: int, q_lora_rank: int, heads: int, head_dim: int, rope_dim: int, topk: int):
        super().__init__()
        self.heads, self.head_dim, self.rope_dim, self.topk = heads, head_dim, rope_dim, topk
        self.wq_b = nn.Linear(q_lora_rank, heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(hidden, heads, bias=False)

    @property
    def weight_scale(self) -> float:
        """H_I^-½, the factor of the weights_proj projection (`select`'s head_weights)."""
        return self.heads**-0.5

    def keys(self, projected: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Indexer key rows [S, d_I] from the new tokens' `wk` projection [S, d_I] (the caller
        computes it beside its other projections of x: layers.linears; cos/sin [S, rope/2])."""
        w, b = self.k_norm.weight.float(), self.k_norm.bias.float()
        k = F.layer_norm(projected, (self.head_dim,), w, b, self.k_norm.eps)
        return rope_columns(k, cos, sin, 0, self.rope_dim, interleaved=False)

    def select(
        self, head_weights: Tensor, projected: Tensor, cos: Tensor, sin: Tensor, cache: Tensor, view: CacheView, k: int
    ) -> Tensor:
        """Selected slots [S, k] int64 (-1 = empty) of the key range of `view` (models/paging.py)
        in the indexer key `cache` (new keys already written) for the new tokens, whose
        `weights_proj` projection times `weight_scale` is head_weights [S, H_I] (computed with
        the caller's other projections of x, like `keys`' input) and whose `wq_b` projection of
        q_resid is projected [S, H_I · d_I] (computed with the caller's other projections of q_resid:
        layers.linears); k: the static selection width
        (≤ index_topk). The op reads the keys in place: through the key range's slot rows and
        the queries' positions when the range is shared (a prompt chunk, dense or paged), else
        through each query's rows (a batched decode step).
        """
        q = projected.view(projected.shape[0], self.heads, self.head_dim)
        q = rope_columns(q, cos, sin, 0, self.rope_dim, interleaved=False)
        scale = self.head_dim**-0.5
        # k empty columns keep top-k defined when fewer than k keys are in range (a short first
        # prefill over its own L = S keys); they come back as -1 like any invisible slot
        if view.per_query:
            # its invisible and padding slots get row -1, which the op scores INVISIBLE itself (the
            # row map is the same for every layer of a step: IREE computes it once); each of the
            # L + k columns reads its own slot through a clamped index
            width = view.keys
            col = torch.arange(width + k)
            inside = col.clamp(max=width - 1)
            keep = (col < width) & view.visible.index_select(-1, inside)
            rows = torch.where(keep, view.key_rows.index_select(-1, inside), -1)
            return select_topk(ops.indexer_scores(q, cache, head_weights, scale, rows), k)
        # one key range for every query: the op masks slots past each query's position and the
        # padding (row -1) itself, so no [S, L] mask or masked copy of the scores is made
        rows = torch.cat([view.slot_rows, torch.full((k,), -1, dtype=torch.int64)])
        return select_topk(ops.indexer_scores(q, cache, head_weights, scale, rows, view.positions), k)
