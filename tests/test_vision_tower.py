"""The GLM-5.3-Flash vision tower (models/vision.py) against transformers' Glm5NextVisionModel on a
tiny random config: features of one image, of several images in one call, of a video; the host-side
positions and segments against transformers' helpers; torch.export with a dynamic patch count; and
the errors a bad state dict, checkpoint or config gets."""

import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file
from transformers.vision_utils import get_vision_cu_seqlens, get_vision_position_ids

from day0.models.checkpoint import CheckpointError
from day0.models.config import ConfigError
from day0.models.vision import PREFIX, VisionTower, load_vision_tower, vision_inputs
from day0.runtime.images import image_buckets, pad_to_bucket

TOL = 1e-5
LIMIT = 1.5  # swiglu_limit low enough that the clamps bite on the random weights below
VISION = dict(
    depth=2,
    hidden_size=32,
    num_heads=2,
    intermediate_size=64,
    out_hidden_size=48,
    projection_intermediate_size=64,
    patch_size=14,
    temporal_patch_size=2,
    spatial_merge_size=2,
    in_channels=3,
    swiglu_limit=LIMIT,
    rope_parameters={"rope_type": "axial", "rope_theta": 10000.0},
)


def _randomized(model: torch.nn.Module, seed: int = 0) -> dict:
    """Every tensor of the state dict drawn at a scale that keeps activations O(1): norms around 1,
    biases around 0.1, weights with std 1/sqrt(fan_in) (transformers' init leaves norms at exactly
    1 and biases at 0, which would test nothing of them)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in model.state_dict().items():
        noise = torch.randn(t.shape, generator=g)
        if t.dim() == 1 and "norm" in name:
            state[name] = 1.0 + 0.3 * noise
        elif t.dim() == 1:
            state[name] = 0.1 * noise
        else:
            state[name] = noise / t[0].numel() ** 0.5
    return state


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    model = transformers.Glm5NextVisionModel(transformers.Glm5NextVisionConfig(**VISION)).eval()
    model.load_state_dict(_randomized(model))
    return model


@pytest.fixture(scope="module")
def tower(reference):
    tower = VisionTower(reference.config).eval()
    tower.load_state_dict(reference.state_dict(), strict=True)
    return tower


def _pixels(grids, seed=1) -> torch.Tensor:
    p = sum(t * h * w for t, h, w in grids)
    return torch.randn(p, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(seed))


def _inputs(grids, seed=1):
    positions, segments = vision_inputs(grids, VISION["spatial_merge_size"])
    return _pixels(grids, seed), torch.from_numpy(positions), torch.from_numpy(segments)


def _expected(reference, grids, pixels, attn="sdpa") -> torch.Tensor:
    reference.config._attn_implementation = attn
    try:
        with torch.no_grad():
            return reference(pixels, grid_thw=torch.tensor(grids)).pooler_output
    finally:
        reference.config._attn_implementation = "sdpa"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape, (got.shape, want.shape)
    return float((got - want).abs().max() / want.abs().max())


GRIDS = {
    "one image": [(1, 4, 6)],
    "two images": [(1, 2, 2), (1, 4, 4)],
    "odd grid": [(1, 6, 2)],
    "video": [(2, 2, 4)],
}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("case", sorted(GRIDS))
def test_features_match_transformers(reference, tower, case, attn):
    grids = GRIDS[case]
    pixels, positions, segments = _inputs(grids)
    want = _expected(reference, grids, pixels, attn)
    with torch.no_grad():
        got = tower(pixels, positions, segments)
    assert got.dtype == torch.float32
    assert got.shape == (sum(t * h * w for t, h, w in grids) // 4, VISION["out_hidden_size"])
    err = rel_err(got, want)
    print(f"{case} ({attn}): max |err| / max |ref| = {err:.2e}")
    assert err < TOL


def test_the_clamps_bite(reference):
    """The parity cases exercise swiglu_limit: some gate and up activations pass the limit."""
    peaks = []
    hooks = [
        m.register_forward_hook(lambda mod, args, out: peaks.append(float(out.abs().max())))
        for name, m in reference.named_modules()
        if name.endswith(("gate_proj", "up_proj"))
    ]
    try:
        grids = GRIDS["one image"]
        _expected(reference, grids, _pixels(grids))
    finally:
        for h in hooks:
            h.remove()
    assert len(peaks) == 6 and sum(p > LIMIT for p in peaks) >= 3, peaks


def test_images_are_independent(tower):
    """Two images in one call give each image's features alone: the segment mask holds."""
    grids = GRIDS["two images"]
    pixels, positions, segments = _inputs(grids)
    with torch.no_grad():
        both = tower(pixels, positions, segments)
        first = tower(pixels[:4], positions[:4], segments[:4])
        second = tower(pixels[4:], positions[4:], segments[4:] - 1)
    assert rel_err(both, torch.cat([first, second])) < TOL


