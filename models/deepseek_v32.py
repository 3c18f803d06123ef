"""DeepSeek-V3.2 (`deepseek_v32`): MLA + DSA indexer + MoE with shared experts, export-friendly.

The module tree mirrors the checkpoint's tensor names exactly (`model.layers.{i}.self_attn...`),
so `state_dict()` keys are the safetensors keys and the compiled artifact can name every weight
as an IREE parameter read straight from the original shards.

State is explicit: `step` takes and returns the caches
    step(ids [S] i64, start [1] i64, *kv_caches, *index_caches) -> (logits [S, V], *caches)
(exported as prefill, decode, prefill_first and prefill_chunk) with per layer kv_cache
[T, kv_lora_rank + qk_rope_head_dim] and index_cache [T, index_head_dim] (T = max_seq_len), both
in the model's cache dtype (float32 or bfloat16; the math is float32).
"""

import torch
from torch import Tensor, nn

from day0.models.base import Backbone, CausalLM
from day0.models.config import (
    COMMON_FIELDS,
    DSA_FIELDS,
    MLA_FIELDS,
    MOE_FIELDS,
    NumberFields,
    require,
    require_static_rope,
    transformers_config,
)
from day0.models.layers import MLP, RMSNorm
from day0.models.mla import SparseMLA
from day0.models.moe import MoE
from day0.models.paging import CacheView, dense_view
from day0.runtime.artifact import StateTensor

MODEL_TYPE = "deepseek_v32"
# every number this architecture reads from config.json, checked before the model is built
NUMBER_FIELDS = NumberFields({**COMMON_FIELDS, **MLA_FIELDS, **MOE_FIELDS, **DSA_FIELDS})


def parse_config(raw: dict):
    """config.json dict -> transformers' DeepseekV32Config, after checking what day0 supports."""
    import transformers

    require(raw.get("model_type") == MODEL_TYPE, "model_type", f"expected '{MODEL_TYPE}'")
    expert_format = routed_expert_format(raw)
    fields = {k: v for k, v in raw.items() if k not in ("model_type", "quantization_config")}
    cfg = transformers_config(transformers.DeepseekV32Config, fields, "deepseek_v32")
    cfg.day0_expert_format = expert_format
    require_static_rope(cfg)
    require(cfg.hidden_act == "silu", "hidden_act", f"'{cfg.hidden_act}' is not supported (only silu)")
    require(
        cfg.num_key_value_heads == cfg.num_attention_heads,
        "num_key_value_heads",
        "MLA needs num_key_value_heads == num_attention_heads",
    )
    require(isinstance(cfg.q_lora_rank, int) and cfg.q_lora_rank > 0, "q_lora_rank", "must be a positive int")
    require(cfg.n_routed_experts % cfg.n_group == 0, "n_group", "must divide n_routed_experts")
    require(0 < cfg.topk_group <= cfg.n_group, "topk_group", "must be in [1, n_group]")
    require(cfg.num_experts_per_tok <= cfg.n_routed_experts, "num_experts_per_tok", "exceeds n_routed_experts")
    require(cfg.n_routed_experts // cfg.n_group >= 2, "n_group", "each group needs at least 2 experts")
    require(
        cfg.qk_rope_head_dim % 2 == 0 and cfg.qk_rope_head_dim <= cfg.index_head_dim,
        "qk_rope_head_dim",
        "must be even and at most index_head_dim",
    )
    require(
        set(cfg.layer_types) <= {"indexed_attention"},
        "layer_types",
        f"unsupported values {sorted(set(cfg.layer_types) - {'indexed_attention'})}",
    )
    require(
        set(cfg.mlp_layer_types) <= {"dense", "sparse"},
        "mlp_layer_types",
        f"unsupported values {sorted(set(cfg.mlp_layer_types) - {'dense', 'sparse'})}",
    )
    require(len(cfg.mlp_layer_types) == cfg.num_hidden_layers, "mlp_layer_types", "needs one entry per layer")
    return cfg


def routed_expert_format(raw: dict) -> str:
    """'dense' (bf16/f32 experts) or 'mxfp4' (compressed-tensors mxfp4-pack-quantized experts)."""
    from day0.models.mxfp4 import compressed_tensors_expert_format

    return compressed_tensors_expert_format(raw, MODEL_TYPE)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i: int):
        super().__init__()
        self.self_attn = SparseMLA(cfg)
        sparse = cfg.mlp_layer_types[i] == "sparse"
        self.mlp = MoE(cfg) if sparse else MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, view, cos, sin, kv_cache, index_cache, k):
        a, kv_cache, index_cache = self.self_attn(self.input_layernorm(h), view, cos, sin, kv_cache, index_cache, k)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), kv_cache, index_cache


class DeepseekV32(CausalLM):
    """The causal LM. Build it with `DeepseekV32.empty(cfg, max_seq_len)` and fill the weights
    from a checkpoint; `step` is exported as prefill, decode and prefill_first."""

    # capabilities (models/base.py): the first turn scores only the prompt's own keys; every cache
    # row belongs to one position; the latent and indexer key caches may be bfloat16
    has_first_turn = True
    position_indexed_state = True
    supports_bf16_cache = True

    def __init__(self, cfg, max_seq_len: int, cache_dtype: str = "float32"):
        super().__init__(cfg, max_seq_len, cache_dtype)
        self.model = Backbone(cfg, DecoderLayer)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def rope_dim(self) -> int:
        return self.cfg.qk_rope_head_dim

    def selection_width(self) -> int:
        """K, the number of positions the indexer selects per query (the DSA op's width)."""
        return min(self.cfg.index_topk, self.max_seq_len)

    def state_specs(self) -> list[StateTensor]:
        c, t = self.cfg, self.max_seq_len
        kv = [
            StateTensor(f"kv_cache.{i}", "mla_latent", i, (t, c.kv_lora_rank + c.qk_rope_head_dim), self.cache_dtype)
            for i in range(c.num_hidden_layers)
        ]
        ix = [
            StateTensor(f"index_cache.{i}", "indexer_keys", i, (t, c.index_head_dim), self.cache_dtype)
            for i in range(c.num_hidden_layers)
        ]
        return kv + ix

    def step(self, ids: Tensor, start: Tensor, *state: Tensor, first_turn: bool = False) -> tuple[Tensor, ...]:
        """Run ids [S] at positions start..start+S-1 over the state; returns (logits [S, V], *state).

        first_turn: the caller guarantees start == 0, so only the first S cache rows can be
        visible and the indexer scores S columns instead of max_seq_len (the dominant prefill
        cost: docs/perf.md)."""
        positions = start + torch.arange(ids.shape[0], dtype=torch.int64)  # [S]
        keys = ids.shape[0] if first_turn else self.max_seq_len  # L, the key range
        return self._run(ids, dense_view(positions, keys), state)

    def _run(self, ids: Tensor, view: CacheView, state, last: bool = False) -> tuple[Tensor, ...]:
        n = self.cfg.num_hidden_layers
        kv_caches, index_caches = list(state[:n]), list(state[n:])
        cos, sin = self.rope_at(view.positions)
        h = self.model.embed_tokens.weight.index_select(0, ids).float()  # [S, hidden]
        for i, layer in enumerate(self.model.layers):
            h, kv_caches[i], index_caches[i] = layer(
                h, view, cos, sin, kv_caches[i], index_caches[i], self.selection_width()
            )
        h = self.model.norm(h[-1:] if last else h)
        head = self.model.embed_tokens if self.lm_head is None else self.lm_head
        return (h @ head.weight.float().T, *kv_caches, *index_caches)
