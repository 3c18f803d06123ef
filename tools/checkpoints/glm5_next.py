"""Tiny random GLM-5.3-Flash checkpoints for tests: transformers' Glm5NextForConditionalGeneration
(text config as given, a one-block vision tower the text model never reads) with random weights,
written by save_pretrained (which stores the checkpoint names: q/k/v_conv1d, A_log, hc_attn_fn,
experts.{e}.gate_proj ...). With `vision=True` (or a dict of vision-config overrides) the tower is
one that matters: TINY_VISION_TOWER, two blocks whose out_hidden_size is the text hidden size, its
weights randomized too (VISION_INITS), and the image/video special tokens (SPECIAL_TOKENS) moved
into the tiny vocabulary, and transformers' image processor settings for the tower's patch sizes
saved beside it (preprocessor_config.json: Glm5NextImageProcessorPil's defaults otherwise); a
text-only checkpoint is exactly what it was without the option.

Random init is tweaked so that every feature matters and no selection hangs on a tie:
initializer_range 0.1 (0.02 leaves the logits nearly flat); a random MoE e_score_correction_bias
(transformers zeroes it); random gated-norm weights; random k-pool compression (transformers'
zeros/ones make every pool a plain mean); random mHC base and scale (zeros/ones); and the DSA
indexer tweaks of tools/checkpoints/demo.py (INDEXER_INITS): a positive LayerNorm bias on the
indexer keys and larger query/weight projections, so pool scores are away from the ReLU kink and
well apart. The weight changes are the table INITS, applied by common.apply_inits.
`pool_selection_margin` measures the smallest top-k gap of the pool scores on a sequence.
"""

from __future__ import annotations

from pathlib import Path

import torch

from day0.tools.checkpoints.common import float32_config, write_seeded
from day0.tools.checkpoints.demo import INDEXER_INITS


def glm5_layers(*layers: str) -> dict:
    """layer_types, indexer_types and mlp_layer_types of a text stack given one "attention/mlp"
    string per layer: attention "kda" (linear_attention), "full" or "shared" (indexed_attention
    with its own indexer, or the one of the full layer before it); mlp "dense" or "sparse". The
    three lists then always have one entry per layer (a KDA layer's indexer entry, unused, is
    "full")."""
    attention, mlp = zip(*(layer.split("/") for layer in layers))
    return dict(
        layer_types=["linear_attention" if a == "kda" else "indexed_attention" for a in attention],
        indexer_types=["full" if a == "kda" else a for a in attention],
        mlp_layer_types=list(mlp),
    )


# The two text models side by side, one row per field. `tiny` is TINY_TEXT, the model of the
# tests (their config_overrides apply on top of it). `bench` is BENCH_SMALL, the small model of
# `make bench` and `make bench-gpu` (tools/bench/bench_glm5.py, tools/bench/bench_gpu_glm5.py),
# given as overrides of TINY_TEXT (`...`: TINY_TEXT's value): 4 layers (KDA, DSA full, DSA shared,
# KDA), hidden 256, 16 experts top-4, k-pool 8, top-64. A dict value (glm5_layers) is several fields.
_TEXT_FIELDS: dict[str, tuple] = {
    #                         tiny, bench
    "vocab_size": (128, 1024),
    "hidden_size": (32, 256),
    "intermediate_size": (64, 512),
    "moe_intermediate_size": (32, 256),
    "num_hidden_layers": (3, 4),
    "num_attention_heads": (4, 8),
    "num_key_value_heads": (4, 8),
    "q_lora_rank": (16, 128),
    "kv_lora_rank": (16, 64),
    "qk_rope_head_dim": (0, ...),
    "qk_nope_head_dim": (8, 32),
    "v_head_dim": (8, 32),
    "n_routed_experts": (8, 16),
    "num_experts_per_tok": (2, 4),
    "n_shared_experts": (1, ...),
    "index_topk": (8, 64),
    "index_head_dim": (16, 32),
    "index_n_heads": (8, 8),
    "index_kpool": (4, 8),
    "layers": (
        glm5_layers("kda/dense", "full/sparse", "shared/sparse"),
        glm5_layers("kda/dense", "full/sparse", "shared/sparse", "kda/sparse"),
    ),
    "linear_head_dim": (8, 32),
    "linear_num_heads": (4, 8),
    "hc_mult": (2, 2),
    "hc_sinkhorn_iters": (6, ...),  # (20 in the release: the same code, unrolled; 6 keeps export short)
    "swiglu_limit": (1.0, ...),  # small enough that the clamp is reached with these weights
    "initializer_range": (0.1, ...),
    "pad_token_id": (None, ...),
    "bos_token_id": (None, ...),
    "eos_token_id": (None, ...),
}