@pytest.mark.parametrize("case", ["one image", "video"])
def test_padding_to_a_bucket_changes_nothing(tower, case):
    """An image padded to its encode_image bucket (runtime/images.py pad_to_bucket) has the
    features it has alone in its first rows: the padding is a segment no real patch sees."""
    pixels, positions, segments = _inputs(GRIDS[case])
    n = len(pixels)
    padded = [torch.from_numpy(a) for a in pad_to_bucket(pixels.numpy(), positions.numpy(), segments.numpy(), n + 12)]
    assert padded[0].shape[0] == n + 12 and (padded[2][n:] == segments.max() + 1).all()
    with torch.no_grad():
        alone = tower(pixels, positions, segments)
        both = tower(*padded)
    assert both.shape[0] == alone.shape[0] + 3
    assert rel_err(both[: alone.shape[0]], alone) < TOL


def test_image_buckets():
    """2^k and 3·2^(k-1) image tokens from the first holding the minimum, the maximum always
    last, in patches (merge 2: 4 a token); explicit counts sorted and capped; counts out of range
    refused."""
    assert image_buckets(16, 128, 2) == tuple(4 * t for t in (16, 24, 32, 48, 64, 96, 128))
    assert image_buckets(13, 100, 2) == tuple(4 * t for t in (16, 24, 32, 48, 64, 96, 100))
    assert image_buckets(16, 8000, 1)[-3:] == (4096, 6144, 8000) and len(image_buckets(16, 8000, 1)) == 19
    assert image_buckets(16, 10, 2) == (40,)  # a maximum below the minimum: one bucket
    assert image_buckets(16, 128, 2, tokens=(64, 16, 64)) == (64, 256, 512)
    with pytest.raises(ValueError, match=r"image bucket\(s\) \[200\] outside \[1, 128\]"):
        image_buckets(16, 128, 2, tokens=(16, 200))


@pytest.mark.parametrize("grids", [[(1, 4, 6)], [(1, 2, 2), (1, 4, 4)], [(2, 6, 2), (1, 2, 4), (3, 2, 2)]])
def test_vision_inputs_match_transformers(grids):
    positions, segments = vision_inputs(grids, 2)
    grid = torch.tensor(grids)
    assert positions.dtype == segments.dtype == np.int64
    np.testing.assert_array_equal(positions, get_vision_position_ids(grid, 2).numpy())
    # segments change exactly at transformers' attention boundaries (one segment per frame)
    cu = get_vision_cu_seqlens(grid).numpy()
    np.testing.assert_array_equal(np.flatnonzero(np.diff(segments)) + 1, cu[1:-1])
    np.testing.assert_array_equal(np.unique(segments), np.arange(len(cu) - 1))
    # a torch tensor grid gives the same
    np.testing.assert_array_equal(vision_inputs(grid, 2)[0], positions)


@pytest.mark.parametrize("grid", [[(1, 3, 4)], [(1, 4, 0)], [(0, 2, 2)], [], [(1, 2)]])
def test_vision_inputs_rejects_bad_grids(grid):
    with pytest.raises(ValueError, match="grid_thw"):
        vision_inputs(grid, 2)


def test_export_with_dynamic_patch_count(reference, tower):
    from torch.export import Dim

    pixels, positions, segments = _inputs(GRIDS["one image"])
    # export's 0/1 specialization raises q's minimum to 2 (P >= 8): a lone 2x2 image is refused by
    # the program's guard, which real inputs never meet (the image processor's minimum is 16 merged
    # tokens an image)
    p = 4 * Dim("q", min=1, max=1024)
    program = torch.export.export(
        tower,
        (pixels, positions, segments),
        dynamic_shapes={"pixel_values": {0: p}, "positions": {0: p}, "segments": {0: p}},
    )
    for case in ("two images", "video"):  # patch counts other than the traced one
        grids = GRIDS[case]
        pixels, positions, segments = _inputs(grids, seed=2)
        with torch.no_grad():
            eager = tower(pixels, positions, segments)
            exported = program.module()(pixels, positions, segments)
        assert exported.shape == eager.shape
        assert rel_err(exported, eager) < TOL
        assert rel_err(exported, _expected(reference, grids, pixels)) < TOL


