"""The tiny random checkpoints every parity test runs on, and transformers' oracle for each.

Each entry: the architecture, config overrides, a seed, shards, the DSA tile, max_seq_len, the
prompt length, and the expert format ("f32", or MXFP4 via `day0 quantize` in the layout named).
DeepSeek entries avoid indexer ties (tools/checkpoints/demo.py); top-k is smaller than the
prompts, prompts are longer than one DSA tile, and one checkpoint has several shards.
gpt_oss entries use a sliding window of 8 < the test sequences and clamp-reaching activations.
kimi_linear entries mix KDA and MLA layers in different orders; their sequences are longer than
one KDA chunk (64), with prompts that end inside a chunk and one that ends on a chunk boundary;
one has MXFP4 routed experts (compressed-tensors, `day0 quantize`).
glm5_next entries mix KDA and DSA layers, each with a "shared" indexer layer right after a full
one, k-pools of 2–8 tokens, index_topk far below the sequences (> one KDA chunk), hc_mult 2–4 mHC
streams; one has MXFP4 routed experts (compressed-tensors, `day0 quantize`). Their tie-breaking
init is in tools/checkpoints/glm5_next.py (test_glm5_next checks the pool-score margin).
"""

import json
from pathlib import Path

import torch

DECODE_STEPS = 16

_DS_SPARSE = dict(index_topk=8, num_hidden_layers=2)
_DS_TILES = dict(index_topk=24, num_hidden_layers=2, hidden_size=96)
_DS_SHARDED = dict(
    index_topk=12, num_hidden_layers=3, n_group=4, topk_group=2, n_routed_experts=8, num_experts_per_tok=3
)
_OSS_YARN = dict(
    intermediate_size=32,
    num_local_experts=8,
    num_hidden_layers=4,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=8.0,
        original_max_position_embeddings=32,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
    ),
)

_KL_HYBRID = dict(
    hidden_size=48,
    num_hidden_layers=4,
    q_lora_rank=16,
    n_group=2,
    topk_group=1,
    num_experts_per_tok=3,
    linear_attn_config={
        "head_dim": 8,
        "num_heads": 4,
        "short_conv_kernel_size": 4,
        "kda_layers": [1, 2, 3],
        "full_attn_layers": [4],
    },
)
_KL_MLA_FIRST = dict(
    hidden_size=64,
    num_hidden_layers=3,
    n_shared_experts=2,
    kv_lora_rank=32,
    mlp_layer_types=["sparse", "dense", "sparse"],
    linear_attn_config={
        "head_dim": 16,
        "num_heads": 4,
        "short_conv_kernel_size": 3,
        "kda_layers": [2, 3],
        "full_attn_layers": [1],
    },
)
# kl-mla-first with MXFP4 routed experts: their hidden (64) and intermediate (32) sizes, the
# quantized `in` axes, are multiples of 32
_KL_MXFP4 = dict(_KL_MLA_FIRST, moe_intermediate_size=32)

_GLM_BASE: dict = {}  # tools/checkpoints/glm5_next.TINY_TEXT: KDA, DSA full, DSA shared; kpool 4, top 8
_GLM_DSA_FIRST = dict(
    hidden_size=64,
    hc_mult=4,
    hc_sinkhorn_iters=4,
    index_topk=16,
    index_kpool=8,
    layer_types=["indexed_attention", "indexed_attention", "linear_attention"],
    indexer_types=["full", "shared", "full"],
    mlp_layer_types=["sparse", "dense", "sparse"],
    n_group=2,
    topk_group=1,
    num_experts_per_tok=3,
    linear_conv_kernel_dim=3,
    n_shared_experts=2,
)
_GLM_MXFP4 = dict(
    hidden_size=64,
    num_hidden_layers=4,
    hc_mult=3,
    hc_sinkhorn_iters=4,
    index_topk=6,
    index_kpool=2,
    layer_types=["indexed_attention", "indexed_attention", "linear_attention", "indexed_attention"],
    indexer_types=["full", "shared", "full", "full"],
    mlp_layer_types=["sparse", "sparse", "dense", "sparse"],
)

