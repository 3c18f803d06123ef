"""Tiny random Kimi-Linear checkpoints for tests: transformers' KimiLinearForCausalLM with random
weights, written by save_pretrained (which stores Moonshot's names: block_sparse_moe, experts.{e}.
w1/w2/w3, q/k/v_conv1d, self_attn.f_a_proj ...).

Random init is tweaked so that every feature matters in a test: initializer_range 0.1 (transformers'
0.02 leaves the logits nearly flat), a random MoE `e_score_correction_bias` (transformers zeroes
it; it then decides the choice, not the weights) and random gated-norm weights (ones by default).
transformers' own init already draws the KDA decay (A_log, dt_bias) spread over its useful range.
"""

from __future__ import annotations

from pathlib import Path

from day0.tools.checkpoints.common import tiny_config, write_seeded

TINY_CONFIG: dict = dict(
    vocab_size=128,
    hidden_size=32,
    intermediate_size=64,  # dense MLP (first_k_dense_replace layers)
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    q_lora_rank=None,
    kv_lora_rank=16,
    qk_rope_head_dim=8,  # kept, never rotated (NoPE)
    qk_nope_head_dim=8,
    v_head_dim=8,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    linear_attn_config={
        "head_dim": 8,
        "num_heads": 4,
        "short_conv_kernel_size": 4,
        "kda_layers": [1],
        "full_attn_layers": [2],
    },
    initializer_range=0.1,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
    tie_word_embeddings=False,
)
# Post-init changes (common.apply_inits): a random MoE score-correction bias, random gated-norm weights.
INITS = {
    "KimiLinearTopkRouter": {"e_score_correction_bias": ("normal_", 0.0, 0.1)},
    "KimiLinearRMSNormGated": {"weight": ("normal_", 1.0, 0.2)},
}


def tiny_kimi_linear_config(**overrides):
    """A KimiLinearConfig from TINY_CONFIG with `overrides` applied (float32)."""
    return tiny_config("KimiLinearConfig", TINY_CONFIG, overrides)


def write_tiny_kimi_linear_checkpoint(path, config_overrides: dict | None = None, seed: int = 0) -> Path:
    """Write a random KimiLinearForCausalLM (float32) to the directory `path`."""
    config = tiny_kimi_linear_config(**(config_overrides or {}))
    return write_seeded(path, "KimiLinearForCausalLM", config, seed, INITS)
