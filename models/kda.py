"""Kimi Delta Attention (KDA): the gated delta rule with a per-channel decay (as transformers'
KimiLinear defines it), in the two forms the model needs, each on one sequence (no batch dim),
float32 throughout:

    kda_recurrent  token by token (decode, and the reference)
    kda_chunked    chunks of `chunk` tokens (prefill): within a chunk the WY form (cumulative
                   decay, a unit-lower-triangular solve by forward substitution), across chunks
                   one state update each. Any length T: the inputs get one whole chunk of zeros
                   appended (a static amount, so torch.export makes no guard on T) and the loop
                   runs ceil(T / chunk) chunks; a zero token (k = v = q = g = β = 0) leaves the
                   state unchanged and its output is dropped. The loop is a `torch.while_loop`
                   while exporting (dynamic chunk count, an int loop variable; every tensor it
                   reads is loop-carried, because torch-mlir imports closure-captured tensors
                   wrongly; chunks are read and written as slices) and a Python loop
                   in eager mode. (Padding to a multiple of the chunk and reshaping to
                   [chunks, chunk] instead makes floor-division guards torch.export cannot prove.)

Per head h, state S [K, V]; for each token t (q already L2-normalized, scaled by K^-1/2 inside):
    S ← Diag(exp g_t) · S
    S ← S + β_t · k_t (v_t − Sᵀ k_t)ᵀ
    o_t = Sᵀ q_t
Shapes: q, k, g [T, H, K]; v [T, H, V]; beta [T, H]; state [H, K, V] -> (o [T, H, V], state).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.models.config import require
from day0.models.layers import linear, linears

CHUNK = 64  # transformers' chunk_kimi_delta_attention default; the result does not depend on it


def require_kda_sizes(cfg, heads_field: str, conv_field: str) -> None:
    """A KDA layer's sizes as transformers' configs hold them (heads and head size positive, a
    causal conv of at least 2 taps); the fields are named as the checkpoint's config.json does."""
    positive = cfg.linear_num_heads > 0 and cfg.linear_head_dim > 0
    require(positive, heads_field, "the number of heads and the head dim must be positive")
    kernel = cfg.linear_conv_kernel_dim
    require(kernel >= 2, conv_field, f"must be at least 2 (got {kernel})")


def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    outs = []
    for t in range(q.shape[0]):
        o, state = kda_token(q[t], k[t], v[t], g[t], beta[t], state)
        outs.append(o)
    return torch.stack(outs), state


