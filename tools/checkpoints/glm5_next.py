"""Tiny random GLM-5.3-Flash checkpoints for tests: transformers' Glm5NextForConditionalGeneration
(text config as given, a one-block vision tower the text model never reads) with random weights,
written by save_pretrained (which stores the checkpoint names: q/k/v_conv1d, A_log, hc_attn_fn,
experts.{e}.gate_proj ...).

Random init is tweaked so that every feature matters and no selection hangs on a tie:
initializer_range 0.1 (0.02 leaves the logits nearly flat); a random MoE e_score_correction_bias
(transformers zeroes it); random gated-norm weights; random k-pool compression (transformers'
zeros/ones make every pool a plain mean); random mHC base and scale (zeros/ones); and the DSA
indexer tweaks of tools/checkpoints/demo.py: a positive LayerNorm bias on the indexer keys and
larger query/weight projections, so pool scores are away from the ReLU kink and well apart.
`pool_selection_margin` measures the smallest top-k gap of the pool scores on a sequence.
"""

from __future__ import annotations

from pathlib import Path

import torch

from day0.tools.checkpoints.common import float32_config, write_seeded
from day0.tools.checkpoints.demo import INDEXER_K_NORM_BIAS, INDEXER_WEIGHT_SCALE

TINY_TEXT: dict = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_rope_head_dim=0,
    qk_nope_head_dim=8,
    v_head_dim=8,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    index_topk=8,
    index_head_dim=16,
    index_n_heads=8,
    index_kpool=4,
    layer_types=["linear_attention", "indexed_attention", "indexed_attention"],
    indexer_types=["full", "full", "shared"],
    mlp_layer_types=["dense", "sparse", "sparse"],
    linear_head_dim=8,
    linear_num_heads=4,
    hc_mult=2,
    hc_sinkhorn_iters=6,  # (20 in the release: the same code, unrolled; 6 keeps export short)
    swiglu_limit=1.0,  # small enough that the clamp is reached with these weights
    initializer_range=0.1,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
# The small model of `make bench` and `make bench-gpu` (tools/bench/bench_glm5.py, tools/bench/bench_gpu_glm5.py):
# 4 layers (KDA, DSA full, DSA shared, KDA), hidden 256, 16 experts top-4, k-pool 8, top-64.
BENCH_SMALL: dict = dict(
    vocab_size=1024,
    hidden_size=256,
    intermediate_size=512,
    moe_intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
    q_lora_rank=128,
    kv_lora_rank=64,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_routed_experts=16,
    num_experts_per_tok=4,
    index_topk=64,
    index_head_dim=32,
    index_n_heads=8,
    index_kpool=8,
    layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention"],
    indexer_types=["full", "full", "shared", "full"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    linear_head_dim=32,
    linear_num_heads=8,
    hc_mult=2,
)
TINY_VISION: dict = dict(
    depth=1, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32, projection_intermediate_size=32
)

ROUTER_BIAS_STD = 0.05
NORM_STD = 0.2


def tiny_glm5_next_config(**overrides):
    from transformers import Glm5NextConfig

    return float32_config(Glm5NextConfig, text_config={**TINY_TEXT, **overrides}, vision_config=TINY_VISION)


@torch.no_grad()
def _tweak(model) -> None:
    for module in model.modules():
        name = type(module).__name__
        if name == "Glm5NextTextTopkRouter":
            module.e_score_correction_bias.normal_(0.0, ROUTER_BIAS_STD)
        elif name == "Glm5NextTextRMSNormGated":
            module.weight.normal_(1.0, NORM_STD)
        elif name == "Glm5NextTextIndexer":
            module.k_norm.bias.fill_(INDEXER_K_NORM_BIAS)
            module.wq_b.weight.mul_(INDEXER_WEIGHT_SCALE)
            module.weights_proj.weight.mul_(INDEXER_WEIGHT_SCALE)
            module.index_kpool_compress_ape.normal_(0.0, 1.0)
            module.index_kpool_compress_gate.normal_(0.0, 0.5)
        elif name == "Glm5NextTextHyperConnection":
            module.base.normal_(0.0, 0.5)
            module.scale.uniform_(0.5, 1.5)
            module.fn.normal_(0.0, 0.5)


def write_tiny_glm5_next_checkpoint(path, config_overrides: dict | None = None, seed: int = 0) -> Path:
    """Write a random Glm5NextForConditionalGeneration (float32) to the directory `path`."""
    from transformers import Glm5NextForConditionalGeneration

    config = tiny_glm5_next_config(**(config_overrides or {}))
    return write_seeded(path, Glm5NextForConditionalGeneration, config, seed, _tweak)


@torch.no_grad()
def pool_selection_margin(model, ids: torch.Tensor) -> float:
    """Smallest relative gap between the k-th and (k+1)-th pool score over every full-indexer
    layer and query of day0's eager `model` (models/glm5_next.py) on one prefill of `ids` [S]
    (k = index_topk / kpool; only queries with more than k complete pools count; inf if none).
    The selection is the same in transformers' form wherever this is above float noise."""
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
        model.step(ids, torch.tensor([0]), *model.empty_state())
    finally:
        for indexer, _ in hooks:
            del indexer.pool_scores  # back to the class method
    return margin
