"""layers.rope_columns: rope on a range of columns as one elementwise expression equals, bit for
bit, the rotated slice concatenated with the untouched columns (the form it replaced)."""

import pytest
import torch

from day0.models.layers import rope_columns, rope_gather


def _pairs(x, cos, sin):
    """DeepSeek's interleaved rope on pairs (x[2m], x[2m+1]), emitted [evens', odds']."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.cat([even * cos - odd * sin, odd * cos + even * sin], -1)


def _halves(x, cos, sin):
    first, second = x.chunk(2, -1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], -1)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("start", [0, 10, 24])
@pytest.mark.parametrize("middle", [(), (3,)])
def test_rope_columns_equals_the_concatenated_form(interleaved, start, middle):
    g = torch.Generator().manual_seed(start)
    x = torch.randn(5, *middle, 40, generator=g)
    cos, sin = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    wide = (5,) + (1,) * len(middle) + (8,)
    part = (_pairs if interleaved else _halves)(x[..., start : start + 16], cos.reshape(wide), sin.reshape(wide))
    want = torch.cat([x[..., :start], part, x[..., start + 16 :]], -1)
    got = rope_columns(x, cos, sin, start, 16, interleaved)
    assert torch.equal(got, want)
    assert not torch.equal(got, x)  # the rotation did something


@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_gather_places_the_rotated_columns_where_asked(interleaved):
    """MLA's query [q_latent | rope(q_rope)] reads its rope columns this way (SparseMLA._query)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 40, generator=g)
    cos, sin = torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)
    full = rope_columns(x, cos, sin, 24, 16, interleaved)
    columns = torch.tensor([30, 24, 39, 0, 23, 31, 24])  # any order, repeats, unrotated columns
    assert torch.equal(rope_gather(x, cos, sin, 24, 16, interleaved, columns), full[..., columns])


def test_rope_tables_hold_a_million_positions_in_small_tables():
    # the angle-sum tables (rope_tables / rope_at) against float64 cos/sin at every position
    # class of a 1M-position artifact: within ~2 float32 ulps, in 2 × (1024 + 1024) rows
    import torch

    from day0.models.layers import rope_at, rope_tables

    inv_freq = (1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)).float()
    tables = rope_tables(inv_freq, 1 << 20, 1.25)
    assert {k: tuple(v.shape) for k, v in tables.items()} == {
        "rope_cos_hi": (1024, 32),
        "rope_sin_hi": (1024, 32),
        "rope_cos_lo": (1024, 32),
        "rope_sin_lo": (1024, 32),
    }
    holder = type("Tables", (), tables)
    positions = torch.cat([torch.arange(0, 1 << 20, 1021), torch.tensor([1023, 1024, (1 << 20) - 1])])
    cos, sin = rope_at(holder, positions)
    angles = positions.double()[:, None] * inv_freq.double()[None, :]
    assert (cos.double() - 1.25 * angles.cos()).abs().max() < 3e-7
    assert (sin.double() - 1.25 * angles.sin()).abs().max() < 3e-7
    # a table of a few positions is one hi row and the rest lo rows
    small = rope_tables(inv_freq, 5, 1.0)
    assert small["rope_cos_hi"].shape[0] * small["rope_cos_lo"].shape[0] >= 5
