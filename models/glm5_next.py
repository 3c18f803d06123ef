"""GLM-5.3-Flash (`glm5_next`), text model: KDA layers + DSA-sparse NoPE MLA layers with GLM-5's
k-pool indexer (models/kpool_indexer.py; "shared" layers reuse the previous full layer's
selection), mHC residual streams (models/mhc.py), MoE with shared experts and clamped SwiGLU,
routed experts f32/bf16 or MXFP4 (compressed-tensors, `day0 quantize`). Export-friendly.

The module tree mirrors the checkpoint's tensor names as transformers' Glm5NextForConditionalGeneration
saves them: `model.language_model.layers.{i}.self_attn.*` (KDA: q/k/v_conv1d, f_a_proj, A_log [H], ...;
MLA: q_a_proj, kv_a_proj_with_mqa, ..., indexer.*), `...layers.{i}.mlp.*` (experts.{e}.gate_proj...),
`...layers.{i}.hc_{attn,ffn}_{fn,base,scale}`, `model.language_model.{embed_tokens,norm}`, `lm_head`.
A checkpoint that takes images (`vision_config`, an `image_token_id` inside the text vocabulary,
the tower's out_hidden_size the text hidden_size: vision_config, parse_config's `cfg.day0_vision`)
also has `model.visual.*`, models/vision.py's VisionTower, held as `model.visual` (the artifact's
`encode_image` entry point); otherwise those tensors, if any (transformers writes a tower for
every Glm5NextForConditionalGeneration), are unused and the model is the text model alone.

State is explicit, in layer order, one functional entry point for prefill and decode:
    step(ids [S] i64, start [1] i64, *state) -> (logits [S, V] f32, *state)
A prompt with images also passes the vision tower's features and which rows they replace:
    step(ids, start, *state, features=[N, hidden] f32, feature_rows=[S] i64) (and step_paged's
    same keywords): row s takes features[feature_rows[s]] instead of its token's embedding where
    feature_rows[s] >= 0 (the image placeholders; CausalLM.mix_features). Positions are the
    ordinary ones (transformers' glm5_next has no multimodal rope: its DSA layers are NoPE and KDA
    has no positions).
a KDA layer holds its conv tail [3·H·K, kernel-1] ("conv_tail") and recurrent state [H, K, K]
("kda_state"); a DSA layer its latent cache [T, kv_lora_rank] ("mla_latent"), and when its indexer
is "full" the indexer's token rows [T, 2·d_I] ("indexer_keys") and pooled keys
[ceil(T/kpool), d_I] ("indexer_pools"). A "shared" layer has no indexer state: it attends over
the selection the full layer just before it computed in the same step.
"""

import torch
from torch import Tensor, nn

from day0.frontend import ops  # noqa: F401  (registers torch.ops.day0.*)
from day0.models.base import Backbone, CausalLM
from day0.models.config import (
    COMMON_FIELDS,
    DSA_FIELDS,
    KDA_FIELDS,
    KDA_SUB_FIELDS,
    MLA_FIELDS,
    MOE_FIELDS,
    NumberFields,
    require,
    require_group_routing,
    require_layer_kinds,
    transformers_config,
)
from day0.models.kda import KdaAttention, require_kda_sizes
from day0.models.kpool_indexer import KPoolIndexer
from day0.models.layers import MLP, RMSNorm, linears
from day0.models.mhc import hc_merge, hc_parameters, hc_weights
from day0.models.mla import NopeMLA
from day0.models.moe import MoE
from day0.models.paging import CacheView, dense_view
from day0.models.vision import VisionTower, axial_inv_freq, parse_vision_config
from day0.runtime.artifact import StateTensor