def _text_config(column: int) -> dict:
    """One column of _TEXT_FIELDS as a text config dict, in row order."""
    config: dict = {}
    for field, values in _TEXT_FIELDS.items():
        value = values[column]
        if isinstance(value, dict):
            config.update(value)
        elif value is not ...:
            config[field] = value
    return config


TINY_TEXT: dict = _text_config(0)
BENCH_SMALL: dict = _text_config(1)
TINY_VISION: dict = dict(
    depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32, projection_intermediate_size=32
)
# The tower of a checkpoint with `vision` (out_hidden_size: the text hidden size, filled in by
# tiny_glm5_next_config): two blocks of 2 heads of 16, the image processor's patch sizes (14, 2, 2
# merge), a swiglu_limit the blocks' random activations reach.
TINY_VISION_TOWER: dict = dict(
    depth=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    projection_intermediate_size=64,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
    in_channels=3,
    swiglu_limit=1.5,
    initializer_range=0.1,
)
# Special tokens of a checkpoint with `vision`: the last six ids of the vocabulary, in the release's
# order (image start/end, video start/end, ..., image, video); a test prompt draws its text from
# below them (transformers reads a placeholder inside a video span as a video token).
SPECIAL_TOKENS = (
    "image_start_token_id",
    "image_end_token_id",
    "video_start_token_id",
    "video_end_token_id",
    "image_token_id",
    "video_token_id",
)
# Post-init changes (common.apply_inits), see the module docstring.
INITS = {
    "Glm5NextTextTopkRouter": {"e_score_correction_bias": ("normal_", 0.0, 0.05)},
    "Glm5NextTextRMSNormGated": {"weight": ("normal_", 1.0, 0.2)},
    "Glm5NextTextIndexer": {
        **INDEXER_INITS,
        "index_kpool_compress_ape": ("normal_", 0.0, 1.0),
        "index_kpool_compress_gate": ("normal_", 0.0, 0.5),
    },
    "Glm5NextTextHyperConnection": {
        "base": ("normal_", 0.0, 0.5),
        "scale": ("uniform_", 0.5, 1.5),
        "fn": ("normal_", 0.0, 0.5),
    },
}

# A checkpoint with `vision` also randomizes what transformers initializes to ones and zeros in the
# tower (every RMSNorm and the merger's LayerNorm, every bias), so that each of them matters.
VISION_INITS = {
    "Glm5NextRMSNorm": {"weight": ("normal_", 1.0, 0.2)},  # the tower's norms (the text's are Glm5NextText*)
    "Glm5NextVisionPatchEmbed": {"proj.bias": ("normal_", 0.0, 0.1)},
    "Glm5NextVisionAttention": {"qkv.bias": ("normal_", 0.0, 0.1), "proj.bias": ("normal_", 0.0, 0.1)},
    "Glm5NextVisionMLP": {f"{n}.bias": ("normal_", 0.0, 0.1) for n in ("gate_proj", "up_proj", "down_proj")},
    "Glm5NextVisionModel": {"downsample.bias": ("normal_", 0.0, 0.1)},
    "Glm5NextVisionPatchMerger": {
        "post_projection_norm.weight": ("normal_", 1.0, 0.2),
        "post_projection_norm.bias": ("normal_", 0.0, 0.1),
    },
}


def special_tokens(vocab_size: int) -> dict[str, int]:
    """SPECIAL_TOKENS of a checkpoint with `vision`: the last six ids of a vocabulary of vocab_size."""
    return {name: vocab_size - len(SPECIAL_TOKENS) + i for i, name in enumerate(SPECIAL_TOKENS)}


def tiny_glm5_next_config(*, vision: bool | dict = False, **overrides):
    """A Glm5NextConfig (float32): TINY_TEXT with `overrides` applied as its text config, and
    TINY_VISION (a tower the text model never reads) or, with `vision` (True, or a dict of
    overrides of TINY_VISION_TOWER), TINY_VISION_TOWER with out_hidden_size = the text hidden size
    and the special tokens inside the vocabulary (special_tokens)."""
    text = {**TINY_TEXT, **overrides}
    if not vision:
        return float32_config("Glm5NextConfig", text_config=text, vision_config=TINY_VISION)
    tower = {
        **TINY_VISION_TOWER,
        "out_hidden_size": text["hidden_size"],
        **(vision if isinstance(vision, dict) else {}),
    }
    return float32_config("Glm5NextConfig", text_config=text, vision_config=tower, **special_tokens(text["vocab_size"]))


