"""gpt_oss eager parity against transformers on tiny random MXFP4 checkpoints, teacher-forced
over a prefill and 16 decode steps; multi-turn continuation; the sliding window; export.

Oracle: GptOssForCausalLM.from_pretrained(dir, quantization_config=Mxfp4Config(dequantize=True),
dtype=float32, attn_implementation="eager", experts_implementation="eager") on CPU: the MXFP4
experts are dequantized exactly, so our packed path must agree to float32 rounding.
"""

import json

import pytest
import torch

from day0.models.config import ConfigError

TOL = 1e-4
DECODE_STEPS = 16
# Every config: sliding_window 8 < the test sequence (prompt + 16 decode steps), swiglu_limit 1
# so the clamp is reached on ~10-20% of the expert activations (TINY_CONFIG).
CONFIGS = {
    # 2 layers (sliding, full), 4 experts, default rope.
    "base": dict(overrides=dict(), seed=1, prompt=8),
    # hidden 96, 8 experts, 3 layers (sliding, full, sliding).
    "wide": dict(overrides=dict(hidden_size=96, intermediate_size=96, num_local_experts=8,
                                num_hidden_layers=3), seed=2, prompt=12),
    # 4 layers, 8 experts, YaRN rope shaped like the released gpt-oss config.
    "yarn": dict(overrides=dict(intermediate_size=32, num_local_experts=8, num_hidden_layers=4,
                                rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=8.0,
                                                     original_max_position_embeddings=32,
                                                     beta_fast=32.0, beta_slow=1.0, truncate=False)),
                 seed=3, prompt=10),
}
MAX_SEQ_LEN = 48


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from day0.models.gpt_oss_checkpoint import write_tiny_gpt_oss_checkpoint

    root, made = tmp_path_factory.mktemp("gpt_oss"), {}

    def get(name, mxfp4=True):
        key = (name, mxfp4)
        if key not in made:
            spec = CONFIGS[name]
            made[key] = write_tiny_gpt_oss_checkpoint(root / f"{name}-{'mxfp4' if mxfp4 else 'f32'}",
                                                      spec["overrides"], spec["seed"], mxfp4=mxfp4)
        return made[key]

    return get


def reference(path):
    """transformers' model for a checkpoint dir, float32, eager attention and experts."""
    from transformers import GptOssForCausalLM, Mxfp4Config

    quantized = "quantization_config" in json.loads((path / "config.json").read_text())
    extra = {"quantization_config": Mxfp4Config(dequantize=True)} if quantized else {}
    return GptOssForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                             experts_implementation="eager", **extra).eval()


def sequence(name, vocab=128):
    g = torch.Generator().manual_seed(100 + len(name))
    return torch.randint(0, vocab, (CONFIGS[name]["prompt"] + DECODE_STEPS,), generator=g)


def expected(path, ids):
    with torch.no_grad():
        return reference(path)(ids[None], use_cache=False).logits[0]


def rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max()).item()


def run_turns(model, ids, turns):
    """Feed ids in consecutive chunks of the given lengths (1 = a decode step); logits [S, V]."""
    state, rows, t = model.empty_state(), [], 0
    with torch.no_grad():
        for n in turns:
            logits, *state = model.step(ids[t : t + n], torch.tensor([t]), *state)
            rows.append(logits)
            t += n
    return torch.cat(rows)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_eager_matches_transformers(name, checkpoint):
    from day0.models.registry import build_eager

    path, ids, p = checkpoint(name), sequence(name), CONFIGS[name]["prompt"]
    model = build_eager(path, MAX_SEQ_LEN)
    got = run_turns(model, ids, [p] + [1] * DECODE_STEPS)
    assert rel_err(got, expected(path, ids)) < TOL


@pytest.mark.parametrize("name", ["base", "yarn"])
def test_multi_turn_equals_one_forward(name, checkpoint):
    """prefill, decode, prefill again, decode == one forward over the concatenation."""
    from day0.models.registry import build_eager

    path, ids = checkpoint(name), sequence(name)
    model = build_eager(path, MAX_SEQ_LEN)
    got = run_turns(model, ids, [5, 1, 1, 1, 9] + [1] * 7)  # 24 positions, 3 past the window
    assert rel_err(got, expected(path, ids)[: len(got)]) < TOL