MODEL_TYPE = "glm5_next"
# every number this architecture reads from config.json, checked before the model is built
NUMBER_FIELDS = NumberFields(
    {
        **COMMON_FIELDS,
        **MLA_FIELDS,
        **MOE_FIELDS,
        **DSA_FIELDS,
        **KDA_FIELDS,
        "linear_attn_config": {**KDA_SUB_FIELDS, "gate_lower_bound": "null|finite"},
        "index_kpool": "int>=1",
        "swiglu_limit": ">0",
        "linear_lower_bound": "null|finite",
        "hc_mult": "int>=1",
        "hc_eps": ">0",
        "hc_sinkhorn_iters": "int>=1",
    },
    root_key="text_config",
    own=("index_kpool", "hc_mult", "hc_sinkhorn_iters"),  # parse_config names them without text_config.
)
LAYER_TYPES = ("linear_attention", "indexed_attention", "full_attention")  # full_attention = indexed
INDEXER_TYPES = ("full", "shared")
MLP_TYPES = ("dense", "sparse")
# config.json keys of the multimodal wrapper, not of the text model
WRAPPER_KEYS = (
    "model_type",
    "text_config",
    "vision_config",
    "quantization_config",
    "architectures",
    "image_token_id",
    "video_token_id",
    "image_start_token_id",
    "image_end_token_id",
    "video_start_token_id",
    "video_end_token_id",
    "transformers_version",
    "dtype",
    "torch_dtype",
)


def text_fields(raw: dict) -> dict:
    """The text model's fields: `text_config` (multimodal checkpoints) or the top level (flat)."""
    if isinstance(raw.get("text_config"), dict):
        return {k: v for k, v in raw["text_config"].items() if k != "model_type"}
    return {k: v for k, v in raw.items() if k not in WRAPPER_KEYS}


def parse_config(raw: dict):
    """config.json dict -> transformers' Glm5NextTextConfig, after checking what day0 supports."""
    import transformers

    require(raw.get("model_type") == MODEL_TYPE, "model_type", f"expected '{MODEL_TYPE}'")
    expert_format = routed_expert_format(raw)
    fields = text_fields(raw)
    defaults = transformers.Glm5NextTextConfig

    def get(name):
        return fields.get(name, getattr(defaults, name))

    n = get("num_hidden_layers")
    for field, kinds in (
        ("layer_types", LAYER_TYPES),
        ("indexer_types", INDEXER_TYPES),
        ("mlp_layer_types", MLP_TYPES),
    ):
        if fields.get(field) is not None:
            require_layer_kinds(field, fields[field], kinds, n)
    require(
        get("qk_rope_head_dim") == 0,
        "qk_rope_head_dim",
        f"must be 0 (got {get('qk_rope_head_dim')}): GLM-5's DSA attention layers are NoPE, "
        f"and transformers' glm5_next rejects a RoPE dim",
    )
    require(
        isinstance(get("q_lora_rank"), int) and get("q_lora_rank") > 0,
        "q_lora_rank",
        "must be a positive int (the DSA indexer reads the q LoRA latent)",
    )
    kpool, topk = get("index_kpool"), get("index_topk")
    require(isinstance(kpool, int) and kpool >= 1, "index_kpool", f"must be a positive int (got {kpool})")
    require(
        isinstance(topk, int) and topk >= kpool and topk % kpool == 0,
        "index_topk",
        f"must be a positive multiple of index_kpool ({kpool}), got {topk}",
    )
    require(
        get("index_kpool_always_select_tail") is True,
        "index_kpool_always_select_tail",
        "only true is supported: without the tail, a query before its first complete pool "
        "selects nothing and transformers' attention over an empty selection is undefined",
    )
    require(
        get("num_key_value_heads") in (None, get("num_attention_heads")),
        "num_key_value_heads",
        "MLA needs num_key_value_heads == num_attention_heads",
    )
    cfg = transformers_config(transformers.Glm5NextTextConfig, fields, MODEL_TYPE)
    cfg.day0_expert_format = expert_format
    cfg.model_type = MODEL_TYPE  # the architecture the manifest names (the class says glm5_next_text)
    if isinstance(raw.get("text_config"), dict):  # the wrapper decides whether lm_head is tied
        cfg.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))
    require(cfg.hidden_act == "silu", "hidden_act", f"'{cfg.hidden_act}' is not supported (only silu)")
    cfg.day0_vision, _ = vision_config(raw, cfg)
    require_layer_kinds("layer_types", cfg.layer_types, LAYER_TYPES, n)
    require_layer_kinds("indexer_types", cfg.indexer_types, INDEXER_TYPES, n)
    require_layer_kinds("mlp_layer_types", cfg.mlp_layer_types, MLP_TYPES, n)
    for i, (kind, indexer) in enumerate(zip(cfg.layer_types, cfg.indexer_types)):
        if kind == "indexed_attention" and indexer == "shared":
            ok = i > 0 and cfg.layer_types[i - 1] == "indexed_attention" and cfg.indexer_types[i - 1] == "full"
            require(
                ok,
                "indexer_types",
                f"layer {i} is 'shared' but layer {i - 1} is not a 'full' indexed_attention layer "
                f"(a shared layer reuses the selection of the full DSA layer right before it)",
            )
    if "linear_attention" in cfg.layer_types:
        require_kda_sizes(cfg, "linear_num_heads", "linear_conv_kernel_dim")
    require(isinstance(cfg.hc_mult, int) and cfg.hc_mult >= 1, "hc_mult", f"must be a positive int (got {cfg.hc_mult})")
    require(
        isinstance(cfg.hc_sinkhorn_iters, int) and cfg.hc_sinkhorn_iters >= 1,
        "hc_sinkhorn_iters",
        f"must be a positive int (got {cfg.hc_sinkhorn_iters})",
    )
    if "sparse" in cfg.mlp_layer_types:
        require_group_routing(cfg, cfg.n_routed_experts, "n_group", "num_experts_per_tok")
    return cfg