PARITY = {
    # K = 8 < prompt 20, one tile; no tokenizer (tests the --prompt error). Also the Engine's paged
    # entry points: blocks of 4 positions, batched decode steps for 1 and 3 sequences, static
    # prompt chunks of 8 (tests/test_engine.py; its dense entry points serve as the oracle).
    "ds-sparse": dict(
        arch="deepseek_v32",
        config=_DS_SPARSE,
        seed=1,
        tile=64,
        max_seq_len=64,
        prompt=20,
        tokenizer=False,
        max_batch=3,
        block_size=4,
        prefill_chunk=8,
    ),
    # K = 24 in tiles of 8, prompt 40 > K
    "ds-tiles": dict(arch="deepseek_v32", config=_DS_TILES, seed=2, tile=8, max_seq_len=96, prompt=40),
    # three layers (two MoE), group-limited routing over 4 groups, many shards.
    "ds-sharded": dict(
        arch="deepseek_v32", config=_DS_SHARDED, seed=3, shard="40KB", tile=4, max_seq_len=64, prompt=24
    ),
    # the same three with their routed experts quantized by `day0 quantize --layout compressed-tensors`
    "ds-sparse-mxfp4": dict(
        arch="deepseek_v32", config=_DS_SPARSE, seed=1, tile=64, max_seq_len=64, prompt=20, experts="compressed-tensors"
    ),
    # (ds-tiles-mxfp4: prompts of 16+ tokens run as static chunks of 16, the cuda-sm90 form; the
    # 40-token prompt: 0-16, 16-32, then 24-40 re-running 24-32)
    "ds-tiles-mxfp4": dict(
        arch="deepseek_v32",
        config=_DS_TILES,
        seed=2,
        tile=8,
        max_seq_len=96,
        prompt=40,
        experts="compressed-tensors",
        prefill_chunk=16,
    ),
    "ds-sharded-mxfp4": dict(
        arch="deepseek_v32",
        config=_DS_SHARDED,
        seed=3,
        shard="40KB",
        tile=4,
        max_seq_len=64,
        prompt=24,
        experts="compressed-tensors",
    ),
    # gpt-oss MXFP4 checkpoints (gpt-oss layout): 2 layers / 4 experts (also paged, as ds-sparse);
    # hidden 96, 8 experts, 3 layers; 4 layers with YaRN rope shaped like the released config.
    "oss-base": dict(
        arch="gpt_oss",
        config={},
        seed=1,
        max_seq_len=48,
        prompt=8,
        experts="gpt-oss",
        max_batch=3,
        block_size=4,
        prefill_chunk=8,
    ),
    "oss-wide": dict(
        arch="gpt_oss",
        config=dict(hidden_size=96, intermediate_size=96, num_local_experts=8, num_hidden_layers=3),
        seed=2,
        max_seq_len=48,
        prompt=12,
        experts="gpt-oss",
    ),
    "oss-yarn": dict(arch="gpt_oss", config=_OSS_YARN, seed=3, max_seq_len=48, prompt=10, experts="gpt-oss"),
    # kimi_linear (f32): KDA + MLA, 2 layers; 3:1 with a q LoRA and grouped routing, 4 layers (prompt
    # of 2 chunks + 2); MLA first, conv kernel 3, two shared experts (prompt of exactly one chunk).
    # kl-base and glm-base also have the Engine's paged entry points (as ds-sparse)
    "kl-base": dict(arch="kimi_linear", config={}, seed=1, max_seq_len=96, prompt=70, max_batch=3, block_size=4),
    "kl-hybrid": dict(arch="kimi_linear", config=_KL_HYBRID, seed=2, max_seq_len=160, prompt=130),
    "kl-mla-first": dict(arch="kimi_linear", config=_KL_MLA_FIRST, seed=3, max_seq_len=96, prompt=64),
    # the same with its routed experts (w1/w2/w3) quantized by `day0 quantize --layout compressed-tensors`
    "kl-mxfp4": dict(
        arch="kimi_linear", config=_KL_MXFP4, seed=3, max_seq_len=96, prompt=67, experts="compressed-tensors"
    ),
    # glm5_next: KDA + full + shared, K = 2 pools of 4 + 3 tail slots, 2 streams, 20 Sinkhorn
    # iterations (prompt of a chunk + 6); full + shared + KDA, 4 streams, pools of 8 (prompt of
    # exactly one chunk); MXFP4 experts, 4 layers (two full indexers), 3 streams, pools of 2.
    "glm-base": dict(arch="glm5_next", config=_GLM_BASE, seed=4, max_seq_len=96, prompt=70, max_batch=3, block_size=4),
    "glm-dsa-first": dict(arch="glm5_next", config=_GLM_DSA_FIRST, seed=2, max_seq_len=96, prompt=64),
    "glm-mxfp4": dict(
        arch="glm5_next", config=_GLM_MXFP4, seed=2, max_seq_len=96, prompt=67, experts="compressed-tensors"
    ),
}


