"""Kimi Delta Attention (KDA): the gated delta rule with a per-channel decay (MODELS.md), in the
two forms the model needs, each on one sequence (no batch dim), float32 throughout:

    kda_recurrent  token by token (decode, and the reference)
    kda_chunked    chunks of `chunk` tokens (prefill): within a chunk the WY form (cumulative
                   decay, a unit-lower-triangular solve by forward substitution), across chunks
                   one state update each. The chunk loop is a `torch.while_loop` while exporting
                   (dynamic chunk count; every tensor it reads is loop-carried, because torch-mlir
                   imports closure-captured tensors wrongly) and a Python loop in eager mode.
                   Exported lengths must be whole chunks (T = chunk·n): padding a free length
                   inside the graph makes guards torch.export cannot prove, so callers pad.

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

from day0.models.layers import linear


def kda_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    q = q * q.shape[-1] ** -0.5
    outs = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[..., None]  # [H, K, V]
        delta = (v[t] - torch.einsum("hkv,hk->hv", state, k[t])) * beta[t][:, None]  # [H, V]
        state = state + k[t][..., None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, q[t]))
    return torch.stack(outs), state


def _chunk_step(q_c: Tensor, k_c: Tensor, g_c: Tensor, u_c: Tensor, w_c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk against the running state. All [H, C, ·] (g cumulative within the chunk):
    u = T·(β v) and w = T·(β k ⊙ exp g) are the WY-form values and keys."""
    c = q_c.shape[1]
    causal = torch.ones(c, c, dtype=torch.bool, device=q_c.device).tril()
    decay = (g_c[:, :, None, :] - g_c[:, None, :, :]).masked_fill(~causal[None, :, :, None], float("-inf")).exp()
    attn = torch.einsum("hik,hjk,hijk->hij", q_c, k_c, decay)  # [H, C, C], i >= j
    v_new = u_c - torch.einsum("hck,hkv->hcv", w_c, state)
    out = torch.einsum("hck,hkv->hcv", q_c * g_c.exp(), state) + torch.einsum("hij,hjv->hiv", attn, v_new)
    last = g_c[:, -1:, :]  # [H, 1, K]
    state = state * last.transpose(1, 2).exp() + torch.einsum("hck,hcv->hkv", k_c * (last - g_c).exp(), v_new)
    return out, state


def kda_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                chunk: int = 64) -> tuple[Tensor, Tensor]:
    T, H, K = k.shape
    pad = (T + chunk - 1) // chunk * chunk - T  # (not (-T) % chunk: torch.export cannot bound that)
    q = q * K**-0.5
    def chunks(x: Tensor) -> Tensor:
        """[T, H, ...] -> [H, N, C, ...], zero-padded to N·C tokens (a padded token has
        k = v = g = β = 0, so it changes nothing)."""
        x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, 0, 0, pad))
        x = x.reshape(-1, chunk, *x.shape[1:])  # [N, C, H, ...]
        return x.permute(2, 0, 1, *range(3, x.dim()))

    qc, kc, vc, gc = (chunks(x) for x in (q, k, v, g))  # [H, N, C, ·]
    bc = chunks(beta)  # [H, N, C]
    gc = gc.cumsum(dim=2)
    # WY form within each chunk: A[i, j] = -β_i k_i·(k_j ⊙ exp(g_i - g_j)) for j < i; T = (I - A)^-1
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    decay = (gc[:, :, :, None, :] - gc[:, :, None, :, :]).masked_fill(~strict[None, None, :, :, None], float("-inf")).exp()
    a = -torch.einsum("hnik,hnjk,hnijk->hnij", kc * bc[..., None], kc, decay)  # strictly lower
    rows = [a[:, :, 0, :]]
    for i in range(1, chunk):  # forward substitution: row i of (I - A)^-1 - I from the rows above
        prev = torch.stack(rows, dim=2)  # [H, N, i, C]
        rows.append(a[:, :, i, :] + torch.einsum("hnj,hnjc->hnc", a[:, :, i, :i], prev))
    tmat = torch.stack(rows, dim=2) + torch.eye(chunk, device=q.device)
    u = torch.einsum("hnij,hnjv->hniv", tmat, vc * bc[..., None])
    w = torch.einsum("hnij,hnjk->hnik", tmat, kc * bc[..., None] * gc.exp())

    n = qc.shape[1]
    if torch.compiler.is_exporting():
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i, st, out, qx, *xs):
            return i < qx.shape[1]  # (not the outer n: a captured size is imported wrongly too)

        def body(i, st, out, qx, kx, gx, ux, wx):
            pick = lambda x: x.index_select(1, i.reshape(1)).squeeze(1)  # noqa: E731
            o, st = _chunk_step(pick(qx), pick(kx), pick(gx), pick(ux), pick(wx), st)
            out = out.index_copy(1, i.reshape(1), o.unsqueeze(1))
            return i + 1, st, out, qx.clone(), kx.clone(), gx.clone(), ux.clone(), wx.clone()

        out0 = torch.zeros(H, n, chunk, v.shape[-1], dtype=v.dtype, device=v.device)
        _, state, out, *_ = while_loop(cond, body, (torch.zeros((), dtype=torch.int64), state, out0, qc, kc, gc, u, w))
    else:
        outs = []
        for i in range(n):
            o, state = _chunk_step(qc[:, i], kc[:, i], gc[:, i], u[:, i], w[:, i], state)
            outs.append(o)
        out = torch.stack(outs, dim=1)
    out = out.reshape(H, n * chunk, -1)[:, :T].transpose(0, 1)  # [T, H, V]
    return out, state