def vision_config(raw: dict, text_cfg):
    """(the vision tower's parsed config, None) when the checkpoint takes images, else (None, why
    not, or None without a vision_config). It takes images when it has a `vision_config` object,
    an `image_token_id` inside the text vocabulary (not so in the tiny test checkpoints, whose
    vocabulary ends before transformers' default image token) and a tower whose features are rows
    of the text model (out_hidden_size = hidden_size: transformers' default config has 1536 and
    4096, with which its own model fails on any image). A tower config day0 does not support is a
    ConfigError (models/vision.py parse_vision_config)."""
    token = raw.get("image_token_id")
    if not isinstance(raw.get("vision_config"), dict):
        return None, None
    if type(token) is not int or not 0 <= token < text_cfg.vocab_size:
        return None, f"image_token_id {token!r} is not an id of the text vocabulary ({text_cfg.vocab_size})"
    vision = parse_vision_config(raw)
    if vision.out_hidden_size != text_cfg.hidden_size:
        return None, (
            f"vision_config.out_hidden_size {vision.out_hidden_size} is not the text hidden_size "
            f"{text_cfg.hidden_size}: the tower's features cannot take the image tokens' rows"
        )
    return vision, None


def routed_expert_format(raw: dict) -> str:
    """'dense' (bf16/f32 experts) or 'mxfp4' (compressed-tensors mxfp4-pack-quantized experts)."""
    from day0.models.mxfp4 import compressed_tensors_expert_format

    return compressed_tensors_expert_format(raw, MODEL_TYPE)


class DsaAttention(NopeMLA):
    """NoPE MLA made sparse by the k-pool indexer (`indexer` is absent on a "shared" layer)."""

    def __init__(self, cfg, full_indexer: bool):
        super().__init__(cfg, norm_eps=cfg.rms_norm_eps)
        if full_indexer:
            self.indexer = KPoolIndexer(
                cfg.hidden_size,
                cfg.q_lora_rank,
                cfg.index_n_heads,
                cfg.index_head_dim,
                cfg.index_topk,
                cfg.index_kpool,
                cfg.index_kpool_always_select_tail,
            )

    def forward(
        self, x: Tensor, view: CacheView, selected: Tensor | None, pools: int, kv_cache: Tensor, *indexer_state: Tensor
    ) -> tuple[Tensor, ...]:
        """x [S, hidden]; caches addressed through `view` (models/paging.py); selected: the
        previous full layer's selection, cache rows [S, K] (shared layers) or None; pools: the
        number of pools the indexer selects (static). Returns (out [S, hidden], selected,
        kv_cache, *indexer_state)."""
        if hasattr(self, "indexer"):  # every projection of x in one matmul (layers.linears)
            indexer = self.indexer
            q_in, compressed, k, gate, weights = linears(
                x, *self.projections(), *indexer.projections(), scales=(1.0, 1.0, *indexer.scales())
            )
        else:
            q_in, compressed = self.project(x)
        q_resid, query = self.queries(q_in)
        kv_cache = self.write_cache(compressed, view.rows, kv_cache)
        if hasattr(self, "indexer"):
            indexer_state = indexer.update(k, gate, view, *indexer_state)
            selected = view.physical(indexer.select(weights, q_resid, view, indexer_state[1], pools))
        o_latent = torch.ops.day0.dsa_attention(query, kv_cache, selected, self.scale, self.rank)
        return self.output(o_latent), selected, kv_cache, *indexer_state


