"""Manifold-constrained hyper-connections (mHC): `hc_mult` residual streams instead of one.

Before a block (attention or MLP) the N streams [S, N, D] give, through one learned projection of
their RMS-normalized concatenation (fn [(2+N)·N, N·D], base, scale [3]), three weights per token:

    pre  = sigmoid(scale₀ · fn_pre · x̂ + base_pre) + eps          [S, N]     collapse the streams
    post = 2 · sigmoid(scale₁ · fn_post · x̂ + base_post)            [S, N]     expand the block output
    comb = Sinkhorn(softmax(scale₂ · fn_comb · x̂ + base_comb) + eps) [S, N, N]  mix the residuals

The block reads Σ_n pre_n · h_n; afterwards stream n becomes post_n · y + Σ_m comb_{m,n} · h_m.
Sinkhorn-Knopp: one column normalization, then (iters − 1) × (rows, columns), each dividing by
(sum + eps), exactly transformers' Glm5NextTextHyperConnection (float32). The final head is the
unweighted mean of the streams. The weights are three tensors per block, named by the caller.
"""

import torch
from torch import Tensor, nn


def hc_parameters(module: nn.Module, prefix: str, streams: int, hidden: int) -> None:
    """Register `{prefix}_fn`, `{prefix}_base`, `{prefix}_scale` on module (checkpoint names)."""
    width = (2 + streams) * streams
    setattr(module, f"{prefix}_fn", nn.Parameter(torch.empty(width, streams * hidden)))
    setattr(module, f"{prefix}_base", nn.Parameter(torch.empty(width)))
    setattr(module, f"{prefix}_scale", nn.Parameter(torch.empty(3)))


def hc_weights(
    h: Tensor, fn: Tensor, base: Tensor, scale: Tensor, iters: int, eps: float, norm_eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """h [S, N, D] f32 -> (post [S, N], comb [S, N, N], collapsed block input [S, D])."""
    s, n, _ = h.shape
    flat = h.reshape(s, -1)
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    mixed = flat @ fn.float().T  # [S, (2+N)·N]
    base, scale = base.float(), scale.float()
    pre = torch.sigmoid(mixed[:, :n] * scale[0] + base[:n]) + eps
    post = 2 * torch.sigmoid(mixed[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    comb = torch.softmax(mixed[:, 2 * n :].view(s, n, n) * scale[2] + base[2 * n :].view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return post, comb, (pre[..., None] * h).sum(1)


def hc_merge(post: Tensor, comb: Tensor, out: Tensor, residual: Tensor) -> Tensor:
    """Streams after a block: post [S, N] · out [S, D] + combᵀ [S, N, N] · residual [S, N, D]."""
    return post[..., None] * out[:, None, :] + torch.einsum("smn,smd->snd", comb, residual)
