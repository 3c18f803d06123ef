"""kimi_linear (models/kimi_linear.py) against transformers' KimiLinearForCausalLM on the tiny
checkpoints of tests/parity_configs.py (written by save_pretrained): teacher-forced logits over a
prefill and 16 decode steps, multi-turn continuation, KDA's chunked prefill against its
recurrence, config errors; and the compiled artifact (llvm-cpu) on prompts of any length."""

import json

import numpy as np
import pytest
import torch
from parity_configs import DECODE_STEPS, PARITY, rel_err, sequence

TOL = 1e-3
KIMI = sorted(n for n in PARITY if PARITY[n]["arch"] == "kimi_linear")


def _expected(reference, name):
    ref = reference(name)
    ids = sequence(name, ref.config.vocab_size)
    with torch.no_grad():
        return ids, ref(ids[None], use_cache=False).logits[0]


def _model(checkpoint, name):
    from day0.models.registry import build_eager

    return build_eager(checkpoint(name), PARITY[name]["max_seq_len"])


def _run(model, ids, turns):
    """Logits of ids fed as consecutive calls of the given lengths (1 = a decode step)."""
    state, rows, at = model.empty_state(), [], 0
    with torch.no_grad():
        for n in turns:
            logits, *state = model.step(ids[at : at + n], torch.tensor([at]), *state)
            rows.append(logits)
            at += n
    return torch.cat(rows), state


def test_configs_mix_both_layer_kinds(reference):
    for name in KIMI:
        kinds = set(reference(name).config.layer_types)
        assert kinds == {"linear_attention", "full_attention"}, name
        assert PARITY[name]["prompt"] + DECODE_STEPS > 64  # longer than one KDA chunk


@pytest.mark.parametrize("name", KIMI)
def test_eager_matches_transformers(name, reference, checkpoint):
    ids, want = _expected(reference, name)
    got, _ = _run(_model(checkpoint, name), ids, [PARITY[name]["prompt"]] + [1] * DECODE_STEPS)
    assert rel_err(got, want) < TOL


@pytest.mark.parametrize("name", KIMI)
def test_multi_turn_equals_one_forward(name, reference, checkpoint):
    """prefill, decodes, a second prefill, decodes == transformers' one forward; the turns cut
    the sequence inside KDA chunks."""
    ids, want = _expected(reference, name)
    a, b = 37, PARITY[name]["prompt"]
    got, _ = _run(_model(checkpoint, name), ids, [a, 1, 1, 1, b - a - 3, 1, 1, 1])
    assert rel_err(got, want[: b + 3]) < TOL


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize("name", ["kl-base", "kl-hybrid"])
def test_chunked_prefill_equals_recurrence(name, chunk, checkpoint):
    """One prefill (KDA chunked, chunks of `chunk`) == the same tokens one decode step at a time
    (KDA recurrence): logits and every state tensor."""
    model = _model(checkpoint, name)
    for layer in model.model.layers:
        if layer.is_kda:
            layer.self_attn.chunk = chunk
    ids = sequence(name, model.cfg.vocab_size)[: PARITY[name]["prompt"]]
    chunked, chunked_state = _run(model, ids, [len(ids)])
    recurrent, recurrent_state = _run(model, ids, [1] * len(ids))
    assert rel_err(chunked, recurrent) < 1e-4
    for spec, a, b in zip(model.state_specs(), chunked_state, recurrent_state):
        assert rel_err(a, b) < 1e-4, spec.name