class DecoderLayer(nn.Module):
    def __init__(self, cfg, i: int):
        super().__init__()
        self.is_kda = cfg.layer_types[i] == "linear_attention"
        self.full_indexer = not self.is_kda and cfg.indexer_types[i] == "full"
        if self.is_kda:
            self.self_attn = KdaAttention.from_config(
                cfg, a_log_shape=(cfg.linear_num_heads,), lower_bound=cfg.linear_lower_bound
            )
        else:
            self.self_attn = DsaAttention(cfg, self.full_indexer)
        if cfg.mlp_layer_types[i] == "sparse":
            self.mlp = MoE(cfg, swiglu_limit=cfg.swiglu_limit)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.swiglu_limit)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        hc_parameters(self, "hc_attn", cfg.hc_mult, cfg.hidden_size)
        hc_parameters(self, "hc_ffn", cfg.hc_mult, cfg.hidden_size)
        self.hc = (cfg.hc_sinkhorn_iters, cfg.hc_eps, cfg.rms_norm_eps)

    def state_count(self) -> int:
        return 2 if self.is_kda else (3 if self.full_indexer else 1)

    def forward(self, h: Tensor, view: CacheView, selected: Tensor | None, pools: int, *state: Tensor) -> tuple:
        """h: streams [S, N, hidden]; returns (h, selected or None, *state) (DsaAttention.forward)."""
        post, comb, x = hc_weights(h, self.hc_attn_fn, self.hc_attn_base, self.hc_attn_scale, *self.hc)
        x = self.input_layernorm(x)
        if self.is_kda:
            a, *state = self.self_attn(x, *state, chunked=x.shape[0] > 1)
            selected = None
        else:
            a, selected, *state = self.self_attn(x, view, selected, pools, *state)
        h = hc_merge(post, comb, a, h)
        post, comb, x = hc_weights(h, self.hc_ffn_fn, self.hc_ffn_base, self.hc_ffn_scale, *self.hc)
        h = hc_merge(post, comb, self.mlp(self.post_attention_layernorm(x)), h)
        return h, selected, *state