# ---------------------------------------------------------------------------------------------
# the layer


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(Σx² + eps) over the last dim (FLA's form, which transformers matches)."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


class ForgetGate(nn.Module):
    """g = -exp(A_log) · softplus(f_b(f_a(x)) + dt_bias), per head and channel (log decay <= 0).
    Checkpoint names: f_a_proj, f_b_proj, dt_bias, A_log."""

    def __init__(self, hidden: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.f_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, heads * head_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(heads * head_dim))
        self.A_log = nn.Parameter(torch.empty(1, 1, heads, 1))

    def forward(self, x: Tensor) -> Tensor:
        """x [S, hidden] -> g [S, H, K]."""
        g = (linear(linear(x, self.f_a_proj), self.f_b_proj) + self.dt_bias.float()).view(-1, self.heads, self.head_dim)
        softplus = torch.where(g > 20.0, g, torch.log(1.0 + torch.exp(g)))
        return -self.A_log.float().view(self.heads, 1).exp() * softplus


class KdaAttention(nn.Module):
    """One KDA layer on a single sequence: short causal conv (+ SiLU) over q‖k‖v, L2-normalized
    q and k, forget gate g, β = sigmoid(b_proj x), the delta rule, then
    o_proj(RMSNorm(o) ⊙ sigmoid(g_b(g_a(x)))). Checkpoint names as transformers' layer.

    State per layer: conv tail [3·H·K, kernel-1] (the last inputs of the conv) and the recurrent
    state [H, K, V] (V = K here). `forward(x, conv, rec, chunked)` returns (out, conv, rec)."""

    def __init__(self, hidden: int, heads: int, head_dim: int, conv_kernel: int, eps: float, chunk: int = 64):
        super().__init__()
        self.heads, self.head_dim, self.kernel, self.chunk = heads, head_dim, conv_kernel, chunk
        dim = heads * head_dim
        self.q_proj = nn.Linear(hidden, dim, bias=False)
        self.k_proj = nn.Linear(hidden, dim, bias=False)
        self.v_proj = nn.Linear(hidden, dim, bias=False)
        self.conv1d = nn.Conv1d(3 * dim, 3 * dim, conv_kernel, groups=3 * dim, bias=False)
        self.forget_gate = ForgetGate(hidden, heads, head_dim)
        self.b_proj = nn.Linear(hidden, heads, bias=False)
        self.g_a_proj = nn.Linear(hidden, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, dim, bias=False)
        self.o_norm = nn.Module()
        self.o_norm.weight = nn.Parameter(torch.empty(head_dim))
        self.o_norm_eps = eps
        self.o_proj = nn.Linear(dim, hidden, bias=False)

    def state_shapes(self) -> tuple[tuple[int, int], tuple[int, int, int]]:
        dim = self.heads * self.head_dim
        return (3 * dim, self.kernel - 1), (self.heads, self.head_dim, self.head_dim)

    def forward(self, x: Tensor, conv: Tensor, rec: Tensor, chunked: bool) -> tuple[Tensor, Tensor, Tensor]:
        """x [S, hidden] f32; conv [3·H·K, kernel-1]; rec [H, K, K]."""
        s, h, d = x.shape[0], self.heads, self.head_dim
        mixed = torch.cat([linear(x, self.q_proj), linear(x, self.k_proj), linear(x, self.v_proj)], -1).T  # [C, S]
        window = torch.cat([conv, mixed], dim=1)  # [C, kernel-1+S]
        out = F.conv1d(window[None], self.conv1d.weight.float(), groups=window.shape[0])[0]  # [C, S]
        conv = window[:, -(self.kernel - 1):]
        q, k, v = F.silu(out).T.split(h * d, dim=-1)
        q, k, v = (t.reshape(s, h, d) for t in (q, k, v))
        g = self.forget_gate(x)
        beta = torch.sigmoid(linear(x, self.b_proj))
        kda = kda_chunked if chunked else kda_recurrent
        o, rec = kda(l2norm(q), l2norm(k), v, g, beta, rec, **({"chunk": self.chunk} if chunked else {}))
        gate = linear(linear(x, self.g_a_proj), self.g_b_proj).view(s, h, d)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.o_norm_eps) * self.o_norm.weight.float()
        o = o * torch.sigmoid(gate)
        return linear(o.reshape(s, h * d), self.o_proj), conv, rec
