"""Tiny random gpt-oss checkpoints for tests: transformers' GptOssForCausalLM, saved with
save_pretrained, then (mxfp4=True) its experts quantized into the gpt-oss MXFP4 layout

    model.layers.{i}.mlp.experts.gate_up_proj_blocks  u8  [E, 2I, H/32, 16]
    model.layers.{i}.mlp.experts.gate_up_proj_scales  u8  [E, 2I, H/32]
    model.layers.{i}.mlp.experts.gate_up_proj_bias    f32 [E, 2I]
    model.layers.{i}.mlp.experts.down_proj_blocks     u8  [E, H, I/32, 16]
    model.layers.{i}.mlp.experts.down_proj_scales     u8  [E, H, I/32]
    model.layers.{i}.mlp.experts.down_proj_bias       f32 [E, H]

with `quantization_config: {"quant_method": "mxfp4", ...}` in config.json, the way the released
gpt-oss checkpoints store them (quantized by day0.models.quantize.quantize_checkpoint).
transformers reads it back with Mxfp4Config(dequantize=True), which makes it the oracle for our
packed path (the dequantized values are exact in f32).

Random init is tweaked so that every feature matters in a test: initializer_range 0.1 with
swiglu_limit 1 (the SwiGLU clamp is reached on ~10-20% of the expert activations), random expert
biases (transformers initializes them to zero) and O(1) attention sinks (std 1 instead of 0.02).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from day0.tools.checkpoints.common import tiny_config, write_seeded

TINY_CONFIG: dict = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    sliding_window=8,
    max_position_embeddings=256,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    initializer_range=0.1,
    swiglu_limit=1.0,
    tie_word_embeddings=False,
)
# Post-init changes (common.apply_inits): random expert biases, O(1) attention sinks.
INITS = {
    "GptOssExperts": {"gate_up_proj_bias": ("normal_", 0.0, 0.1), "down_proj_bias": ("normal_", 0.0, 0.1)},
    "GptOssAttention": {"sinks": ("normal_", 0.0, 1.0)},
}


def tiny_gpt_oss_config(**overrides):
    """A GptOssConfig from TINY_CONFIG with `overrides` applied (float32)."""
    return tiny_config("GptOssConfig", TINY_CONFIG, overrides)


def write_tiny_gpt_oss_checkpoint(
    path, config_overrides: dict | None = None, seed: int = 0, mxfp4: bool = True
) -> Path:
    """Write a random GptOssForCausalLM (float32) to the directory `path`; with `mxfp4` its
    experts are stored MXFP4-quantized in the gpt-oss layout (see the module docstring)."""
    from day0.models.quantize import quantize_checkpoint

    config = tiny_gpt_oss_config(**(config_overrides or {}))
    if not mxfp4:
        return write_seeded(path, "GptOssForCausalLM", config, seed, INITS)
    path = Path(path)
    with tempfile.TemporaryDirectory(prefix="gpt-oss-bf16-") as tmp:
        write_seeded(tmp, "GptOssForCausalLM", config, seed, INITS)
        quantize_checkpoint(tmp, path, layout="gpt-oss")
    return path