class Glm5Next(CausalLM):
    """The causal LM (text), with the vision tower as `model.visual` when the checkpoint takes
    images (`vision`; models/vision.py). Build it with `Glm5Next.empty(cfg, max_seq_len)` and fill
    the weights from a checkpoint; `step` is the functional entry point for both prefill and decode."""

    # a checkpoint's vision tower the model does not hold (models/vision.py): a text-only one
    unused_tensors = (r"model\.visual\..*",)
    takes_image_features = True

    def __init__(self, cfg, max_seq_len: int, cache_dtype: str = "float32"):
        super().__init__(cfg, max_seq_len, cache_dtype)
        self.model = nn.Module()
        self.model.language_model = Backbone(cfg, DecoderLayer)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        vision = getattr(cfg, "day0_vision", None)
        if vision is not None:
            self.model.visual = VisionTower(vision)
            self.unused_tensors = ()  # every model.visual.* tensor is the tower's

    @classmethod
    def empty(cls, cfg, max_seq_len: int, dtypes=None, cache_dtype: str = "float32"):
        m = super().empty(cfg, max_seq_len, dtypes, cache_dtype)
        if m.vision is not None:  # its rope frequencies, computed (to_empty left them unset)
            m.vision.inv_freq = axial_inv_freq(m.vision.cfg)
        return m

    @classmethod
    def compile_notes(cls, raw: dict, cfg) -> list[str]:
        notes = []
        if cfg.day0_vision is None:
            _, why = vision_config(raw, cfg)
            if why:
                notes.append(f"the vision tower is left out (text only): {why}")
        return notes

    @property
    def vision(self) -> VisionTower | None:
        """The vision tower, None for a text-only checkpoint."""
        return getattr(self.model, "visual", None)

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.language_model.layers

    def rope_dim(self) -> int:
        return 0  # NoPE everywhere

    def _indexer(self) -> KPoolIndexer | None:
        """The first full indexer (every one has the same sizes), None without DSA layers."""
        return next((layer.self_attn.indexer for layer in self.layers if layer.full_indexer), None)

    def selection_width(self) -> int | None:
        """K of the DSA op (None without DSA layers)."""
        indexer = self._indexer()
        return None if indexer is None else indexer.width(self.max_seq_len)

    def dsa_block(self) -> int:
        """The selection's block size (the llvm-cpu pipeline gathers whole blocks,
        dsa-to-gather-tiles{block=...}): the k-pool, when the cache is a whole number of pools."""
        kpool = self.cfg.index_kpool
        return kpool if self.selection_width() is not None and self.max_seq_len % kpool == 0 else 0

    def state_specs(self) -> list[StateTensor]:
        c, t, specs = self.cfg, self.max_seq_len, []
        for i, layer in enumerate(self.layers):
            if layer.is_kda:
                conv, rec = layer.self_attn.state_shapes()
                specs += [
                    StateTensor(f"conv_tail.{i}", "conv_tail", i, conv),
                    StateTensor(f"kda_state.{i}", "kda_state", i, rec),
                ]
                continue
            specs.append(StateTensor(f"kv_cache.{i}", "mla_latent", i, (t, c.kv_lora_rank + c.qk_rope_head_dim)))
            if layer.full_indexer:
                keys, pools = layer.self_attn.indexer.state_shapes(t)
                specs += [
                    StateTensor(f"index_keys.{i}", "indexer_keys", i, keys),
                    StateTensor(f"index_pools.{i}", "indexer_pools", i, pools),
                ]
        return specs

    def positions_per_row(self, spec: StateTensor) -> int:
        return self.cfg.index_kpool if spec.kind == "indexer_pools" else 1

    def step(
        self,
        ids: Tensor,
        start: Tensor,
        *state: Tensor,
        features: Tensor | None = None,
        feature_rows: Tensor | None = None,
        trace: list | None = None,
    ) -> tuple[Tensor, ...]:
        """Run ids [S] at positions start..start+S-1 over the state; returns (logits [S, V], *state).
        features [N, hidden], feature_rows [S]: image features replacing the placeholder rows'
        embeddings (a prefill; mix_features). trace: a list that receives (layer, selection) for
        every DSA layer (tests)."""
        positions = start + torch.arange(ids.shape[0], dtype=torch.int64)  # [S]
        view = dense_view(positions, self.max_seq_len)
        return self._run(ids, view, state, trace, features=features, feature_rows=feature_rows)

    def _run(
        self,
        ids: Tensor,
        view: CacheView,
        state,
        trace: list | None = None,
        last: bool = False,
        features: Tensor | None = None,
        feature_rows: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        state = list(state)
        lm = self.model.language_model
        x = lm.embed_tokens.weight.index_select(0, ids).float()  # [S, hidden]
        x = self.mix_features(x, features, feature_rows)
        h = x[:, None, :].expand(-1, self.cfg.hc_mult, -1)  # [S, N, hidden]
        indexer = self._indexer()
        pools = indexer.selected_pools(self.max_seq_len) if indexer is not None else 0
        selected, at = None, 0
        for i, layer in enumerate(lm.layers):
            n = layer.state_count()
            h, selected, *state[at : at + n] = layer(h, view, selected, pools, *state[at : at + n])
            if trace is not None and selected is not None:
                trace.append((i, selected))
            at += n
        h = lm.norm((h[-1:] if last else h).mean(1))
        head = lm.embed_tokens if self.lm_head is None else self.lm_head
        return (h @ head.weight.float().T, *state)
