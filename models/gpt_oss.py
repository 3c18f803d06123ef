"""gpt-oss (`gpt_oss`): GQA attention with sinks, alternating sliding/full layers, MoE whose
experts are MXFP4 in the checkpoint, export-friendly.

The module tree mirrors the checkpoint's tensor names exactly (`model.layers.{i}.mlp.experts.
gate_up_proj_blocks`, ...), so `state_dict()` keys are the safetensors keys; the MXFP4 blocks and
scales are uint8 parameters with their file shapes and are never dequantized in the graph: every
expert matmul is `day0::mxfp4_moe` on a reshaped view of them.

State is explicit, one functional entry point for prefill and decode:
    step(ids [S] i64, start [1] i64, *k_caches, *v_caches) -> (logits [S, V] f32, *caches)
with per layer k_cache, v_cache [T, kv_heads, head_dim] float32 (T = max_seq_len). Sliding-window
layers keep all T rows too and mask by the window (see models/attention.py).
"""

import torch
from torch import Tensor, nn

import day0.frontend.ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.models.attention import SinkAttention
from day0.models.base import Backbone, CausalLM
from day0.models.config import COMMON_FIELDS, NumberFields, require, require_static_rope, transformers_config
from day0.models.layers import RMSNorm
from day0.models.paging import CacheView, dense_view
from day0.runtime.artifact import StateTensor

MODEL_TYPE = "gpt_oss"
# every number this architecture reads from config.json, checked before the model is built
NUMBER_FIELDS = NumberFields(
    {
        **COMMON_FIELDS,
        "head_dim": "null|int>=1",
        "num_local_experts": "int>=1",
        "num_experts_per_tok": "int>=1",
        "sliding_window": "null|int>=1",
        "swiglu_alpha": ">0",
        "swiglu_limit": ">0",
    }
)
LAYER_TYPES = ("sliding_attention", "full_attention")
QUANT_METHODS = ("mxfp4",)
MXFP4_BLOCK = 32


def parse_config(raw: dict):
    """config.json dict -> transformers' GptOssConfig, after checking what day0 supports."""
    import transformers

    require(raw.get("model_type") == MODEL_TYPE, "model_type", f"expected '{MODEL_TYPE}'")
    cfg = transformers_config(transformers.GptOssConfig, {k: v for k, v in raw.items() if k != "model_type"}, "gpt_oss")
    require_static_rope(cfg)
    require(len(cfg.layer_types) == cfg.num_hidden_layers, "layer_types", "needs one entry per layer")
    require(
        set(cfg.layer_types) <= set(LAYER_TYPES),
        "layer_types",
        f"unsupported values {sorted(set(cfg.layer_types) - set(LAYER_TYPES))} (supported: {', '.join(LAYER_TYPES)})",
    )
    if "sliding_attention" in cfg.layer_types:
        require(
            isinstance(cfg.sliding_window, int) and cfg.sliding_window > 0,
            "sliding_window",
            "must be a positive int when a layer is sliding_attention",
        )
    require(
        cfg.num_attention_heads % cfg.num_key_value_heads == 0, "num_key_value_heads", "must divide num_attention_heads"
    )
    require(cfg.head_dim % 2 == 0, "head_dim", "must be even (rotary halves)")
    require(
        0 < cfg.num_experts_per_tok <= cfg.num_local_experts, "num_experts_per_tok", "must be in [1, num_local_experts]"
    )
    quant = getattr(cfg, "quantization_config", None)
    if quant is not None:
        method = quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        require(method is not None, "quantization_config.quant_method", "missing")
        require(
            method in QUANT_METHODS,
            "quantization_config.quant_method",
            f"'{method}' is not supported (supported: {', '.join(QUANT_METHODS)} or no quantization_config)",
        )
        for field in ("hidden_size", "intermediate_size"):
            require(
                getattr(cfg, field) % MXFP4_BLOCK == 0, field, f"must be a multiple of {MXFP4_BLOCK} for MXFP4 experts"
            )
    return cfg