def test_sliding_window_matters(checkpoint):
    """Dropping the window changes exactly the positions that see past it (here: ≥ 8)."""
    from day0.models.registry import build_eager

    path, ids = checkpoint("base"), sequence("base")
    model = build_eager(path, MAX_SEQ_LEN)
    window = model.cfg.sliding_window
    assert window < len(ids) and model.windows == [window, 0]
    with_window = run_turns(model, ids, [len(ids)])
    model.windows = [0] * len(model.windows)
    without = run_turns(model, ids, [len(ids)])
    assert rel_err(without[:window], with_window[:window]) < 1e-6
    assert rel_err(without[window:], with_window[window:]) > 1e-2


def test_unquantized_checkpoint_matches_transformers(checkpoint):
    from day0.models.gpt_oss import DenseExperts
    from day0.models.registry import build_eager

    path, ids, p = checkpoint("base", mxfp4=False), sequence("base"), CONFIGS["base"]["prompt"]
    model = build_eager(path, MAX_SEQ_LEN)
    assert isinstance(model.model.layers[0].mlp.experts, DenseExperts)
    got = run_turns(model, ids, [p] + [1] * DECODE_STEPS)
    assert rel_err(got, expected(path, ids)) < TOL


def test_parameters_are_the_checkpoint_tensors(checkpoint):
    """state_dict keys == safetensors keys; MXFP4 blocks/scales stay uint8 in their file shapes."""
    from day0.models.checkpoint import Checkpoint
    from day0.models.registry import build_eager

    path = checkpoint("wide")
    model, ckpt = build_eager(path, MAX_SEQ_LEN), Checkpoint.open(path)
    params = dict(model.named_parameters())
    assert set(params) == set(ckpt.tensors)
    cfg = model.cfg
    e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    experts = "model.layers.2.mlp.experts."
    for name, shape in [("gate_up_proj_blocks", (e, 2 * i, h // 32, 16)),
                        ("gate_up_proj_scales", (e, 2 * i, h // 32)),
                        ("down_proj_blocks", (e, h, i // 32, 16)), ("down_proj_scales", (e, h, i // 32))]:
        p = params[experts + name]
        assert p.dtype == torch.uint8 and tuple(p.shape) == shape and not p.requires_grad
    assert model.selection_width() is None
    assert [s.shape for s in model.state_specs()] == [(MAX_SEQ_LEN, 2, 16)] * (2 * cfg.num_hidden_layers)


def test_export_keeps_mxfp4_ops_and_packed_parameters(checkpoint):
    from day0.frontend.export import export_model
    from day0.models.registry import build_eager

    model = build_eager(checkpoint("base"), 32)
    exported = export_model(model, 32)
    mlir = exported.mlir
    layers, funcs = model.cfg.num_hidden_layers, 2  # prefill + decode
    assert mlir.count('torch.operator "torch.day0.mxfp4_moe"') == 2 * layers * funcs  # gate_up + down
    for i in range(layers):
        for name in ("gate_up_proj_blocks", "gate_up_proj_scales", "down_proj_blocks", "down_proj_scales"):
            key = f"model.layers.{i}.mlp.experts.{name}"
            assert f'torch.operator "torch.day0.parameter"() {{day0.key = "{key}"}}' in mlir
            assert key in exported.parameters
    assert set(exported.parameters) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("change, field", [
    (dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "rope_parameters.rope_type"),
    (dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types"),
    (dict(quantization_config=dict(quant_method="fp8")), "quantization_config.quant_method"),
    (dict(quantization_config=dict(modules_to_not_convert=[])), "quantization_config.quant_method"),
    (dict(quantization_config=dict(quant_method="mxfp4"), hidden_size=80), "hidden_size"),
])
def test_unsupported_configs_are_rejected(change, field):
    from day0.models.gpt_oss import parse_config
    from day0.models.gpt_oss_checkpoint import tiny_gpt_oss_config

    base = tiny_gpt_oss_config().to_dict()
    parse_config(base)  # the base config itself is fine
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        parse_config({**base, **change})
