"""MXFP4 in numpy (models/mxfp4.py): the E2M1 table, round-to-nearest-even with saturation, the
spec's scale per block, nibble order against the torch reference, and every rejection."""

import ml_dtypes
import numpy as np
import pytest
import torch

from day0.frontend.ops import E2M1_VALUES, mxfp4_dequantize
from day0.models import mxfp4
from day0.models.mxfp4 import Mxfp4Error, check_pair, check_scales, dequantize, quantize


def block(*values, fill=0.0):
    """One row of 32: `values` first, then `fill`."""
    row = np.full(32, fill, np.float32)
    row[: len(values)] = values
    return row[None]


def codes_of(packed):
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def test_e2m1_table_is_ml_dtypes_float4_e2m1fn():
    assert E2M1_VALUES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
    decoded = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(decoded, np.array(E2M1_VALUES, np.float32))
    assert np.array_equal(np.signbit(decoded), np.arange(16) >= 8)  # codes 8.. are negative, -0 too


def test_round_trip_is_exact_on_representable_values():
    rng = np.random.default_rng(0)
    lut = np.array(E2M1_VALUES, np.float32)
    codes = rng.integers(0, 16, (6, 4, 128))
    codes[..., ::32] = 7  # a 6 in every block pins the scale to the block's exponent
    exps = rng.integers(-127, 126, (6, 4, 4))
    w = np.ldexp(lut[codes], np.repeat(exps, 32, axis=-1)).astype(np.float32)
    packed, scales = quantize(w)
    assert packed.shape == (6, 4, 64) and scales.shape == (6, 4, 4)
    assert packed.dtype == scales.dtype == np.uint8
    assert np.array_equal(scales, exps + 127)
    out = dequantize(packed, scales)
    assert out.dtype == np.float32 and np.array_equal(out, w)
    assert np.array_equal(np.signbit(out), np.signbit(w))  # -0 stays -0


def test_bf16_input():
    w = (np.arange(64, dtype=np.float32) / 8 - 4).reshape(2, 32)
    packed, scales = quantize(w.astype(ml_dtypes.bfloat16))
    assert np.array_equal(dequantize(packed, scales), dequantize(*quantize(w)))


# Scale 2^0 (a 4 in the block, so floor(log2 4) - 2 = 0): elements round on the E2M1 grid itself.
@pytest.mark.parametrize(
    "x, want",
    [
        (0.25, 0.0),  # tie 0 | 0.5 -> even mantissa 0
        (0.26, 0.5),
        (0.75, 1.0),  # tie 0.5 | 1 -> 1 (even); [0.75, 1) must not become 0 (IREE truncf does)
        (0.8, 1.0),
        (0.99, 1.0),
        (1.25, 1.0),  # tie 1 | 1.5 -> 1
        (1.75, 2.0),  # tie 1.5 | 2 -> 2
        (2.5, 2.0),  # tie 2 | 3 -> 2
        (3.5, 4.0),  # tie 3 | 4 -> 4
        (5.0, 4.0),  # tie 4 | 6 -> 4
        (5.01, 6.0),
        (-0.75, -1.0),
        (-5.0, -4.0),
    ],
)
def test_round_to_nearest_even(x, want):
    out = dequantize(*quantize(block(4.0, x)))
    assert out[0, 1] == want


def test_saturation_to_six():
    # max 7.5: floor(log2 7.5) - 2 = 0, so the scale is 1 and 7.5 (and 6.5) saturate to 6.
    packed, scales = quantize(block(7.5, -7.5, 6.5, 6.0))
    assert scales[0, 0] == 127
    assert list(dequantize(packed, scales)[0, :4]) == [6.0, -6.0, 6.0, 6.0]


@pytest.mark.parametrize(
    "amax, x",
    [
        (1.0, -2),
        (0.99, -3),
        (6.0, 0),
        (7.99, 0),
        (8.0, 1),
        (3 * 2.0**100, 99),
        (2.0**-120, -122),
        (2.0**-125, -127),
        (2.0**-130, -127),  # clamped at E8M0's minimum
        (2.0**-140, -127),  # a float32 subnormal
        (3.0e38, 125),
    ],
)
def test_scale_is_the_spec_formula(amax, x):
    """X = floor(log2(max|v|)) - emax(E2M1)=2, clamped to [-127, 127]; byte = X + 127."""
    packed, scales = quantize(block(0.1 * amax, -amax, 0.5 * amax))
    assert scales[0, 0] == x + 127
    assert x == max(-127, int(np.floor(np.log2(np.float64(amax)))) - 2)


def test_all_zero_block_gets_the_smallest_scale():
    packed, scales = quantize(np.zeros((1, 64), np.float32))
    assert list(scales[0]) == [mxfp4.ZERO_BLOCK_SCALE] * 2 == [0, 0]
    assert not packed.any()
    assert not dequantize(packed, scales).any()


def test_blocks_are_independent():
    w = np.concatenate([block(1000.0), block(0.001)], axis=-1)  # [1, 64]: two blocks
    packed, scales = quantize(w)
    assert list(scales[0]) == [9 - 2 + 127, -10 - 2 + 127]
    # 1000 / 2^7 = 7.8 saturates to 6 (the spec's scale leaves [6, 8) to saturation): 768;
    # 0.001 / 2^-12 = 4.1 -> 4: 2^-10
    assert list(dequantize(packed, scales)[0, [0, 32]]) == [768.0, 2.0**-10]


