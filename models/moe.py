"""Mixture of experts with shared experts and DeepSeek's group-limited sigmoid routing.

Routed experts live in the checkpoint one tensor per expert (`experts.{e}.gate_proj.weight`, as
transformers' save_pretrained writes them); the graph stacks them into [E, out, in] once, which
IREE hoists into an initializer, and indexes the stack by the router's choice.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.models.layers import MLP, linear


def one_hot_sum(indices: Tensor, n: int, values: Tensor | None = None) -> Tensor:
    """out[s, j] = Σ_k values[s, k]·[indices[s, k] == j] (values default 1): a dense row per
    token built by comparison rather than scatter, which IREE fuses into one elementwise op."""
    hits = (indices[..., None] == torch.arange(n, dtype=indices.dtype)).float()  # [S, k, n]
    return hits.sum(1) if values is None else (hits * values[..., None]).sum(1)


class Router(nn.Module):
    """sigmoid scores; choose top `topk_group` groups by the sum of their two best biased scores,
    then the top-k experts inside them; weights = unbiased scores, normalized, × scaling."""

    def __init__(self, cfg):
        super().__init__()
        self.experts, self.top_k = cfg.n_routed_experts, cfg.num_experts_per_tok
        self.groups, self.topk_group = cfg.n_group, cfg.topk_group
        self.norm_topk_prob, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(self.experts, cfg.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.empty(self.experts), requires_grad=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [S, hidden] -> (weights [S, k] f32, experts [S, k] int64)."""
        scores = F.linear(x, self.weight.float()).sigmoid()  # [S, E]
        biased = scores + self.e_score_correction_bias.float()
        per_group = biased.view(-1, self.groups, self.experts // self.groups)
        group_scores = per_group.topk(2, dim=-1).values.sum(-1)  # [S, G]
        chosen_groups = group_scores.topk(self.topk_group, dim=-1).indices
        group_mask = one_hot_sum(chosen_groups, self.groups)  # [S, G] 1.0 at chosen groups
        expert_mask = group_mask.repeat_interleave(self.experts // self.groups, dim=1)
        experts = biased.masked_fill(expert_mask == 0, float("-inf")).topk(self.top_k, dim=-1).indices
        weights = scores.gather(1, experts)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * self.scaling, experts


class Experts(nn.ModuleList):
    """The routed experts, each an MLP named `{e}.gate_proj` … as in the checkpoint."""

    def stacked(self) -> tuple[Tensor, Tensor, Tensor]:
        """gate, up [E, I, H] and down [E, H, I] as float32 stacks."""
        return tuple(torch.stack([getattr(e, n).weight for e in self]).float()
                     for n in ("gate_proj", "up_proj", "down_proj"))


class MoE(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate = Router(cfg)
        self.experts = Experts(MLP(cfg.hidden_size, cfg.moe_intermediate_size)
                               for _ in range(cfg.n_routed_experts))
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)

    def forward(self, x: Tensor) -> Tensor:
        """x [S, hidden]. One token gathers only its k experts' weights; several tokens run every
        expert densely and mix with a sparse [S, E] weight matrix (no per-token weight copies)."""
        weights, chosen = self.gate(x)
        gate, up, down = self.experts.stacked()
        if x.shape[0] == 1:
            idx = chosen[0]  # [k]
            g = torch.einsum("h,kih->ki", x[0], gate.index_select(0, idx))
            u = torch.einsum("h,kih->ki", x[0], up.index_select(0, idx))
            y = torch.einsum("ki,khi->kh", F.silu(g) * u, down.index_select(0, idx))
            routed = (weights[0, :, None] * y).sum(0, keepdim=True)
        else:
            mix = one_hot_sum(chosen, gate.shape[0], weights)  # [S, E]
            h = F.silu(torch.einsum("sh,eih->sei", x, gate)) * torch.einsum("sh,eih->sei", x, up)
            routed = torch.einsum("sei,ehi,se->sh", h, down, mix)
        return routed + self.shared_experts(x)
