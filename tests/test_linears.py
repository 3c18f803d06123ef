"""models/layers.linears: projections of one x as one matmul over their concatenated weights."""

import pytest
import torch
from torch import nn

from day0.models.layers import linear, linears


def _layers(dtypes, bias=False, seed=0):
    torch.manual_seed(seed)
    out = []
    for n, dtype in zip((5, 3, 7), dtypes, strict=False):
        layer = nn.Linear(16, n, bias=bias).to(dtype)
        out.append(layer)
    return out


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_separate_ones(bias):
    layers = _layers([torch.bfloat16] * 3, bias=bias)
    x = torch.randn(4, 16)
    got = linears(x, *layers)
    assert [g.shape for g in got] == [(4, 5), (4, 3), (4, 7)]
    for g, layer in zip(got, layers, strict=True):
        torch.testing.assert_close(g, linear(x, layer), rtol=1e-6, atol=1e-6)


def test_scales_multiply_their_projection_only():
    layers = _layers([torch.float32] * 3)
    x = torch.randn(2, 16)
    got = linears(x, *layers, scales=(1.0, 0.25, 3.0))
    for g, layer, f in zip(got, layers, (1.0, 0.25, 3.0), strict=True):
        torch.testing.assert_close(g, linear(x, layer) * f, rtol=1e-6, atol=1e-6)


def test_mixed_dtypes_or_biases_fall_back_to_separate_products():
    x = torch.randn(3, 16)
    mixed = _layers([torch.bfloat16, torch.float32, torch.bfloat16])
    some_bias = _layers([torch.float32] * 2) + [nn.Linear(16, 2, bias=True)]
    for layers in (mixed, some_bias):
        got = linears(x, *layers, scales=(2.0,) * len(layers))
        for g, layer in zip(got, layers, strict=True):
            torch.testing.assert_close(g, linear(x, layer) * 2.0)


def test_a_tuple_is_one_projection_of_its_modules_side_by_side():
    a, b, c = _layers([torch.float32] * 3)
    x = torch.randn(2, 16)
    abc, cc = linears(x, (a, b, c), c, scales=(0.5, 1.0))
    torch.testing.assert_close(abc, torch.cat([linear(x, a), linear(x, b), linear(x, c)], -1) * 0.5)
    torch.testing.assert_close(cc, linear(x, c))
    mixed = nn.Linear(16, 2).to(torch.bfloat16)  # a bias and another dtype: separate products
    abc, m = linears(x, (a, b, c), mixed)
    torch.testing.assert_close(abc, torch.cat([linear(x, a), linear(x, b), linear(x, c)], -1))
    torch.testing.assert_close(m, linear(x, mixed))


def test_a_bare_weight_is_a_projection_without_bias():
    a, b, _ = _layers([torch.bfloat16] * 3)
    w = nn.Parameter(torch.randn(6, 16).to(torch.bfloat16))  # like GLM-5's index_kpool_compress_gate
    x = torch.randn(3, 16)
    got_a, got_w, got_b = linears(x, a, w, b)
    torch.testing.assert_close(got_w, x @ w.float().T, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_a, linear(x, a), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_b, linear(x, b), rtol=1e-6, atol=1e-6)
    with_bias = nn.Linear(16, 2, bias=True).to(torch.bfloat16)  # a bias on one only: separate products
    got_w, got_c = linears(x, w, with_bias)
    torch.testing.assert_close(got_w, x @ w.float().T)
    torch.testing.assert_close(got_c, linear(x, with_bias))
