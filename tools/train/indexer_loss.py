"""Training signal for the DSA lightning indexer, as DeepSeek-V3.2 defines it.

transformers' `DeepseekV32Indexer.forward` runs under `torch.no_grad()`: the language-model loss
never reaches the indexer, which only selects (top-k) which keys the main attention sees. The
model's reference trains it apart (DeepSeek-V3.2 report, "continued pre-training"): the indexer's
scores I[t, :] are fitted to the main attention's distribution over keys, summed over heads and
L1-normalised, p[t, :], by KL(p[t, :] || softmax(I[t, :])), with the indexer's inputs detached
so that this loss trains the indexer alone. In the dense warm-up every key is selected; in the
sparse stage p and the softmax cover the selected keys only.

`IndexerLoss` hooks every indexer of a transformers model, recomputes its scores with gradients
from the inputs the forward gave it (the same formula as the indexer's forward), and returns the
KL summed over layers, averaged over queries; the model must run with eager attention and
`output_attentions=True` so that the attention probabilities come back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _scores(idx, hidden, q_resid, cos, sin, mask):
    """The indexer's I [B, S, T] for detached inputs, with gradients into its own weights."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    b, s, _ = hidden.shape
    q = idx.wq_b(q_resid).view(b, s, idx.n_heads, idx.head_dim)
    q_rot, q_pass = torch.split(q, [idx.qk_rope_head_dim, idx.head_dim - idx.qk_rope_head_dim], dim=-1)
    k = idx.k_norm(idx.wk(hidden)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [idx.qk_rope_head_dim, idx.head_dim - idx.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * idx.softmax_scale)
    weights = idx.weights_proj(hidden).float() * (idx.n_heads**-0.5)
    index = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    if mask.dtype == torch.bool:
        return index.masked_fill(~mask, float("-inf"))
    return index + mask


class IndexerLoss:
    """Hooks `model`'s DSA indexers (module docstring); `loss(attentions)` after each forward."""

    def __init__(self, model):
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer

        self.indexers = [m for m in model.modules() if isinstance(m, DeepseekV32Indexer)]
        self._inputs: list[tuple | None] = [None] * len(self.indexers)
        self._hooks = [
            m.register_forward_pre_hook(self._capture(i), with_kwargs=True) for i, m in enumerate(self.indexers)
        ]

    def _capture(self, i):
        def hook(module, args, kwargs):
            names = ("hidden_states", "q_resid", "position_embeddings", "attention_mask")
            values = list(args) + [kwargs[n] for n in names[len(args) :]]
            hidden, q_resid, (cos, sin), mask = values[:4]
            self._inputs[i] = (hidden.detach(), q_resid.detach(), cos.detach(), sin.detach(), mask)

        return hook

    def loss(self, attentions) -> torch.Tensor:
        """Σ over layers of the mean over queries of KL(p || softmax(I)), over the keys the main
        attention saw (`attentions[l]`: [B, heads, S, T] probabilities, zero where not selected)."""
        total = 0.0
        for idx, inputs, probs in zip(self.indexers, self._inputs, attentions):
            hidden, q_resid, cos, sin, mask = inputs
            index = _scores(idx, hidden, q_resid, cos, sin, mask)  # [B, S, T], -inf where masked
            p = probs.detach().float().sum(1)
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
            seen = p > 0
            log_q = torch.log_softmax(index.masked_fill(~seen, float("-inf")), dim=-1)
            kl = torch.where(seen, p * (torch.log(p.clamp_min(1e-12)) - log_q), torch.zeros_like(p)).sum(-1)
            total = total + kl.mean()
        self._inputs = [None] * len(self.indexers)
        return total

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