def kda_token(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the delta rule: q, k, g [..., H, K]; v [..., H, V]; beta [..., H]; state
    [..., H, K, V] -> (o [..., H, V], state). Leading dims are independent sequences (a batched
    decode step gives each row its own state)."""
    state = state * g.exp()[..., None]
    delta = (v - torch.einsum("...hkv,...hk->...hv", state, k)) * beta[..., None]
    state = state + k[..., None] * delta[..., None, :]
    return torch.einsum("...hkv,...hk->...hv", state, q * q.shape[-1] ** -0.5), state


def unit_lower_inverse(a: Tensor, block: int = 16) -> Tensor:
    """(I - A)^-1 for A [H, C, C] strictly lower triangular, by blocks of `block` rows (FLA's
    scheme): forward substitution inside the diagonal blocks, all blocks at once (block - 1 steps),
    then one block row at a time, T_rc = T_rr · Σ_{c<=m<r} A_rm T_mc (C/block - 1 steps).

    Forward substitution keeps every intermediate bounded by the result (a Neumann-series product
    would not: with correlated keys its terms grow like binomials and cancel). Unrolling C - 1
    steps made IREE's compile time grow steeply with C (65 s at C = 64 against 4 s at 16); the
    blocked form unrolls block - 1 + C/block - 1."""
    h, c, _ = a.shape
    b = block if c % block == 0 else c
    n = c // b
    diag = torch.stack([a[:, i * b : (i + 1) * b, i * b : (i + 1) * b] for i in range(n)], dim=1)  # [H, n, b, b]
    rows = [diag[:, :, 0, :]]
    for i in range(1, b):  # row i of (I - D)^-1 - I from the rows above, in every diagonal block
        prev = torch.stack(rows, dim=2)  # [H, n, i, b]
        rows.append(diag[:, :, i, :] + torch.einsum("hnj,hnjc->hnc", diag[:, :, i, :i], prev))
    inv = torch.stack(rows, dim=2) + torch.eye(b, device=a.device)  # [H, n, b, b]
    t = inv[:, 0]  # the inverse of the top-left r·b × r·b corner, grown one block row at a time
    for r in range(1, n):
        left = inv[:, r] @ (a[:, r * b : (r + 1) * b, : r * b] @ t)  # [H, b, r·b]
        t = torch.cat([torch.cat([t, t.new_zeros(h, r * b, b)], dim=2), torch.cat([left, inv[:, r]], dim=2)], dim=1)
    return t


def _chunk(q_c: Tensor, k_c: Tensor, v_c: Tensor, g_c: Tensor, b_c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk against the running state: q, k, g [H, C, K] (g per token, not yet cumulative),
    v [H, C, V], β [H, C]. Returns (out [H, C, V], state).

    WY form: A[i, j] = -β_i k_i·(k_j ⊙ exp(G_i - G_j)) for j < i (G the cumulative g),
    T = (I - A)^-1; u = T·(β v) and w = T·(β k ⊙ exp G) are the chunk's values and keys."""
    c = q_c.shape[1]
    g_c = g_c.cumsum(dim=1)
    strict = torch.ones(c, c, dtype=torch.bool, device=q_c.device).tril(-1)
    causal = torch.ones(c, c, dtype=torch.bool, device=q_c.device).tril()
    diff = g_c[:, :, None, :] - g_c[:, None, :, :]  # [H, C, C, K]: G_i - G_j
    kb = k_c * b_c[..., None]
    a = -torch.einsum("hik,hjk,hijk->hij", kb, k_c, diff.masked_fill(~strict[None, :, :, None], float("-inf")).exp())
    tmat = unit_lower_inverse(a)
    u = torch.einsum("hij,hjv->hiv", tmat, v_c * b_c[..., None])
    w = torch.einsum("hij,hjk->hik", tmat, kb * g_c.exp())

    attn = torch.einsum("hik,hjk,hijk->hij", q_c, k_c, diff.masked_fill(~causal[None, :, :, None], float("-inf")).exp())
    v_new = u - torch.einsum("hck,hkv->hcv", w, state)
    out = torch.einsum("hck,hkv->hcv", q_c * g_c.exp(), state) + torch.einsum("hij,hjv->hiv", attn, v_new)
    last = g_c[:, -1:, :]  # [H, 1, K]
    state = state * last.transpose(1, 2).exp() + torch.einsum("hck,hcv->hkv", k_c * (last - g_c).exp(), v_new)
    return out, state


def kda_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, chunk: int = CHUNK
) -> tuple[Tensor, Tensor]:
    T, H, K = k.shape
    q = q * K**-0.5

    def padded(x: Tensor) -> Tensor:
        """[T, H, ...] -> [H, T + chunk, ...]: one chunk of zero tokens appended, so that every
        chunk the loop reads, the last partial one included, lies inside the tensor."""
        return torch.cat([x, x.new_zeros((chunk,) + x.shape[1:])]).transpose(0, 1)

    xs = tuple(padded(x) for x in (q, k, v, g, beta))
    if torch.compiler.is_exporting():
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i, st, out, qx, *rest):  # (T from a carried shape: captured sizes import wrongly too)
            return torch.scalar_tensor(i * chunk, dtype=torch.int64) < qx.shape[1] - chunk

        def body(i, st, out, *xs):
            # i is a loop-carried int: each chunk is a slice at a dynamic offset and its output a
            # slice_scatter (extract_slice / insert_slice), not a gather and a scatter
            start = i * chunk
            torch._check(start >= 0)
            for x in (out, *xs):  # (each carried tensor has its own length symbol)
                torch._check(start <= x.shape[1] - chunk)
                torch._check(start <= x.shape[1])
            o, st = _chunk(*(x.narrow(1, start, chunk).reshape((H, chunk) + x.shape[2:]) for x in xs), st)
            return i + 1, st, out.slice_scatter(o, 1, start, start + chunk), *(x.clone() for x in xs)

        out0 = torch.zeros(H, T + chunk, v.shape[-1], dtype=v.dtype, device=v.device)
        _, state, out, *_ = while_loop(cond, body, (0, state, out0, *xs))
        out = out[:, :T]
    else:
        outs = []
        for i in range(0, T, chunk):
            o, state = _chunk(*(x[:, i : i + chunk] for x in xs), state)
            outs.append(o)
        out = torch.cat(outs, dim=1)[:, :T]
    return out.transpose(0, 1), state


