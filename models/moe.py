"""Mixture of experts with shared experts and DeepSeek's group-limited sigmoid routing.

Routed experts live in the checkpoint one tensor per expert (`experts.{e}.gate_proj.weight`, as
transformers' save_pretrained writes them); the graph stacks them into [E, out, in] once, which
IREE hoists into an initializer, and indexes the stack by the router's choice.
"""

import re

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from day0.frontend import ops
from day0.frontend.ops import moe_route, one_hot_sum
from day0.models.layers import MLP, linears, one_token, swiglu


class Router(nn.Module):
    """sigmoid scores; choose top `topk_group` groups by the sum of their two best biased scores,
    then the top-k experts inside them; weights = unbiased scores, normalized, × scaling
    (frontend.ops.moe_route, one op after the linear)."""

    def __init__(self, cfg):
        super().__init__()
        self.experts, self.top_k = cfg.n_routed_experts, cfg.num_experts_per_tok
        self.groups, self.topk_group = cfg.n_group, cfg.topk_group
        self.norm_topk_prob, self.scaling = cfg.norm_topk_prob, cfg.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(self.experts, cfg.hidden_size))
        self.e_score_correction_bias = nn.Parameter(torch.empty(self.experts), requires_grad=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [S, hidden] -> (weights [S, k] f32, experts [S, k] int64)."""
        return self.route(F.linear(x, self.weight.float()))

    def route(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The router's logits [S, E] (x @ weightᵀ) -> (weights [S, k] f32, experts [S, k] int64)."""
        bias = self.e_score_correction_bias.float()
        normalize, scaling = bool(self.norm_topk_prob), float(self.scaling)
        return moe_route(logits, bias, self.groups, self.topk_group, self.top_k, normalize, scaling)


class Experts(nn.ModuleList):
    """The routed experts, each an MLP named `{e}.gate_proj` … as in the checkpoint."""

    def stacked(self) -> tuple[Tensor, Tensor, Tensor]:
        """gate, up [E, I, H] and down [E, H, I] as float32 stacks."""
        return tuple(
            torch.stack([getattr(e, n).weight for e in self]).float() for n in ("gate_proj", "up_proj", "down_proj")
        )


class Mxfp4Linear(nn.Module):
    """A bias-free linear stored in the compressed-tensors `mxfp4-pack-quantized` layout:
    weight_packed u8 [out, in/2] (low nibble = even column), weight_scale u8 [out, in/32]."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight_packed = nn.Parameter(torch.empty(n_out, n_in // 2, dtype=torch.uint8), requires_grad=False)
        self.weight_scale = nn.Parameter(torch.empty(n_out, n_in // 32, dtype=torch.uint8), requires_grad=False)


EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")  # (gate, up, down) as the checkpoint names them


class Mxfp4Expert(nn.Module):
    """One routed expert of three Mxfp4Linear; `names`: the checkpoint's (gate, up, down) module
    names (transformers' gate_proj/up_proj/down_proj; Moonshot's w1/w3/w2)."""

    def __init__(self, hidden: int, intermediate: int, names: tuple[str, str, str] = EXPERT_NAMES):
        super().__init__()
        gate, up, down = names
        self.add_module(gate, Mxfp4Linear(hidden, intermediate))
        self.add_module(up, Mxfp4Linear(hidden, intermediate))
        self.add_module(down, Mxfp4Linear(intermediate, hidden))


class Mxfp4Experts(nn.ModuleList):
    """Routed experts whose weights stay packed from the file to the matmul: the stacks below are
    u8 (hoisted once by IREE at packed size) and `day0::mxfp4_moe` unpacks inside the matmul.
    `names`: the experts' (gate, up, down) module names (a subclass overrides them)."""

    names: tuple[str, str, str] = EXPERT_NAMES

    def stacked(self, group: range | None = None) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(gate‖up packed [E, 2I, H/2], scales [E, 2I, H/32]), (down packed [E, H, I/2], scales)
        of the experts in `group` (None: all of them; E = len(group))."""
        g, u, d = self.names
        experts = list(self) if group is None else [self[i] for i in group]
        gate_up = tuple(
            torch.stack([torch.cat([getattr(getattr(e, g), n), getattr(getattr(e, u), n)]) for e in experts])
            for n in ("weight_packed", "weight_scale")
        )
        down = tuple(
            torch.stack([getattr(getattr(e, d), n) for e in experts]) for n in ("weight_packed", "weight_scale")
        )
        return gate_up, down


class MoE(nn.Module):
    """`swiglu_limit`: clamp the gate/up activations of every expert, shared ones included (GLM-5);
    None: plain SwiGLU (DeepSeek)."""

    limit: float | None = None  # (subclasses with their own __init__ keep the plain SwiGLU)
    # devices the routed experts are split among (expert parallel: `day0 compile --devices N`,
    # set by the compile driver through split_experts; MXFP4 experts only)
    devices: int = 1

    def __init__(self, cfg, swiglu_limit: float | None = None):
        super().__init__()
        self.limit = swiglu_limit
        self.gate = Router(cfg)
        mxfp4 = getattr(cfg, "day0_expert_format", None) == "mxfp4"
        expert = Mxfp4Expert if mxfp4 else MLP
        self.experts = (Mxfp4Experts if mxfp4 else Experts)(
            expert(cfg.hidden_size, cfg.moe_intermediate_size) for _ in range(cfg.n_routed_experts)
        )
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts, swiglu_limit)

    def forward(self, x: Tensor) -> Tensor:
        """x [S, hidden]. One token gathers only its k experts' weights; several tokens run every
        expert densely and mix with a sparse [S, E] weight matrix (no per-token weight copies)."""
        # the router's logits and the shared experts' gate projection in one matmul (layers.linears;
        # the up projection stays apart: swiglu fuses into its matvec)
        logits, shared_gate = linears(x, self.gate, self.shared_experts.gate_proj)
        weights, chosen = self.gate.route(logits)
        shared = self.shared_experts.from_gate(x, shared_gate)
        if isinstance(self.experts, Mxfp4Experts):
            return self._mxfp4_routed(x, weights, chosen) + shared
        gate, up, down = self.experts.stacked()
        if x.shape[0] == 1:
            idx = chosen[0]  # [k]
            g = torch.einsum("h,kih->ki", x[0], gate.index_select(0, idx))
            u = torch.einsum("h,kih->ki", x[0], up.index_select(0, idx))
            y = torch.einsum("ki,khi->kh", swiglu(g, u, self.limit), down.index_select(0, idx))
            routed = (weights[0, :, None] * y).sum(0, keepdim=True)
        else:
            mix = one_hot_sum(chosen, gate.shape[0], weights)  # [S, E]
            h = swiglu(torch.einsum("sh,eih->sei", x, gate), torch.einsum("sh,eih->sei", x, up), self.limit)
            routed = torch.einsum("sei,ehi,se->sh", h, down, mix)
        return routed + shared

    def _mxfp4_routed(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        if self.devices == 1:
            return mxfp4_routed(x, weights, chosen, *self.experts.stacked(), limit=self.limit)
        # expert parallel: device d holds experts [d·E/N, (d+1)·E/N) (their stacks are placed
        # there: passes/to_device_transfer.py) and computes every chosen slot with its own
        # experts, the others as its first expert at weight 0; device 0 adds the N partial sums
        per = len(self.experts) // self.devices
        total = None
        for d in range(self.devices):
            mine = (chosen >= d * per) & (chosen < (d + 1) * per)
            ids = torch.where(mine, chosen - d * per, 0)
            w = torch.where(mine, weights, 0.0)
            gate_up, down = (
                tuple(ops.to_device(t, d) for t in pair) for pair in self.experts.stacked(range(d * per, (d + 1) * per))
            )
            part = mxfp4_routed(
                ops.to_device(x, d), ops.to_device(w, d), ops.to_device(ids, d), gate_up, down, limit=self.limit
            )
            part = ops.to_device(part, 0)
            total = part if total is None else total + part
        return total


def mxfp4_routed(
    x: Tensor,
    weights: Tensor,
    chosen: Tensor,
    gate_up: tuple[Tensor, Tensor],
    down: tuple[Tensor, Tensor],
    limit: float | None = None,
) -> Tensor:
    """Σ_j w[t,j] · down_j(silu(gate_j x_t) · up_j x_t) with every expert matmul an MXFP4
    `day0::mxfp4_moe` over the chosen experts only (gate and up in one op).

    x [T, H] f32; weights [T, k] f32; chosen [T, k] i64; gate_up = (packed [E, 2I, H/2], scales
    [E, 2I, H/32]); down = (packed [E, H, I/2], scales [E, H, I/32]); limit: `swiglu`'s clamp. Returns [T, H] f32."""
    t, k = chosen.shape
    gu = torch.ops.day0.mxfp4_moe(x, *gate_up, chosen)  # [T, k, 2I]
    if one_token(t):
        # one token (a decode step): the SwiGLU inside the down projection's op, which cuda-sm90
        # runs as one expert matvec staging x through it (a launch fewer a layer; ops.py)
        y = ops.mxfp4_moe_swiglu(gu.reshape(k, -1), *down, chosen.reshape(k, 1), limit)
    else:
        g, u = gu.chunk(2, dim=-1)
        h = swiglu(g, u, limit).reshape(t * k, -1)  # each (token, expert) pair is its own row
        y = torch.ops.day0.mxfp4_moe(h, *down, chosen.reshape(t * k, 1))
    return (weights[..., None] * y.reshape(t, k, -1)).sum(1)


def split_experts(model: nn.Module, devices: int) -> int:
    """Split every MoE layer's routed experts among `devices` (expert parallel, `day0 compile
    --devices N`): device d holds and reads experts [d·E/N, (d+1)·E/N). Returns E (0 for one
    device). ValueError naming the problem when the model cannot be split so: dense (non-MXFP4)
    routed experts or an MoE of another kind, or N not dividing the number of experts."""
    if devices == 1:
        return 0
    moes = [m for m in model.modules() if isinstance(m, MoE) or type(m).__name__.endswith("MoE")]
    split = [m for m in moes if isinstance(m, MoE) and isinstance(m.experts, Mxfp4Experts)]
    if not split or len(split) != len(moes):
        raise ValueError(
            f"--devices {devices}: day0 splits MXFP4 routed experts among devices (expert parallel); "
            f"this {type(model).__name__} has {'no MoE layer' if not moes else 'routed experts of another kind'}"
        )
    experts = len(split[0].experts)
    if experts % devices:
        raise ValueError(f"--devices {devices} does not divide the checkpoint's {experts} routed experts")
    for m in split:
        m.devices = devices
    return experts


_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def expert_device(name: str, experts: int, devices: int) -> int:
    """The device holding checkpoint tensor `name` under split_experts: routed expert e's tensors
    (`...experts.<e>....`) on e // (experts / devices), every other tensor on device 0."""
    m = _EXPERT.search(name)
    return int(m.group(1)) // (experts // devices) if m and experts else 0
