"""The deepseek_v32 benchmark models side by side: one row per config field, one column per model.

    e2e     the 4.9B end-to-end benchmark model (tools/bench/bench_checkpoint.py --config e2e)
    tiny    the same path at tiny shapes, its CPU test (--config tiny; tests/test_bench_gpu.py)
    memory  the model of tools/bench/bench_memory.py, whose routed experts are most of its bytes

A column names only the fields its model sets (None: not set). bench_checkpoint leaves the rest at
transformers' DeepseekV32Config defaults; bench_memory takes them from the demo config
(tools/checkpoints/demo.DEMO_CONFIG), since it writes through the demo checkpoint writer.
"""

COLUMNS = ("e2e", "tiny", "memory")
FIELDS: dict[str, tuple] = {
    #                         e2e, tiny, memory
    "vocab_size": (32000, 256, 4096),
    "hidden_size": (2048, 64, 1024),
    "intermediate_size": (None, 96, 2048),
    "num_hidden_layers": (12, 2, 3),
    "num_attention_heads": (16, 4, 8),
    "num_key_value_heads": (16, 4, 8),
    "q_lora_rank": (768, 32, 256),
    "kv_lora_rank": (512, 32, 128),
    "qk_nope_head_dim": (128, 16, None),
    "qk_rope_head_dim": (64, 16, None),
    "v_head_dim": (128, 16, None),
    "n_routed_experts": (64, 8, 32),
    "num_experts_per_tok": (8, 2, 4),
    "moe_intermediate_size": (1024, 32, 512),
    "n_shared_experts": (1, 1, None),
    "first_k_dense_replace": (1, 1, 1),
    "n_group": (None, 2, 4),
    "topk_group": (None, 1, 2),
    "index_n_heads": (16, 16, None),
    "index_head_dim": (128, 32, None),
    "index_topk": (2048, 16, None),
}
# name -> the fields that model sets, in row order
CONFIGS: dict[str, dict] = {
    name: {field: values[i] for field, values in FIELDS.items() if values[i] is not None}
    for i, name in enumerate(COLUMNS)
}