# The special tokens' text, in SPECIAL_TOKENS order (GLM's spelling)
SPECIAL_TEXT = (
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
)
# demo.py's role-tagged chat format, with content parts: an image part is GLM's
# <|begin_of_image|><|image|><|end_of_image|>, one placeholder the runtime expands
VISION_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# the vocabulary of a checkpoint with a tokenizer: demo.py's byte-level BPE (bytes, <bos>, <eos>,
# all its merges) and the six special tokens
TOKENIZER_VOCAB = 326


def write_vision_tokenizer(path) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja (VISION_CHAT_TEMPLATE) of a
    vocabulary of TOKENIZER_VOCAB: demo.py's byte-level tokenizer with SPECIAL_TEXT as special
    tokens at the ids special_tokens() gives them."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from day0.tools.checkpoints.demo import BOS, EOS, build_byte_tokenizer

    tok = build_byte_tokenizer(TOKENIZER_VOCAB - len(SPECIAL_TEXT))
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TEXT])
    ids = special_tokens(TOKENIZER_VOCAB)
    assert [tok.token_to_id(t) for t in SPECIAL_TEXT] == [ids[n] for n in SPECIAL_TOKENS]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS)
    fast.chat_template = VISION_CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def write_tiny_glm5_next_checkpoint(
    path, config_overrides: dict | None = None, seed: int = 0, *, vision: bool | dict = False, tokenizer: bool = False
) -> Path:
    """Write a random Glm5NextForConditionalGeneration (float32) to the directory `path`; `vision`:
    a tower that matters (tiny_glm5_next_config), randomized by VISION_INITS as well, and its
    image processor's settings (preprocessor_config.json, transformers' Glm5NextImageProcessorPil
    with the tower's patch sizes). `tokenizer` (with `vision`): a vocabulary of TOKENIZER_VOCAB
    and its tokenizer and chat template (write_vision_tokenizer)."""
    if tokenizer and not vision:
        raise ValueError("tokenizer=True needs vision=True (the tokenizer spells the image tokens)")
    if tokenizer:
        config_overrides = {**(config_overrides or {}), "vocab_size": TOKENIZER_VOCAB}
    config = tiny_glm5_next_config(vision=vision, **(config_overrides or {}))
    inits = {**INITS, **VISION_INITS} if vision else INITS
    path = write_seeded(path, "Glm5NextForConditionalGeneration", config, seed, inits)
    if vision:
        import transformers

        tower = config.vision_config
        transformers.Glm5NextImageProcessorPil(
            patch_size=tower.patch_size,
            temporal_patch_size=tower.temporal_patch_size,
            merge_size=tower.spatial_merge_size,
        ).save_pretrained(path)
    if tokenizer:
        write_vision_tokenizer(path)
    return path


@torch.no_grad()
def pool_selection_margin(model, ids: torch.Tensor, **step_kwargs) -> float:
    """Smallest relative gap between the k-th and (k+1)-th pool score over every full-indexer
    layer and query of day0's eager `model` (models/glm5_next.py) on one prefill of `ids` [S]
    (k = index_topk / kpool; only queries with more than k complete pools count; inf if none).
    The selection is the same in transformers' form wherever this is above float noise.
    `step_kwargs` go to the step (features, feature_rows: a prompt with images)."""
    from day0.models.dsa_indexer import INVISIBLE

    margin, hooks = float("inf"), []

    def record(indexer):
        original = indexer.pool_scores

        def wrapped(*args):
            nonlocal margin
            scores = original(*args)
            k = indexer.topk // indexer.kpool
            for row in scores.double():
                row = row[row > INVISIBLE]
                if row.numel() > k:
                    top = torch.topk(row, k + 1).values
                    margin = min(margin, ((top[k - 1] - top[k]) / row.abs().max().clamp_min(1e-30)).item())
            return scores

        indexer.pool_scores = wrapped
        hooks.append((indexer, original))

    for layer in model.layers:
        if layer.full_indexer:
            record(layer.self_attn.indexer)
    try:
        model.step(ids, torch.tensor([0]), *model.empty_state(), **step_kwargs)
    finally:
        for indexer, _ in hooks:
            del indexer.pool_scores  # back to the class method
    return margin
