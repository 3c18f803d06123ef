"""gpt_oss specifics beyond tests/test_parity.py: eager multi-turn across the sliding window,
that the window matters, unquantized experts, parameter names and dtypes, export, bad configs.

Oracle: GptOssForCausalLM.from_pretrained(dir, quantization_config=Mxfp4Config(dequantize=True),
dtype=float32, attn_implementation="eager", experts_implementation="eager") on CPU: the MXFP4
experts are dequantized exactly, so our packed path must agree to float32 rounding.
"""

import pytest
import torch
from parity_configs import DECODE_STEPS, PARITY, rel_err, sequence

from day0.models.config import ConfigError

TOL = 1e-4
MAX_SEQ_LEN = 48


def run_turns(model, ids, turns):
    """Feed ids in consecutive chunks of the given lengths (1 = a decode step); logits [S, V]."""
    state, rows, t = model.empty_state(), [], 0
    with torch.no_grad():
        for n in turns:
            logits, *state = model.step(ids[t : t + n], torch.tensor([t]), *state)
            rows.append(logits)
            t += n
    return torch.cat(rows)


def expected(ref, ids):
    with torch.no_grad():
        return ref(ids[None], use_cache=False).logits[0]


@pytest.mark.parametrize("name", ["oss-base", "oss-yarn"])
def test_multi_turn_equals_one_forward(name, checkpoint, reference):
    """prefill, decode, prefill again, decode == one forward over the concatenation."""
    from day0.models.registry import build_eager

    ids = sequence(name, 128)
    model = build_eager(checkpoint(name), MAX_SEQ_LEN)
    got = run_turns(model, ids, [5, 1, 1, 1, 9] + [1] * 7)  # 24 positions, 3 past the window
    assert rel_err(got, expected(reference(name), ids)[: len(got)]) < TOL


def test_sliding_window_matters(checkpoint):
    """Dropping the window changes exactly the positions that see past it (here: ≥ 8)."""
    from day0.models.registry import build_eager

    ids = sequence("oss-base", 128)
    model = build_eager(checkpoint("oss-base"), MAX_SEQ_LEN)
    window = model.cfg.sliding_window
    assert window < len(ids) and model.windows == [window, 0]
    with_window = run_turns(model, ids, [len(ids)])
    model.windows = [0] * len(model.windows)
    without = run_turns(model, ids, [len(ids)])
    assert rel_err(without[:window], with_window[:window]) < 1e-6
    assert rel_err(without[window:], with_window[window:]) > 1e-2


def test_unquantized_checkpoint_matches_transformers(tmp_path):
    from transformers import GptOssForCausalLM

    from day0.models.gpt_oss import DenseExperts
    from day0.models.registry import build_eager
    from day0.tools.checkpoints.gpt_oss import write_tiny_gpt_oss_checkpoint

    spec = PARITY["oss-base"]
    path = write_tiny_gpt_oss_checkpoint(tmp_path / "f32", spec["config"], spec["seed"], mxfp4=False)
    ids, p = sequence("oss-base", 128), spec["prompt"]
    model = build_eager(path, MAX_SEQ_LEN)
    assert isinstance(model.model.layers[0].mlp.experts, DenseExperts)
    got = run_turns(model, ids, [p] + [1] * DECODE_STEPS)
    ref = GptOssForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    assert rel_err(got, expected(ref, ids)) < TOL


def test_parameters_are_the_checkpoint_tensors(checkpoint):
    """state_dict keys == safetensors keys; MXFP4 blocks/scales stay uint8 in their file shapes."""
    from day0.models.checkpoint import Checkpoint
    from day0.models.registry import build_eager

    path = checkpoint("oss-wide")
    model, ckpt = build_eager(path, MAX_SEQ_LEN), Checkpoint.open(path)
    params = dict(model.named_parameters())
    assert set(params) == set(ckpt.tensors)
    cfg = model.cfg
    e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    experts = "model.layers.2.mlp.experts."
    for name, shape in [
        ("gate_up_proj_blocks", (e, 2 * i, h // 32, 16)),
        ("gate_up_proj_scales", (e, 2 * i, h // 32)),
        ("down_proj_blocks", (e, h, i // 32, 16)),
        ("down_proj_scales", (e, h, i // 32)),
    ]:
        p = params[experts + name]
        assert p.dtype == torch.uint8 and tuple(p.shape) == shape and not p.requires_grad
    assert model.selection_width() is None
    assert [s.shape for s in model.state_specs()] == [(MAX_SEQ_LEN, 2, 16)] * (2 * cfg.num_hidden_layers)


def test_export_keeps_mxfp4_ops_and_packed_parameters(checkpoint):
    from day0.frontend.export import export_model
    from day0.models.registry import build_eager

    model = build_eager(checkpoint("oss-base"), 32)
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


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)), "rope_parameters.rope_type"),
        (dict(layer_types=["sliding_attention", "chunked_attention"]), "layer_types"),
        (dict(quantization_config=dict(quant_method="fp8")), "quantization_config.quant_method"),
        (dict(quantization_config=dict(modules_to_not_convert=[])), "quantization_config.quant_method"),
        (dict(quantization_config=dict(quant_method="mxfp4"), hidden_size=80), "hidden_size"),
    ],
)
def test_unsupported_configs_are_rejected(change, field):
    from day0.models.gpt_oss import parse_config
    from day0.tools.checkpoints.gpt_oss import tiny_gpt_oss_config

    base = tiny_gpt_oss_config().to_dict()
    parse_config(base)  # the base config itself is fine
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        parse_config({**base, **change})
