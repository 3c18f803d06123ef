"""GLM-5's k-pool DSA indexer: scores pools of `kpool` consecutive tokens instead of tokens.

Per token s (no RoPE: GLM-5's MLA layers are NoPE):
    k_s      = LayerNorm(W_k · x_s)                              [d_I]
    gate_s   = W_gate · x_s                                      [d_I]  (index_kpool_compress_gate)
Pool p = tokens p·kpool … p·kpool + kpool − 1, per channel c a softmax over its tokens j:
    K_p[c]   = Σ_j softmax_j(gate_j[c] + ape[j, c]) · k_j[c]     (index_kpool_compress_ape [kpool, d_I])
Query t at position pos_t (q = W_qb · q_resid, w = W_w · x · H_I^-½):
    I_{t,p}  = Σ_h w_{t,h} · ReLU(d_I^-½ · q_{t,h} · K_p)        over complete pools (end ≤ pos_t)
    S_t      = tokens of the top (index_topk / kpool) pools, then (with always_select_tail) the
               tokens of the incomplete pool holding pos_t, up to pos_t: kpool − 1 more slots.
The selection is block-structured: every pool contributes kpool consecutive positions (or -1s).

State (two tensors per full-indexer layer):
    indexer_keys   [T, 2·d_I]       per token [k_s | gate_s]
    indexer_pools  [ceil(T/kpool), d_I]  K_p, rewritten whenever a token of pool p is written
A pool is only ever read once complete, and the step that completes it rewrote it from its
final rows. Decode rewrites the one pool holding the new token; prefill rewrites every pool
(static shape, O(T·d_I), no duplicate scatter indices).

Tie rule as models/dsa_indexer.py: among equal pool scores the lower pool wins.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.frontend import ops
from day0.models.dsa_indexer import INVISIBLE, select_topk
from day0.models.layers import linear
from day0.models.paging import CacheView


class KPoolIndexer(nn.Module):
    def __init__(
        self, hidden: int, q_lora_rank: int, heads: int, head_dim: int, topk: int, kpool: int, select_tail: bool
    ):
        super().__init__()
        self.heads, self.head_dim, self.topk, self.kpool = heads, head_dim, topk, kpool
        self.select_tail = select_tail
        self.wq_b = nn.Linear(q_lora_rank, heads * head_dim, bias=False)
        self.wk = nn.Linear(hidden, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(hidden, heads, bias=False)
        self.index_kpool_compress_ape = nn.Parameter(torch.empty(kpool, head_dim))
        self.index_kpool_compress_gate = nn.Parameter(torch.empty(head_dim, hidden))

    def pools(self, max_seq_len: int) -> int:
        return -(-max_seq_len // self.kpool)

    def selected_pools(self, max_seq_len: int) -> int:
        return min(self.topk // self.kpool, self.pools(max_seq_len))

    def width(self, max_seq_len: int) -> int:
        """K: selected positions per query (pools · kpool, plus kpool − 1 tail slots)."""
        return self.selected_pools(max_seq_len) * self.kpool + (self.kpool - 1 if self.select_tail else 0)

    def state_shapes(self, max_seq_len: int) -> tuple[tuple[int, int], tuple[int, int]]:
        return (max_seq_len, 2 * self.head_dim), (self.pools(max_seq_len), self.head_dim)

    def projections(self) -> tuple[nn.Module | Tensor, ...]:
        """The indexer's projections of x, in the order of `token_rows`, `update` and `select`'s
        inputs: (W_k, W_gate, W_w). The attention layer computes them with its own projections
        of x as one matmul (layers.linears, with `scales`)."""
        return self.wk, self.index_kpool_compress_gate, self.weights_proj

    def scales(self) -> tuple[float, ...]:
        """The factor of each of `projections`: W_w's outputs are the head weights times H_I^-½."""
        return 1.0, 1.0, self.heads**-0.5

    def token_rows(self, k: Tensor, gate: Tensor) -> Tensor:
        """[k | gate] rows [S, 2·d_I] for tokens whose W_k and W_gate projections are k, gate."""
        k = F.layer_norm(k, (self.head_dim,), self.k_norm.weight.float(), self.k_norm.bias.float(), self.k_norm.eps)
        return torch.cat([k, gate], -1)

    def pool_keys(self, token_cache: Tensor, pools: Tensor) -> Tensor:
        """K_p [P, d_I] for pool ids `pools` [P] from the token cache [T, 2·d_I] (rows past T are
        clamped: such a pool is never complete, never read)."""
        rows = (pools[:, None] * self.kpool + torch.arange(self.kpool, dtype=torch.int64)).clamp(
            max=token_cache.shape[0] - 1
        )
        grouped = token_cache.index_select(0, rows.reshape(-1)).view(pools.shape[0], self.kpool, 2 * self.head_dim)
        keys, gate = grouped[..., : self.head_dim], grouped[..., self.head_dim :]
        probs = torch.softmax(gate + self.index_kpool_compress_ape.float(), dim=1)
        return (probs * keys).sum(1)

    def update(
        self, k: Tensor, gate: Tensor, view: CacheView, token_cache: Tensor, pool_cache: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Write the new tokens' rows (from their W_k and W_gate projections k, gate [S, d_I])
        and rewrite the pools they touch; returns both caches. Caches addressed through `view`
        (dense, or paged pools whose blocks hold whole pools)."""
        token_cache = token_cache.index_copy(0, view.rows, self.token_rows(k, gate))
        if k.shape[0] > 1 and view.key_rows is None:  # a dense prompt: every pool (static shape)
            pool_cache = self.pool_keys(token_cache, torch.arange(pool_cache.shape[0], dtype=torch.int64))
        else:  # the pool of each new token (a block holds whole pools), from its final rows; the
            # tokens of one pool write the same keys there, so repeated indices agree
            pool = view.rows // self.kpool
            pool_cache = pool_cache.index_copy(0, pool, self.pool_keys(token_cache, pool))
        return token_cache, pool_cache

    def pool_scores(self, weights: Tensor, q_resid: Tensor, view: CacheView, pool_cache: Tensor) -> Tensor:
        """I [S, L/kpool] over the key range's pools, INVISIBLE where a pool is not complete at
        the query's position; weights [S, H_I]: W_w · x · H_I^-½ (`projections`, `scales`)."""
        s = weights.shape[0]
        q = linear(q_resid, self.wq_b).view(s, self.heads, self.head_dim)
        keys, rows = view.indexed_pools(pool_cache, self.kpool)  # [P, d_I], or the pool and rows [S, P]
        scores = ops.indexer_scores(q, keys, weights, self.head_dim**-0.5, rows)  # [S, P]
        complete = (view.positions[:, None] + 1) // self.kpool  # pools whose end is visible
        visible = torch.arange(scores.shape[1], dtype=torch.int64)[None, :] < complete
        return scores.masked_fill(~visible, INVISIBLE)

    def select(self, weights: Tensor, q_resid: Tensor, view: CacheView, pool_cache: Tensor, n: int) -> Tensor:
        """Selected slots [S, K] of the key range, int64 (-1 = empty): the top `n` whole pools
        (n = selected_pools(max_seq_len), static), then the visible tail; weights as
        `pool_scores`."""
        scores = F.pad(self.pool_scores(weights, q_resid, view, pool_cache), (0, n), value=INVISIBLE)
        pools = select_topk(scores, n)  # [S, n]
        offsets = torch.arange(self.kpool, dtype=torch.int64)
        tokens = torch.where(pools[..., None] >= 0, pools[..., None] * self.kpool + offsets, -1).flatten(1)
        if not self.select_tail:
            return tokens
        seen = view.positions[:, None] + 1  # [S, 1] tokens visible to the query
        count = seen % self.kpool
        tail = (seen - count) + offsets[: self.kpool - 1]  # [S, kpool - 1]
        return torch.cat([tokens, torch.where(offsets[: self.kpool - 1] < count, tail, -1)], -1)