def write_checkpoint(root: Path, name: str) -> Path:
    """The checkpoint directory of a parity config (written once under root)."""
    spec = PARITY[name]
    path = root / f"ckpt-{name}"
    if path.exists():
        return path
    if spec["arch"] == "gpt_oss":
        from day0.tools.checkpoints.gpt_oss import write_tiny_gpt_oss_checkpoint

        return write_tiny_gpt_oss_checkpoint(path, spec["config"], spec["seed"], mxfp4=True)
    if spec["arch"] == "kimi_linear":
        from day0.models.quantize import quantize_checkpoint
        from day0.tools.checkpoints.kimi_linear import write_tiny_kimi_linear_checkpoint

        if spec.get("experts", "f32") == "f32":
            return write_tiny_kimi_linear_checkpoint(path, spec["config"], spec["seed"])
        dense = write_tiny_kimi_linear_checkpoint(root / f"ckpt-{name}-f32", spec["config"], spec["seed"])
        return quantize_checkpoint(dense, path, spec["experts"])
    if spec["arch"] == "glm5_next":
        from day0.models.quantize import quantize_checkpoint
        from day0.tools.checkpoints.glm5_next import write_tiny_glm5_next_checkpoint

        if spec.get("experts", "f32") == "f32":
            return write_tiny_glm5_next_checkpoint(path, spec["config"], spec["seed"])
        dense = write_tiny_glm5_next_checkpoint(root / f"ckpt-{name}-f32", spec["config"], spec["seed"])
        return quantize_checkpoint(dense, path, spec["experts"])
    from day0.models.quantize import quantize_checkpoint
    from day0.tools.checkpoints.demo import tiny_deepseek_v32_config, write_tiny_checkpoint

    cfg = tiny_deepseek_v32_config(**spec["config"])
    if spec.get("experts", "f32") == "f32":
        return write_tiny_checkpoint(
            path, cfg, spec["seed"], max_shard_size=spec.get("shard"), tokenizer=spec.get("tokenizer", True)
        )
    dense = root / f"ckpt-{name}-f32"
    write_tiny_checkpoint(dense, cfg, spec["seed"], max_shard_size=spec.get("shard"))
    return quantize_checkpoint(dense, path, spec["experts"])


def load_reference(root: Path, name: str):
    """transformers' model for a parity config, float32, eager: the oracle."""
    spec, path = PARITY[name], write_checkpoint(root, name)
    if spec["arch"] == "gpt_oss":
        from transformers import GptOssForCausalLM, Mxfp4Config

        return GptOssForCausalLM.from_pretrained(
            path,
            dtype=torch.float32,
            attn_implementation="eager",
            experts_implementation="eager",
            quantization_config=Mxfp4Config(dequantize=True),
        ).eval()
    if "quantization_config" in json.loads((path / "config.json").read_text()):
        from day0.models.quantize import dequantize_checkpoint

        dequantized = root / f"ckpt-{name}-dequantized"
        if not dequantized.exists():
            dequantize_checkpoint(path, dequantized)  # transformers holds the dequantized values
        path = dequantized
    if spec["arch"] == "kimi_linear":
        from transformers import KimiLinearForCausalLM

        return KimiLinearForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    from transformers import DeepseekV32ForCausalLM, Glm5NextForConditionalGeneration

    if spec["arch"] == "glm5_next":
        ref = Glm5NextForConditionalGeneration.from_pretrained(
            path, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        ref.config.vocab_size = ref.config.text_config.vocab_size  # (the wrapper config has none)
        return ref
    return DeepseekV32ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def sequence(name: str, vocab: int) -> torch.Tensor:
    """The test token sequence of a parity config: prompt + DECODE_STEPS tokens, seeded."""
    g = torch.Generator().manual_seed(100 + len(name))
    return torch.randint(0, vocab, (PARITY[name]["prompt"] + DECODE_STEPS,), generator=g)


def rel_err(got, want) -> float:
    """max |got − want| ÷ max |want|, in float64."""
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    return ((got - want).abs().max() / want.abs().max()).item()