def test_state_dict_errors_name_the_tensor(reference):
    tower = VisionTower(reference.config)
    state = dict(reference.state_dict())
    del state["blocks.1.attn.q_norm.weight"]
    state["downsample.weight"] = torch.zeros(48, 32, 1, 4)
    state["blocks.0.attn.rotary.weight"] = torch.zeros(3)
    with pytest.raises(CheckpointError) as e:
        tower.load_state_dict(state)
    message = str(e.value)
    assert "3 problems" in message
    assert "missing tensor blocks.1.attn.q_norm.weight (expected shape (16,))" in message
    assert "tensor downsample.weight has shape (48, 32, 1, 4), expected (48, 32, 2, 2)" in message
    assert "unexpected tensors (not used by the vision tower): blocks.0.attn.rotary.weight" in message


def _write_checkpoint(path, state: dict, vision: dict):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "glm5_next", "vision_config": vision}))
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    return path


def test_load_from_checkpoint(reference, tower, tmp_path):
    """load_vision_tower reads config.json's vision_config and the model.visual.* tensors (bf16 kept
    bf16, computed in f32), skipping the text model's; a missing one is named with its prefix."""
    state = {PREFIX + k: v for k, v in reference.state_dict().items()}
    state["model.language_model.embed_tokens.weight"] = torch.zeros(8, 4)
    state[PREFIX + "merger.proj.weight"] = state[PREFIX + "merger.proj.weight"].bfloat16()
    vision = {**VISION, "model_type": "glm5_next_vision"}
    loaded = load_vision_tower(_write_checkpoint(tmp_path / "ok", state, vision))
    assert loaded.merger.proj.weight.dtype == torch.bfloat16
    assert loaded.blocks[0].attn.qkv.weight.dtype == torch.float32
    pixels, positions, segments = _inputs(GRIDS["one image"])
    with torch.no_grad():
        want = VisionTower(reference.config)
        want.load_state_dict({k[len(PREFIX) :]: v.float() for k, v in state.items() if k.startswith(PREFIX)})
        assert rel_err(loaded(pixels, positions, segments), want(pixels, positions, segments)) < TOL

    del state[PREFIX + "blocks.0.mlp.up_proj.bias"]
    with pytest.raises(CheckpointError, match=r"missing tensor model\.visual\.blocks\.0\.mlp\.up_proj\.bias"):
        load_vision_tower(_write_checkpoint(tmp_path / "missing", state, vision))


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_act": "gelu"}, "vision_config.hidden_act"),
        ({"num_heads": 3}, "vision_config.num_heads"),
        ({"hidden_size": 24, "num_heads": 4}, "vision_config.num_heads"),  # head dim 6: not a multiple of 4
        ({"depth": 0}, "vision_config.depth"),
        ({"rms_norm_eps": float("nan")}, "vision_config.rms_norm_eps"),
        # transformers reads a "default" rope_type as axial, as the tower does; any other is refused
        (
            {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
            "vision_config.rope_parameters.rope_type",
        ),
    ],
)
def test_config_errors_name_the_field(change, field):
    with pytest.raises(ConfigError, match=f"field '{field}'"):
        VisionTower({"model_type": "glm5_next", "vision_config": {**VISION, **change}})


def test_text_only_config_has_no_tower():
    with pytest.raises(ConfigError, match="field 'vision_config'"):
        VisionTower({"model_type": "glm5_next", "text_config": {"hidden_size": 64}})


def _attention_ops(program) -> int:
    return sum(n.target is torch.ops.day0.vision_attention.default for n in program.graph.nodes)


def test_kept_attention_is_one_op_a_block(reference, tower):
    """Export for a target that keeps `vision_attention` (cuda-sm90) traces each block's attention
    as one day0::vision_attention, whose eager body is the reference: the program's features are
    the eager tower's. A head dim without a CUDA kernel entry (here 24) keeps the reference body."""
    from day0.frontend.ops import keeping
    from day0.lowering.kernel_geometry import VISION_HEAD_DIMS

    assert VISION["hidden_size"] // VISION["num_heads"] in VISION_HEAD_DIMS
    grids = GRIDS["two images"]
    pixels, positions, segments = _inputs(grids)
    with keeping({"vision_attention"}):
        program = torch.export.export(tower, (pixels, positions, segments))
    assert _attention_ops(program) == VISION["depth"]
    with torch.no_grad():
        assert rel_err(program.module()(pixels, positions, segments), tower(pixels, positions, segments)) == 0
    assert _attention_ops(torch.export.export(tower, (pixels, positions, segments))) == 0
    other = VisionTower({**VISION, "hidden_size": 48}).eval()
    with keeping({"vision_attention"}):
        assert _attention_ops(torch.export.export(other, (pixels, positions, segments))) == 0