def is_mxfp4(cfg) -> bool:
    return getattr(cfg, "quantization_config", None) is not None


class Router(nn.Module):
    """logits = x·Wᵀ + b; the top-k logits, softmaxed among themselves, weight the k experts."""

    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.weight = nn.Parameter(torch.empty(cfg.num_local_experts, cfg.hidden_size))
        self.bias = nn.Parameter(torch.empty(cfg.num_local_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [S, hidden] -> (weights [S, k] f32, experts [S, k] i64)."""
        logits = torch.nn.functional.linear(x, self.weight.float(), self.bias.float())  # [S, E]
        top, experts = logits.topk(self.top_k, dim=-1, sorted=False)  # a set: softmax over it
        return torch.softmax(top, dim=-1), experts


class Mxfp4Experts(nn.Module):
    """The experts as the gpt-oss MXFP4 checkpoint stores them (u8 blocks/scales, f32 bias).
    A weight [E, N, K] is blocks [E, N, K/32, 16] + scales [E, N, K/32]; viewed as the op's
    packed [E, N, K/2] it is N×K, the layout the fused matvec reads."""

    def __init__(self, cfg):
        super().__init__()
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size

        def u8(*shape):
            return nn.Parameter(torch.empty(*shape, dtype=torch.uint8), requires_grad=False)

        self.gate_up_proj_blocks = u8(e, 2 * i, h // MXFP4_BLOCK, 16)
        self.gate_up_proj_scales = u8(e, 2 * i, h // MXFP4_BLOCK)
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj_blocks = u8(e, h, i // MXFP4_BLOCK, 16)
        self.down_proj_scales = u8(e, h, i // MXFP4_BLOCK)
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))

    def gate_up(self, x: Tensor, experts: Tensor) -> Tensor:
        """x [S, H], experts [S, k] -> [S, k, 2I] (interleaved gate/up, bias added)."""
        blocks = self.gate_up_proj_blocks
        packed = blocks.reshape(blocks.shape[0], blocks.shape[1], -1)  # [E, 2I, H/2]
        y = torch.ops.day0.mxfp4_moe(x, packed, self.gate_up_proj_scales, experts)
        return y + _gather(self.gate_up_proj_bias, experts)

    def down(self, h: Tensor, experts: Tensor) -> Tensor:
        """h [S, k, I] (one input per token and chosen expert), experts [S, k] -> [S, k, H]."""
        s, k = experts.shape
        blocks = self.down_proj_blocks
        packed = blocks.reshape(blocks.shape[0], blocks.shape[1], -1)  # [E, H, I/2]
        y = torch.ops.day0.mxfp4_moe(
            h.reshape(s * k, -1), packed, self.down_proj_scales, experts.reshape(s * k, 1)
        )  # [S·k, 1, H]
        return y.view(s, k, -1) + _gather(self.down_proj_bias, experts)


class DenseExperts(nn.Module):
    """Unquantized experts as transformers stores them: gate_up_proj [E, H, 2I], down_proj
    [E, I, H] (in×out). Gathers each token's k expert matrices: simple, not optimized."""

    def __init__(self, cfg):
        super().__init__()
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, h, 2 * i))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj = nn.Parameter(torch.empty(e, i, h))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))

    def gate_up(self, x: Tensor, experts: Tensor) -> Tensor:
        w = _gather(self.gate_up_proj, experts)  # [S, k, H, 2I]
        return torch.einsum("sh,skhn->skn", x, w) + _gather(self.gate_up_proj_bias, experts)

    def down(self, h: Tensor, experts: Tensor) -> Tensor:
        w = _gather(self.down_proj, experts)  # [S, k, I, H]
        return torch.einsum("ski,skih->skh", h, w) + _gather(self.down_proj_bias, experts)