# ---------------------------------------------------------------------------------------------
# the layer


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(Σx² + eps) over the last dim (FLA's form, which transformers matches)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


class KdaAttention(nn.Module):
    """One KDA layer on a single sequence: short causal conv (+ SiLU) over q‖k‖v, L2-normalized
    q and k, forget gate g = -exp(A_log) · softplus(f_b(f_a(x)) + dt_bias) (per head and channel,
    log decay <= 0), β = sigmoid(b_proj x), the delta rule, then
    o_proj(RMSNorm(o) ⊙ sigmoid(g_b(g_a(x)))).

    Checkpoint names as Kimi-Linear / GLM-5 checkpoints store them (and transformers' save_pretrained
    writes them): q/k/v_proj, q/k/v_conv1d [H·K, 1, kernel], f_a_proj, f_b_proj, dt_bias, A_log,
    b_proj, g_a_proj, g_b_proj, o_norm, o_proj. (transformers' module concatenates the three convs
    into `conv1d` and moves the gate under `forget_gate.` at load time: `transformers_state_dict`.)

    State per layer: conv tail [3·H·K, kernel-1] (the last inputs of the conv) and the recurrent
    state [H, K, V] (V = K here). `forward(x, conv, rec, chunked)` returns (out, conv, rec)."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        head_dim: int,
        conv_kernel: int,
        eps: float,
        chunk: int = CHUNK,
        a_log_shape: tuple[int, ...] | None = None,
        lower_bound: float | None = None,
    ):
        """a_log_shape: A_log's shape in the checkpoint (Kimi: [1, 1, H, 1]; GLM-5: [H]);
        lower_bound: GLM-5's "safe gate" g = lower_bound · sigmoid(exp(A_log) · g_raw) instead of
        the softplus form (None: softplus, Kimi)."""
        super().__init__()
        self.heads, self.head_dim, self.kernel, self.chunk = heads, head_dim, conv_kernel, chunk
        dim = heads * head_dim
        self.q_proj = nn.Linear(hidden, dim, bias=False)
        self.k_proj = nn.Linear(hidden, dim, bias=False)
        self.v_proj = nn.Linear(hidden, dim, bias=False)
        self.q_conv1d = nn.Conv1d(dim, dim, conv_kernel, groups=dim, bias=False)
        self.k_conv1d = nn.Conv1d(dim, dim, conv_kernel, groups=dim, bias=False)
        self.v_conv1d = nn.Conv1d(dim, dim, conv_kernel, groups=dim, bias=False)
        self.f_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(dim))
        self.A_log = nn.Parameter(torch.empty(a_log_shape or (1, 1, heads, 1)))
        self.lower_bound = lower_bound
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.o_norm = nn.Module()
        self.o_norm.weight = nn.Parameter(torch.empty(head_dim))
        self.o_norm_eps = eps
        self.o_proj = nn.Linear(dim, hidden, bias=False)

    @classmethod
    def from_config(cls, cfg, **options) -> KdaAttention:
        """The layer sized as transformers' KDA configs name it (linear_num_heads, linear_head_dim,
        linear_conv_kernel_dim, rms_norm_eps); `options` as for __init__."""
        heads, head_dim, kernel = cfg.linear_num_heads, cfg.linear_head_dim, cfg.linear_conv_kernel_dim
        return cls(cfg.hidden_size, heads, head_dim, kernel, cfg.rms_norm_eps, **options)

    def state_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        dim = self.heads * self.head_dim
        return (3 * dim, self.kernel - 1), (self.heads, self.head_dim, self.head_dim)

    def forget_gate(self, f_a: Tensor) -> Tensor:
        """f_a_proj(x) [S, r] -> g [S, H, K] (transformers' overflow-safe softplus)."""
        g = (linear(f_a, self.f_b_proj) + self.dt_bias.float()).view(-1, self.heads, self.head_dim)
        rate = self.A_log.float().view(self.heads, 1).exp()
        if self.lower_bound is not None:
            return self.lower_bound * torch.sigmoid(rate * g)
        softplus = torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))
        return -rate * softplus

    def forward(self, x: Tensor, conv: Tensor, rec: Tensor, chunked: bool) -> tuple[Tensor, Tensor, Tensor]:
        """x [S, hidden] f32; conv [3·H·K, kernel-1]; rec [H, K, K]: S tokens of one sequence.
        With conv [S, 3·H·K, kernel-1] and rec [S, H, K, K], row s of x is the one new token of
        sequence s (a batched decode step: each row has its own state)."""
        s, h, d = x.shape[0], self.heads, self.head_dim
        # every projection of x in one matmul (layers.linears); mixed = [q | k | v] [S, C]
        mixed, f_a, b, g_a = linears(
            x, (self.q_proj, self.k_proj, self.v_proj), self.f_a_proj, self.b_proj, self.g_a_proj
        )
        weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight]).float()
        if conv.dim() == 3:  # one token per sequence: the conv is a dot of each window with its taps
            window = torch.cat([conv, mixed[:, :, None]], dim=2)  # [S, C, kernel]
            out = (window * weight[:, 0]).sum(-1)  # [S, C]
            conv = window[:, :, 1:]
        else:
            window = torch.cat([conv, mixed.T], dim=1)  # [C, kernel-1+S]
            out = F.conv1d(window[None], weight, groups=window.shape[0])[0].T  # [S, C]
            conv = window[:, -(self.kernel - 1) :]
        q, k, v = F.silu(out).split(h * d, dim=-1)
        q, k, v = (t.reshape(s, h, d) for t in (q, k, v))
        g = self.forget_gate(f_a)
        beta = torch.sigmoid(b)
        if rec.dim() == 4:
            o, rec = kda_token(l2norm(q), l2norm(k), v, g, beta, rec)
        else:
            kda = kda_chunked if chunked else kda_recurrent
            o, rec = kda(l2norm(q), l2norm(k), v, g, beta, rec, **({"chunk": self.chunk} if chunked else {}))
        gate = linear(g_a, self.g_b_proj).view(s, h, d)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.o_norm_eps) * self.o_norm.weight.float()
        o = o * torch.sigmoid(gate)
        return linear(o.reshape(s, h * d), self.o_proj), conv, rec


def checkpoint_state_dict(transformers_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A KimiLinearDeltaAttention's in-memory state dict under the checkpoint names KdaAttention
    uses (the inverse of transformers' load-time conversion: split `conv1d`, lift `forget_gate.`)."""
    out = {}
    for name, t in transformers_state.items():
        if name == "conv1d.weight":
            for part, w in zip("qkv", t.chunk(3)):
                out[f"{part}_conv1d.weight"] = w
        else:
            out[name.removeprefix("forget_gate.")] = t
    return out