def test_nibble_order_low_nibble_is_even_element():
    packed, scales = quantize(block(1.0, -6.0, 0.5, 4.0))
    assert packed[0, 0] == 0x02 | (0x0F << 4)  # element 0 = 1.0 (code 2) low, element 1 = -6 high
    assert packed[0, 1] == 0x01 | (0x06 << 4)


def test_matches_the_torch_reference_dequantize():
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((3, 8, 96)) * np.exp(rng.uniform(-20, 20, (3, 8, 1)))).astype(np.float32)
    packed, scales = quantize(w)
    ours = dequantize(packed, scales)
    theirs = mxfp4_dequantize(torch.from_numpy(packed), torch.from_numpy(scales)).numpy()
    assert np.array_equal(ours, theirs)
    # codes through ml_dtypes directly: same rounding as ours, element by element
    direct = (
        np.ldexp(w.reshape(3, 8, 3, 32), -(scales.astype(np.int32) - 127)[..., None])
        .astype(ml_dtypes.float4_e2m1fn)
        .view(np.uint8)
        & 0x0F
    ).reshape(3, 8, 96)
    assert np.array_equal(codes_of(packed), direct)
    # error bound: half the widest E2M1 gap (4 -> 6) is 1, saturation of [6, 8) costs up to 2
    unit = np.ldexp(1.0, scales.astype(np.int32) - 127).repeat(32, axis=-1)
    assert (np.abs(ours - w) <= 2 * unit).all()


def test_scale_ff_is_rejected():
    packed, scales = quantize(np.ones((2, 64), np.float32))
    scales[1, 1] = 0xFF
    with pytest.raises(Mxfp4Error, match=r"tensor layer.w: scale byte 0xFF .* at index \(1, 1\)"):
        dequantize(packed, scales, "layer.w")
    with pytest.raises(Mxfp4Error, match="tensor s: scale byte 0xFF"):
        check_scales("s", scales)


def test_k_not_multiple_of_32_names_the_tensor():
    with pytest.raises(Mxfp4Error, match=r"tensor experts.0.w1: shape \(4, 48\).*multiple of 32"):
        quantize(np.ones((4, 48), np.float32), "experts.0.w1")


def test_non_finite_is_rejected():
    with pytest.raises(Mxfp4Error, match="tensor w: holds NaN or inf"):
        quantize(block(np.inf), "w")


def test_shape_disagreement_names_both_tensors():
    assert check_pair("a.weight_packed", (8, 32), "a.weight_scale", (8, 2)) == 64
    assert check_pair("x_blocks", (4, 8, 2, 16), "x_scales", (4, 8, 2), K_expected=64) == 64
    with pytest.raises(
        Mxfp4Error,
        match=r"a.weight_packed \(shape \(8, 32\)\) and a.weight_scale "
        r"\(shape \(8, 3\)\) disagree",
    ):
        check_pair("a.weight_packed", (8, 32), "a.weight_scale", (8, 3))
    with pytest.raises(
        Mxfp4Error,
        match=r"x_blocks \(shape \(4, 8, 2, 16\)\) and x_scales "
        r"\(shape \(4, 9, 2\)\) disagree",
    ):
        check_pair("x_blocks", (4, 8, 2, 16), "x_scales", (4, 9, 2))
    with pytest.raises(Mxfp4Error, match="leading dimensions"):
        check_pair("p", (8, 32), "s", (7, 2))
    with pytest.raises(Mxfp4Error, match="the model expects K = 128"):
        check_pair("p", (8, 32), "s", (8, 2), K_expected=128)
    with pytest.raises(Mxfp4Error, match="disagree"):
        dequantize(np.zeros((8, 32), np.uint8), np.zeros((8, 1), np.uint8))


def test_gpt_oss_layout_is_a_reshape():
    packed, scales = quantize(np.arange(3 * 5 * 64, dtype=np.float32).reshape(3, 5, 64))
    blocks = mxfp4.packed_to_gpt_oss_blocks(packed)
    assert blocks.shape == (3, 5, 2, 16)
    assert np.array_equal(blocks[:, :, 1], packed[:, :, 16:])
    assert np.array_equal(mxfp4.gpt_oss_blocks_to_packed(blocks), packed)


def test_quant_method_of():
    assert mxfp4.quant_method_of({}) is None
    assert mxfp4.quant_method_of({"quantization_config": mxfp4.gpt_oss_quantization_config()}) == "mxfp4"
    ct = mxfp4.compressed_tensors_quantization_config(ignore=["lm_head"])
    assert mxfp4.quant_method_of({"quantization_config": ct}) == "compressed-tensors-mxfp4"
    assert mxfp4.quant_method_of({"text_config": {"quantization_config": ct}}) == "compressed-tensors-mxfp4"
    assert ct["ignore"] == ["lm_head"] and ct["config_groups"]["group_0"]["weights"]["group_size"] == 32


@pytest.mark.parametrize(
    "qc, field",
    [
        ({"quant_method": "fp8", "fmt": "e4m3"}, "quantization_config.quant_method"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "quantization_config.format"),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "mixed-precision",
                "config_groups": {"g": {"format": "float-quantized"}},
            },
            "quantization_config.config_groups.g.format",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "mxfp4-pack-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 8}}},
            },
            "quantization_config.config_groups.g.weights.num_bits",
        ),
    ],
)
def test_unknown_quantization_is_rejected_naming_the_field(qc, field):
    with pytest.raises(Mxfp4Error, match=f"config.json: field '{field}'"):
        mxfp4.quant_method_of({"quantization_config": qc})