def _gather(stack: Tensor, experts: Tensor) -> Tensor:
    """stack [E, ...], experts [S, k] -> float32 [S, k, ...] (biases: [E, N] -> [S, k, N])."""
    rows = stack.index_select(0, experts.reshape(-1)).float()
    return rows.view(*experts.shape, *stack.shape[1:])


class SparseMoE(nn.Module):
    """Checkpoint names: mlp.router.{weight,bias}, mlp.experts.*."""

    def __init__(self, cfg):
        super().__init__()
        self.router = Router(cfg)
        self.experts = Mxfp4Experts(cfg) if is_mxfp4(cfg) else DenseExperts(cfg)
        self.alpha, self.limit = cfg.swiglu_alpha, cfg.swiglu_limit

    def forward(self, x: Tensor) -> Tensor:
        """x [S, hidden] -> [S, hidden]: Σ_k weight_k · down_k(clamped-SwiGLU(gate_up_k(x)))."""
        weights, experts = self.router(x)  # [S, k]
        gate_up = self.experts.gate_up(x, experts)  # [S, k, 2I]
        gate = gate_up[..., 0::2].clamp(max=self.limit)  # interleaved: even = gate, odd = up
        up = gate_up[..., 1::2].clamp(min=-self.limit, max=self.limit)
        h = (up + 1) * (gate * torch.sigmoid(gate * self.alpha))  # [S, k, I]
        y = self.experts.down(h, experts)  # [S, k, H]
        return (weights[..., None] * y).sum(1)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i: int):
        super().__init__()
        self.self_attn = SinkAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.attention_bias
        )
        self.mlp = SparseMoE(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, view, cos, sin, visible, k_cache, v_cache):
        a, k_cache, v_cache = self.self_attn(self.input_layernorm(h), view, cos, sin, visible, k_cache, v_cache)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), k_cache, v_cache


class GptOss(CausalLM):
    """The causal LM. Build it with `GptOss.empty(cfg, max_seq_len)` and fill the weights from a
    checkpoint; `step` is the functional entry point for both prefill and decode."""

    position_indexed_state = True  # every K/V row belongs to one position (models/base.py)

    def __init__(self, cfg, max_seq_len: int, cache_dtype: str = "float32"):
        super().__init__(cfg, max_seq_len, cache_dtype)
        self.model = Backbone(cfg, DecoderLayer)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Per layer: a window in positions, or 0 for full attention.
        self.windows = [cfg.sliding_window if t == "sliding_attention" else 0 for t in cfg.layer_types]

    def rope_dim(self) -> int:
        return self.cfg.head_dim

    def state_specs(self) -> list[StateTensor]:
        c, t = self.cfg, self.max_seq_len
        shape = (t, c.num_key_value_heads, c.head_dim)
        return [StateTensor(f"k_cache.{i}", "keys", i, shape) for i in range(c.num_hidden_layers)] + [
            StateTensor(f"v_cache.{i}", "values", i, shape) for i in range(c.num_hidden_layers)
        ]

    def step(self, ids: Tensor, start: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        """Run ids [S] at positions start..start+S-1 over the state; returns (logits [S, V], *state)."""
        positions = start + torch.arange(ids.shape[0], dtype=torch.int64)  # [S]
        return self._run(ids, dense_view(positions, self.max_seq_len), state)

    def _run(self, ids: Tensor, view: CacheView, state, last: bool = False) -> tuple[Tensor, ...]:
        n = self.cfg.num_hidden_layers
        k_caches, v_caches = list(state[:n]), list(state[n:])
        cos, sin = self.rope_at(view.positions)
        masks = {w: view.window(w) for w in set(self.windows)}  # sliding layers see the last w positions
        h = self.model.embed_tokens.weight.index_select(0, ids).float()  # [S, hidden]
        for i, layer in enumerate(self.model.layers):
            h, k_caches[i], v_caches[i] = layer(h, view, cos, sin, masks[self.windows[i]], k_caches[i], v_caches[i])
        h = self.model.norm(h[-1:] if last else h)
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return (h @ head.weight.float().T, *k_caches, *v_caches)
