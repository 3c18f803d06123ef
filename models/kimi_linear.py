"""Kimi-Linear (`kimi_linear`): KDA layers + dense MLA layers without RoPE (3:1 in the released
model), MoE with shared experts and sigmoid group-limited routing, export-friendly.

The module tree mirrors the checkpoint's tensor names exactly, as Moonshot's checkpoints and
transformers' save_pretrained write them: `model.layers.{i}.self_attn.*` (KDA: q/k/v_conv1d,
f_a_proj, A_log, ...; MLA: kv_a_proj_with_mqa, ...), `model.layers.{i}.block_sparse_moe.*` for
the MoE (experts.{e}.w1/w2/w3, gate, shared_experts; the routed experts f32/bf16 or MXFP4 in the
compressed-tensors layout, `w1.weight_packed`/`weight_scale`, as Kimi K3 ships them or
`day0 quantize` writes them); the dense MLP of the first layers is
`mlp.*` in Moonshot's checkpoints and `block_sparse_moe.*` in transformers' (`dense_mlp_name`).

State is explicit, one functional entry point for prefill and decode:
    step(ids [S] i64, start [1] i64, *state) -> (logits [S, V] f32, *state)
with the state in layer order: an MLA layer holds its latent cache [T, kv_lora_rank +
qk_rope_head_dim] ("mla_latent", T = max_seq_len), a KDA layer its conv tail [3·H·K, kernel-1]
("conv_tail") and its recurrent state [H, K, K] ("kda_state"), all float32. Several tokens run
KDA's chunked form (any length: it pads with zero tokens, which leave the state unchanged), one
token the recurrence, so decode never builds a chunk.
"""

from types import SimpleNamespace

import torch
from torch import Tensor, nn

from day0.models.base import Backbone, CausalLM
from day0.models.config import (
    COMMON_FIELDS,
    KDA_FIELDS,
    MLA_FIELDS,
    MOE_FIELDS,
    ConfigError,
    NumberFields,
    require,
    require_group_routing,
    require_layer_kinds,
    transformers_config,
)
from day0.models.kda import KdaAttention, require_kda_sizes
from day0.models.layers import MLP, RMSNorm
from day0.models.mla import NopeMLA
from day0.models.moe import Experts, MoE, Mxfp4Expert, Mxfp4Experts, Router
from day0.models.paging import CacheView, dense_view
from day0.runtime.artifact import StateTensor

MODEL_TYPE = "kimi_linear"
# every number this architecture reads from config.json, checked before the model is built
NUMBER_FIELDS = NumberFields(
    {
        **COMMON_FIELDS,
        **MLA_FIELDS,
        **MOE_FIELDS,
        **KDA_FIELDS,
        "model_max_length": "int>=1",
        "num_experts": "int>=1",
        "num_local_experts": "int>=1",
        "num_experts_per_token": "int>=1",
        "num_expert_group": "int>=1",
        "num_shared_experts": "int>=0",
    }
)
LAYER_TYPES = ("linear_attention", "full_attention")
MLP_TYPES = ("dense", "sparse")


def parse_config(raw: dict):
    """config.json dict -> transformers' KimiLinearConfig, after checking what day0 supports."""
    import transformers

    require(raw.get("model_type") == MODEL_TYPE, "model_type", f"expected '{MODEL_TYPE}'")
    expert_format = routed_expert_format(raw)
    # Fields of Moonshot's config that transformers ignores: a value other than the one its
    # implementation hard-codes would silently give a different model.
    require(
        raw.get("mla_use_nope", True) is True,
        "mla_use_nope",
        "the MLA layers must be NoPE (no rotary embedding on the shared key part): "
        "transformers' kimi_linear and day0 implement only that",
    )
    require(
        raw.get("moe_router_activation_func", "sigmoid") == "sigmoid",
        "moe_router_activation_func",
        f"'{raw.get('moe_router_activation_func')}' is not supported (only sigmoid)",
    )
    _check_layer_lists(raw)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "quantization_config")}
    cfg = transformers_config(transformers.KimiLinearConfig, fields, MODEL_TYPE)
    cfg.day0_dense_mlp_name = dense_mlp_name(raw)
    cfg.day0_expert_format = expert_format
    require(cfg.hidden_act == "silu", "hidden_act", f"'{cfg.hidden_act}' is not supported (only silu)")
    require_layer_kinds("layer_types", cfg.layer_types, LAYER_TYPES, cfg.num_hidden_layers)
    require_layer_kinds("mlp_layer_types", cfg.mlp_layer_types, MLP_TYPES, cfg.num_hidden_layers)
    if "linear_attention" in cfg.layer_types:
        require_kda_sizes(cfg, "linear_attn_config", "linear_attn_config.short_conv_kernel_size")
    if "full_attention" in cfg.layer_types:
        require(
            cfg.num_key_value_heads == cfg.num_attention_heads,
            "num_key_value_heads",
            "MLA needs num_key_value_heads == num_attention_heads",
        )
        require(cfg.q_lora_rank is None or cfg.q_lora_rank > 0, "q_lora_rank", "must be null or a positive int")
        require(cfg.qk_rope_head_dim >= 0, "qk_rope_head_dim", "must be non-negative")
    if "sparse" in cfg.mlp_layer_types:
        require_group_routing(cfg, cfg.num_local_experts, "num_expert_group", "num_experts_per_token")
    return cfg


