"""Multi-head latent attention (MLA) in absorbed form: `SparseMLA`, made sparse by the DSA indexer
(deepseek_v32), and `NopeMLA`, dense and without rotary embeddings (kimi_linear).

The cache holds one row per position: [latent (kv_lora_rank) | rotated k_rope (rope_dim)].
Queries are absorbed into the latent space, so attention is MQA over that single cached head:

    q_lat_{t,h} = W_uk[h]ᵀ · q_nope_{t,h}          score = q_lat·latent + q_rope·k_rope
    o_{t,h}     = W_uv[h] · Σ_s p_{t,h,s} latent_s  (p = softmax over the indexer's selection)

which equals transformers' expanded form up to float reassociation.
"""

import torch
from torch import Tensor, nn

import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.models.dsa_indexer import Indexer
from day0.models.layers import RMSNorm, linear, linears, one_token, rope_columns, rope_gather, yarn_mscale
from day0.models.paging import CacheView


class SparseMLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.nope, self.rope, self.v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        hidden, bias = cfg.hidden_size, cfg.attention_bias
        self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=bias)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, 1e-6)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.heads * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.rank + self.rope, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, 1e-6)
        self.kv_b_proj = nn.Linear(self.rank, self.heads * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v, hidden, bias=bias)
        self.indexer = Indexer(
            hidden, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim, cfg.index_topk
        )
        self.scale = attention_scale(cfg)

    def forward(
        self,
        x: Tensor,
        view: CacheView,
        cos: Tensor,
        sin: Tensor,
        kv_cache: Tensor,
        index_cache: Tensor,
        k: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x [S, hidden]; caches [T, rank+rope], [T, d_I] addressed through `view` (dense, or a
        paged pool: models/paging.py); k: the indexer's static selection width.

        Returns (out [S, hidden], kv_cache, index_cache) with the new rows written.
        """
        s = x.shape[0]
        # three projections of x in one matmul (layers.linears); kv_a_proj_with_mqa on its own:
        # with its columns sliced out of the fused result, IREE 3.13's CUDA code for cache_row
        # (RMSNorm + rope over that slice, one dispatch) is wrong from row 1 on at the default
        # model's shapes (docs/perf.md, "The default model")
        q_a, index_key, index_weights = linears(
            x,
            self.q_a_proj,
            self.indexer.wk,
            self.indexer.weights_proj,
            scales=(1.0, 1.0, self.indexer.weight_scale),
        )
        compressed = linear(x, self.kv_a_proj_with_mqa)
        q_resid = self.q_a_layernorm(q_a)
        # one row (a decode step): the two projections of q_resid in one matvec as well, the
        # queries' and the indexer's (a launch fewer a layer). Not for several rows: the day0
        # linear kernel's [S, N] result would be split by column copies (docs/perf.md, launches)
        if one_token(s):
            q, index_q = linears(q_resid, self.q_b_proj, self.indexer.wq_b)
        else:
            q, index_q = linear(q_resid, self.q_b_proj), linear(q_resid, self.indexer.wq_b)
        q = q.view(s, self.heads, self.nope + self.rope)

        row = cache_row(compressed, self.kv_a_layernorm, rope_columns(compressed, cos, sin, self.rank, self.rope, True))
        # caches may be bf16 (CausalLM.cache_dtype): rows are rounded once, when written
        kv_cache = kv_cache.index_copy(0, view.rows, row.to(kv_cache.dtype))
        index_cache = index_cache.index_copy(0, view.rows, self.indexer.keys(index_key, cos, sin).to(index_cache.dtype))

        # slots of the key range, then the cache rows holding them
        slots = self.indexer.select(index_weights, index_q, cos, sin, index_cache, view, k)
        selected = view.physical(slots)

        w_kv = self.kv_b_proj.weight.float().view(self.heads, self.nope + self.v, self.rank)
        query = self._query(absorb_uk(q[..., : self.nope], w_kv[:, : self.nope]), q, cos, sin)
        # a bf16 cache takes a bf16 query (the tensor-core kernels' form; math in f32 inside);
        # the result is f32 whatever the cache dtype
        o_latent = torch.ops.day0.dsa_attention(query.to(kv_cache.dtype), kv_cache, selected, self.scale, self.rank)
        o = apply_uv(o_latent, w_kv[:, self.nope :])
        return linear(o.reshape(s, self.heads * self.v), self.o_proj), kv_cache, index_cache

    def _query(self, q_latent: Tensor, q: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """[q_latent | rope(q_rope)] [S, H, rank + rope] from q_latent [S, H, rank] and q [S, H,
        nope + rope], bit for bit the torch.cat of the two, as one elementwise expression (the
        rope columns read from q through layers.rope_gather): with the cast to the cache dtype
        one dispatch, where the rope, the cat and the cast were two (docs/perf.md, launches)."""
        c = torch.arange(self.rank + self.rope)
        latent = q_latent.index_select(-1, c.clamp(max=self.rank - 1))
        rotated = rope_gather(q, cos, sin, self.nope, self.rope, True, (c - self.rank).clamp(min=0) + self.nope)
        return torch.where(c < self.rank, latent, rotated)


def cache_row(compressed: Tensor, norm: RMSNorm, rotated: Tensor) -> Tensor:
    """The cache row [norm(latent) | the rest] of compressed [S, rank + r] (rank = norm's width):
    the latent columns normalized (RMSNorm's arithmetic, in its order), the others taken from
    `rotated` (compressed with its rope columns rotated: layers.rope_columns; or compressed
    itself). One elementwise expression beside the norm's reduction: a torch.cat of the two
    parts costs copies and dispatches of their own in every decode step."""
    rank = norm.weight.shape[0]
    latent = compressed[:, :rank]
    inv = torch.rsqrt(latent.pow(2).mean(-1, keepdim=True) + norm.eps)
    weight = torch.nn.functional.pad(norm.weight.float(), (0, compressed.shape[-1] - rank), value=1.0)
    return torch.where(torch.arange(compressed.shape[-1]) < rank, weight * (rotated * inv), rotated)


def absorb_uk(q_nope: Tensor, w_uk: Tensor) -> Tensor:
    """q_lat[s, h] = W_uk[h]ᵀ q_nope[s, h]: q_nope [S, H, n], w_uk [H, n, r] -> [S, H, r].

    A batched matmul with the head as its batch dim (bmm over [H, S, n]) rather than the einsum
    "shn,hnr->shr". IREE folds the transposes back into one generic contraction either way; on
    cuda-sm90 matmul-to-bf16-terms turns it into bf16 tensor-core products (docs/perf.md, e2e)."""
    return torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)


def apply_uv(o_latent: Tensor, w_uv: Tensor) -> Tensor:
    """o[s, h] = W_uv[h] o_lat[s, h]: o_latent [S, H, r], w_uv [H, v, r] -> [S, H, v] (a bmm, as
    absorb_uk)."""
    return torch.bmm(o_latent.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)


def attention_scale(cfg) -> float:
    """qk_head_dim^-½, times mscale² under yarn rope with mscale_all_dim (as DeepSeek-V3 does)."""
    scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
    rope = cfg.rope_parameters or {}
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        m = yarn_mscale(rope["factor"], rope["mscale_all_dim"])
        scale *= m * m
    return scale


class NopeMLA(nn.Module):
    """Dense MLA without rotary embeddings (kimi_linear's full-attention layers), absorbed form.

    Kimi-Linear keeps the shared `qk_rope_head_dim` part of the key but never rotates it, so the
    cache row is [latent (kv_lora_rank) | k_shared (qk_rope_head_dim)] and a score is
    q_lat·latent + q_shared·k_shared with q_lat = W_uk[h]ᵀ q_nope, as in SparseMLA minus the rope
    and the indexer: every visible row takes part. Checkpoint names: q_proj (q_lora_rank None) or
    q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
    """

    def __init__(self, cfg, norm_eps: float = 1e-6):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.nope, self.shared, self.v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.rank = cfg.kv_lora_rank
        hidden, bias, q_dim = cfg.hidden_size, cfg.attention_bias, self.heads * (self.nope + self.shared)
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, q_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(hidden, cfg.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, norm_eps)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, q_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.rank + self.shared, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.rank, norm_eps)
        self.kv_b_proj = nn.Linear(self.rank, self.heads * (self.nope + self.v), bias=False)
        self.o_proj = nn.Linear(self.heads * self.v, hidden, bias=bias)
        self.scale = (self.nope + self.shared) ** -0.5

    def forward(self, x: Tensor, view: CacheView, kv_cache: Tensor) -> tuple[Tensor, Tensor]:
        """x [S, hidden]; kv_cache [T, rank + shared] addressed through `view` (dense, or a paged
        pool: models/paging.py). Returns (out [S, hidden], kv_cache) with the new rows written."""
        q_in, compressed = self.project(x)
        _, query = self.queries(q_in)
        kv_cache = self.write_cache(compressed, view.rows, kv_cache)
        keys = view.gather(kv_cache)  # [L, rank + shared], or [S, L, rank + shared] per query
        each = "s" if view.per_query else ""
        scores = torch.einsum(f"shd,{each}ld->shl", query, keys) * self.scale
        probs = torch.softmax(scores.masked_fill(~view.visible[:, None, :], float("-inf")), dim=-1)
        return self.output(torch.einsum(f"shl,{each}lr->shr", probs, keys[..., : self.rank])), kv_cache

    def projections(self) -> tuple[nn.Module, nn.Module]:
        """The projections of x: (q_a_proj, or q_proj without a q LoRA; kv_a_proj_with_mqa). A
        caller with more projections of the same x passes them to layers.linears together."""
        return (self.q_proj if hasattr(self, "q_proj") else self.q_a_proj), self.kv_a_proj_with_mqa

    def project(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """`projections` of x [S, hidden] in one matmul (layers.linears): the inputs of `queries`
        and `write_cache`."""
        return linears(x, *self.projections())

    def queries(self, q_in: Tensor) -> tuple[Tensor | None, Tensor]:
        """(q_resid [S, q_lora_rank] or None without a q LoRA, absorbed queries [S, H, rank + shared])
        from `project`'s first output."""
        s = q_in.shape[0]
        q_resid = None
        if hasattr(self, "q_proj"):
            q = q_in
        else:
            q_resid = self.q_a_layernorm(q_in)
            q = linear(q_resid, self.q_b_proj)
        q = q.view(s, self.heads, self.nope + self.shared)
        q_latent = absorb_uk(q[..., : self.nope], self._w_kv()[:, : self.nope])
        return q_resid, torch.cat([q_latent, q[..., self.nope :]], -1)

    def write_cache(self, compressed: Tensor, rows: Tensor, kv_cache: Tensor) -> Tensor:
        """kv_cache with the rows [latent | k_shared] of the new tokens written at cache `rows`
        [S], from their kv_a_proj_with_mqa projection `compressed` (`project`'s second output)."""
        return kv_cache.index_copy(0, rows, cache_row(compressed, self.kv_a_layernorm, compressed))

    def output(self, o_latent: Tensor) -> Tensor:
        """Attention output in the latent space [S, H, rank] -> [S, hidden] (W_uv, then o_proj)."""
        o = apply_uv(o_latent, self._w_kv()[:, self.nope :])
        return linear(o.reshape(o.shape[0], self.heads * self.v), self.o_proj)

    def _w_kv(self) -> Tensor:
        return self.kv_b_proj.weight.float().view(self.heads, self.nope + self.v, self.rank)
