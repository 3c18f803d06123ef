"""Grouped-query attention with attention sinks over a static KV cache (gpt-oss).

A sink is one learned logit per query head that joins the softmax denominator and has no value:

    p_{t,s} = exp(q_t·k_s·scale) / (exp(sink_h) + Σ_{s' visible} exp(q_t·k_s'·scale))

so a head can put weight "nowhere". The cache keeps one row per position for every layer,
sliding-window layers included: the window is a mask (`visible`), not a ring buffer, which keeps
the cache layout and the index_copy write identical for all layers at the cost of attending over
T rows (masked) on sliding layers.
"""

import torch
from torch import Tensor, nn

from day0.models.layers import linear, linears, rotate_half_split
from day0.models.paging import CacheView


class SinkAttention(nn.Module):
    """Checkpoint names: q_proj, k_proj, v_proj, o_proj (with bias when `bias`), sinks [heads]."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.sinks = nn.Parameter(torch.empty(heads))
        self.scale = head_dim**-0.5

    def forward(
        self, x: Tensor, view: CacheView, cos: Tensor, sin: Tensor, visible: Tensor, k_cache: Tensor, v_cache: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [S, hidden]; cos, sin [S, head_dim/2]; caches [T, kv_heads, head_dim] f32 addressed
        through `view` (dense or paged: models/paging.py); visible [S, L]: the view's mask, windowed
        on sliding layers. Returns (out [S, hidden], k_cache, v_cache) with the new rows written."""
        s, g = x.shape[0], self.heads // self.kv_heads
        q, k, v = linears(x, self.q_proj, self.k_proj, self.v_proj)  # one matmul (layers.linears)
        q = rotate_half_split(q.reshape(s, self.heads, self.head_dim), cos, sin)
        k = rotate_half_split(k.reshape(s, self.kv_heads, self.head_dim), cos, sin)
        v = v.reshape(s, self.kv_heads, self.head_dim)
        k_cache = k_cache.index_copy(0, view.rows, k)
        v_cache = v_cache.index_copy(0, view.rows, v)
        keys, values = view.gather(k_cache), view.gather(v_cache)  # [L, Hkv, D], or [S, L, Hkv, D]
        t = "stkd" if view.per_query else "tkd"

        q = q.view(s, self.kv_heads, g, self.head_dim)  # query head h = kv_head·g + j
        scores = torch.einsum(f"skgd,{t}->skgt", q, keys) * self.scale  # [S, Hkv, G, L]
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        sinks = self.sinks.float().view(1, self.kv_heads, g, 1).expand(s, -1, -1, -1)
        probs = torch.softmax(torch.cat([scores, sinks], -1), dim=-1)[..., :-1]  # drop the sink
        o = torch.einsum(f"skgt,{t}->skgd", probs, values).reshape(s, self.heads * self.head_dim)
        return linear(o, self.o_proj), k_cache, v_cache