def routed_expert_format(raw: dict) -> str:
    """'dense' (bf16/f32 experts) or 'mxfp4': compressed-tensors mxfp4-pack-quantized routed
    experts (Kimi K3's layout, or `day0 quantize --layout compressed-tensors`): per expert
    `w1/w2/w3.weight_packed` u8 [out, in/2] and `weight_scale` u8 [out, in/32]. Any other
    quantization_config is a ConfigError naming the field."""
    from day0.models.mxfp4 import Mxfp4Error, compressed_tensors_expert_format

    try:
        return compressed_tensors_expert_format(raw, MODEL_TYPE)
    except Mxfp4Error as e:  # (names the quantization_config field that is not MXFP4)
        raise ConfigError(
            f"{e}; {MODEL_TYPE} supports only compressed-tensors mxfp4-pack-quantized routed experts"
        ) from None


def dense_mlp_name(raw: dict) -> str:
    """The checkpoint's name for the dense MLP of the first layers. Moonshot's checkpoints call it
    `mlp` (their config has first_k_dense_replace, no mlp_layer_types); transformers' save_pretrained
    writes `block_sparse_moe` for every layer's MLP, and mlp_layer_types into the config. (The MoE
    is `block_sparse_moe` in both.) A checkpoint that mixes the two fails check_expected, which
    names the missing tensors."""
    return "block_sparse_moe" if raw.get("mlp_layer_types") is not None else "mlp"


def _check_layer_lists(raw: dict) -> None:
    """The per-layer lists as config.json gives them, checked before transformers' config class
    (whose own messages name no field). layer_types wins over linear_attn_config (1-based lists)."""
    n = raw.get("num_hidden_layers", 27)  # (transformers' default)
    if raw.get("layer_types") is None and "linear_attn_config" in raw:
        lists = raw["linear_attn_config"]
        kda, full = lists.get("kda_layers"), lists.get("full_attn_layers")
        if kda is not None and full is not None:
            placed = set(kda) | set(full)
            outside = sorted(i for i in placed if not (isinstance(i, int) and 1 <= i <= n))
            require(not outside, "linear_attn_config", f"layers {outside} are not in 1..{n} (the lists are 1-based)")
            both = sorted(set(kda) & set(full))
            require(not both, "linear_attn_config", f"layers {both} are in both kda_layers and full_attn_layers")
            unplaced = [i for i in range(1, n + 1) if i not in placed]
            require(
                not unplaced,
                "linear_attn_config",
                f"layers {unplaced} (1-based) are in neither kda_layers nor full_attn_layers",
            )
    for field, kinds in (("layer_types", LAYER_TYPES), ("mlp_layer_types", MLP_TYPES)):
        if raw.get(field) is not None:
            require_layer_kinds(field, raw[field], kinds, n)


# the Router's fields (models/moe.py) that kimi_linear's config names as DeepSeek's does
ROUTER_FIELDS = (
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
    "hidden_size",
)


def router_config(cfg) -> SimpleNamespace:
    """The DeepSeek router's field names (models/moe.py) for kimi_linear's values."""
    return SimpleNamespace(n_routed_experts=cfg.num_local_experts, **{f: getattr(cfg, f) for f in ROUTER_FIELDS})


EXPERT_NAMES = ("w1", "w3", "w2")  # Moonshot's (gate, up, down)