def _moonshot_layout(src, dst):
    """The checkpoint `src` as Moonshot publishes it: the dense MLP named `mlp`, and a config.json
    with first_k_dense_replace and linear_attn_config instead of the per-layer lists."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    dense = [i for i, t in enumerate(cfg.pop("mlp_layer_types")) if t == "dense"]
    assert dense == [0]
    cfg.pop("layer_types")
    cfg["first_k_dense_replace"] = 1
    dst.mkdir()
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    prefix = "model.layers.0.block_sparse_moe."
    save_file(
        {k.replace(prefix, "model.layers.0.mlp.") if k.startswith(prefix) else k: v for k, v in tensors.items()},
        dst / "model.safetensors",
        metadata={"format": "pt"},
    )
    return dst


def test_moonshot_checkpoint_names(reference, checkpoint, workdir):
    """A checkpoint with Moonshot's own names (dense MLP `mlp.*`) loads and gives the same logits;
    transformers loads it too (the oracle for both layouts is the same model)."""
    from transformers import KimiLinearForCausalLM

    from day0.models.registry import build_eager

    name = "kl-base"
    path = workdir / "ckpt-kl-base-moonshot"
    if not path.exists():
        _moonshot_layout(checkpoint(name), path)
    ids, want = _expected(reference, name)
    model = build_eager(path, PARITY[name]["max_seq_len"])
    assert "model.layers.0.mlp.gate_proj.weight" in dict(model.named_parameters())
    got, _ = _run(model, ids, [PARITY[name]["prompt"]] + [1] * DECODE_STEPS)
    assert rel_err(got, want) < TOL
    ref = KimiLinearForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        assert rel_err(ref(ids[None], use_cache=False).logits[0], want) < 1e-6


def test_state_specs(checkpoint):
    model = _model(checkpoint, "kl-mla-first")
    c, t = model.cfg, model.max_seq_len
    d = c.linear_num_heads * c.linear_head_dim
    got = [(s.name, s.kind, s.layer, s.shape) for s in model.state_specs()]
    assert got == [
        ("kv_cache.0", "mla_latent", 0, (t, c.kv_lora_rank + c.qk_rope_head_dim)),
        ("conv_tail.1", "conv_tail", 1, (3 * d, c.linear_conv_kernel_dim - 1)),
        ("kda_state.1", "kda_state", 1, (c.linear_num_heads, c.linear_head_dim, c.linear_head_dim)),
        ("conv_tail.2", "conv_tail", 2, (3 * d, c.linear_conv_kernel_dim - 1)),
        ("kda_state.2", "kda_state", 2, (c.linear_num_heads, c.linear_head_dim, c.linear_head_dim)),
    ]
    assert not hasattr(model, "rope_cos_hi")  # NoPE: no rope table


def test_kl_mxfp4_experts_stay_packed(checkpoint, tmp_path):
    """kl-mxfp4 (`day0 quantize --layout compressed-tensors`, Kimi K3's layout): the routed experts
    are written and read as packed u8 under Moonshot's names (experts.{e}.w1/w2/w3.weight_packed,
    .weight_scale); shared experts, router and dense MLP stay as stored; dequantize_checkpoint
    gives back w1/w2/w3.weight."""
    from day0.models.checkpoint import Checkpoint
    from day0.models.kimi_linear import KimiMxfp4Experts
    from day0.models.quantize import dequantize_checkpoint

    ckpt, model = Checkpoint.open(checkpoint("kl-mxfp4")), _model(checkpoint, "kl-mxfp4")
    params = dict(model.named_parameters())
    assert set(params) == set(ckpt.tensors)
    e = "model.layers.0.block_sparse_moe.experts.0."
    for w, shape in (("w1", (32, 64)), ("w3", (32, 64)), ("w2", (64, 32))):  # [out, in], hidden 64, I 32
        assert params[e + w + ".weight_packed"].shape == (shape[0], shape[1] // 2)
        assert params[e + w + ".weight_scale"].shape == (shape[0], shape[1] // 32)
        assert params[e + w + ".weight_packed"].dtype == params[e + w + ".weight_scale"].dtype == torch.uint8
        assert e + w + ".weight" not in params
    assert isinstance(model.model.layers[0].block_sparse_moe.experts, KimiMxfp4Experts)
    assert "model.layers.0.block_sparse_moe.shared_experts.gate_proj.weight" in params
    assert "model.layers.1.block_sparse_moe.gate_proj.weight" in params  # the dense MLP
    dequantized = Checkpoint.open(dequantize_checkpoint(checkpoint("kl-mxfp4"), tmp_path / "f32"))
    assert dequantized.tensors[e + "w2.weight"].shape == (64, 32)
    assert not any(n.endswith(("weight_packed", "weight_scale")) for n in dequantized.tensors)


DROP = object()  # a change that removes the field
BAD_CONFIGS = [
    ({"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types", "sliding_attention"),
    ({"layer_types": ["linear_attention"]}, "layer_types", "one entry per layer"),
    (
        {
            "layer_types": DROP,
            "linear_attn_config": {
                "head_dim": 8,
                "num_heads": 4,
                "short_conv_kernel_size": 4,
                "kda_layers": [1],
                "full_attn_layers": [],
            },
        },
        "linear_attn_config",
        r"layers \[2\] .* neither",
    ),
    (
        {
            "layer_types": DROP,
            "linear_attn_config": {
                "head_dim": 8,
                "num_heads": 4,
                "short_conv_kernel_size": 4,
                "kda_layers": [0, 1],
                "full_attn_layers": [2],
            },
        },
        "linear_attn_config",
        "1-based",
    ),
    ({"mla_use_nope": False}, "mla_use_nope", "NoPE"),
    ({"moe_router_activation_func": "softmax"}, "moe_router_activation_func", "only sigmoid"),
    ({"mlp_layer_types": ["dense", "moe"]}, "mlp_layer_types", "moe"),
    ({"hidden_act": "gelu"}, "hidden_act", "only silu"),
    ({"num_key_value_heads": 2}, "num_key_value_heads", "MLA"),
    (
        {
            "linear_conv_kernel_dim": 1,
            "linear_attn_config": {
                "head_dim": 8,
                "num_heads": 4,
                "short_conv_kernel_size": 1,
                "kda_layers": [1],
                "full_attn_layers": [2],
            },
        },
        "linear_attn_config.short_conv_kernel_size",
        "at least 2",
    ),
    ({"num_expert_group": 3}, "num_expert_group", "divide"),
    ({"num_experts_per_token": 9}, "num_experts_per_token", "must be in"),
    # MXFP4 experts in the compressed-tensors layout load (kl-mxfp4); any other quantization does not
    (
        {"quantization_config": {"quant_method": "fp8"}},
        "quantization_config.quant_method",
        "unsupported quant_method 'fp8'.*kimi_linear supports only compressed-tensors mxfp4",
    ),
    (
        {"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}},
        "quantization_config.format",
        "nvfp4-pack-quantized",
    ),
    (
        {"quantization_config": {"quant_method": "mxfp4"}},
        "quantization_config",
        "'mxfp4' experts are not supported for kimi_linear",
    ),
]


@pytest.mark.parametrize("change,field,why", BAD_CONFIGS, ids=[b[1] + "-" + b[2][:12] for b in BAD_CONFIGS])
def test_config_errors_name_the_field(change, field, why, checkpoint):
    from day0.models.config import ConfigError
    from day0.models.registry import architecture

    raw = json.loads((checkpoint("kl-base") / "config.json").read_text())
    architecture(raw)  # the checkpoint's own config is accepted
    with pytest.raises(ConfigError, match=rf"field '{field}'.*{why}"):
        architecture({k: v for k, v in {**raw, **change}.items() if v is not DROP})


def test_compiled_multi_turn_any_length(reference, artifact):
    """The artifact: a first prompt shorter than one chunk, decodes, a prompt crossing a chunk
    boundary, decodes == one forward; then a prompt of odd length after reset."""
    from day0.runtime.session import Session

    name = "kl-base"
    ids, want = _expected(reference, name)
    b = PARITY[name]["prompt"]
    s = Session.load(artifact(name))
    rows = [s.prefill(ids[:5].numpy())]
    rows += [s.decode(int(ids[t]))[None] for t in range(5, 8)]
    rows.append(s.prefill(ids[8:b].numpy()))
    rows += [s.decode(int(ids[t]))[None] for t in range(b, b + 3)]
    assert rel_err(np.concatenate(rows), want[: b + 3]) < TOL
    s.reset()
    assert rel_err(s.prefill(ids[:67].numpy()), want[:67]) < TOL