class Expert(nn.Module):
    """One routed expert as Moonshot names it: w1 = gate, w3 = up, w2 = down."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)


class KimiExperts(Experts):
    def stacked(self) -> tuple[Tensor, Tensor, Tensor]:
        """gate, up [E, I, H] and down [E, H, I] as float32 stacks."""
        return tuple(torch.stack([getattr(e, n).weight for e in self]).float() for n in EXPERT_NAMES)


class KimiMxfp4Experts(Mxfp4Experts):
    """MXFP4 routed experts (packed from the file to the matmul) under Moonshot's names:
    experts.{e}.w1/w3/w2.weight_packed, .weight_scale."""

    names = EXPERT_NAMES


class KimiMoE(MoE):
    """DeepSeek's MoE (same routing: transformers' KimiLinearTopkRouter is DeepSeek's) with
    Moonshot's expert names. Checkpoint names: gate.{weight,e_score_correction_bias},
    experts.{e}.w1/w2/w3 (.weight, or .weight_packed/.weight_scale for MXFP4 experts),
    shared_experts.{gate,up,down}_proj."""

    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.gate = Router(router_config(cfg))
        h, i = cfg.hidden_size, cfg.moe_intermediate_size
        if getattr(cfg, "day0_expert_format", "dense") == "mxfp4":
            self.experts = KimiMxfp4Experts(Mxfp4Expert(h, i, EXPERT_NAMES) for _ in range(cfg.num_local_experts))
        else:
            self.experts = KimiExperts(Expert(h, i) for _ in range(cfg.num_local_experts))
        self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i: int):
        super().__init__()
        self.is_kda = cfg.layer_types[i] == "linear_attention"
        if self.is_kda:
            self.self_attn = KdaAttention.from_config(cfg)
        else:
            self.self_attn = NopeMLA(cfg)
        # the MoE is `block_sparse_moe`; the dense MLP's name depends on the checkpoint's writer
        if cfg.mlp_layer_types[i] == "sparse":
            self.ffn_name, ffn = "block_sparse_moe", KimiMoE(cfg)
        else:
            self.ffn_name = getattr(cfg, "day0_dense_mlp_name", "block_sparse_moe")
            ffn = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.add_module(self.ffn_name, ffn)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: Tensor, view: CacheView, *state: Tensor) -> tuple[Tensor, ...]:
        """state: (kv_cache,) for MLA, (conv_tail, kda_state) for KDA; returned updated."""
        x = self.input_layernorm(h)
        if self.is_kda:
            a, *state = self.self_attn(x, *state, chunked=x.shape[0] > 1)
        else:
            a, *state = self.self_attn(x, view, *state)
        h = h + a
        return h + getattr(self, self.ffn_name)(self.post_attention_layernorm(h)), *state


class KimiLinear(CausalLM):
    """The causal LM. Build it with `KimiLinear.empty(cfg, max_seq_len)` and fill the weights
    from a checkpoint; `step` is the functional entry point for both prefill and decode."""

    def __init__(self, cfg, max_seq_len: int, cache_dtype: str = "float32"):
        super().__init__(cfg, max_seq_len, cache_dtype)
        self.model = Backbone(cfg, DecoderLayer)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)  # never tied (transformers)

    def rope_dim(self) -> int:
        return 0  # NoPE: no rope table

    def state_specs(self) -> list[StateTensor]:
        c, specs = self.cfg, []
        for i, layer in enumerate(self.model.layers):
            if layer.is_kda:
                conv, rec = layer.self_attn.state_shapes()
                specs += [
                    StateTensor(f"conv_tail.{i}", "conv_tail", i, conv),
                    StateTensor(f"kda_state.{i}", "kda_state", i, rec),
                ]
            else:
                specs.append(
                    StateTensor(
                        f"kv_cache.{i}", "mla_latent", i, (self.max_seq_len, c.kv_lora_rank + c.qk_rope_head_dim)
                    )
                )
        return specs

    def step(self, ids: Tensor, start: Tensor, *state: Tensor) -> tuple[Tensor, ...]:
        """Run ids [S] at positions start..start+S-1 over the state; returns (logits [S, V], *state)."""
        positions = start + torch.arange(ids.shape[0], dtype=torch.int64)  # [S]
        return self._run(ids, dense_view(positions, self.max_seq_len), state)

    def _run(self, ids: Tensor, view: CacheView, state, last: bool = False) -> tuple[Tensor, ...]:
        state = list(state)
        h = self.model.embed_tokens.weight.index_select(0, ids).float()  # [S, hidden]
        at = 0
        for layer in self.model.layers:
            n = 2 if layer.is_kda else 1
            h, *state[at : at + n] = layer(h, view, *state[at : at + n])  # (slice target)
            at += n
        h = self.model.norm(h[-1:] if last else h)
        return (h @ self.lm_head.weight.float().T, *state)
