"""Small layers shared by every architecture: RMSNorm, projections, the RoPE table, rotary
application, MLP.

All of them compute in float32 whatever the checkpoint's storage dtype: a weight stored in bf16
is read as a bf16 parameter and cast where it is used, so the vmfb never holds a converted copy.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """y = x · rsqrt(mean(x²) + eps) · weight, over the last dim."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x = x.float()
        return self.weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def one_token(n) -> bool:
    """Whether a row count is the static 1 of a one-token step (a decode step of one sequence),
    where a model takes forms that pay only at one row; a dynamic count (a SymInt while
    exporting) is not, whatever its value."""
    return isinstance(n, int) and n == 1


def linear(x: Tensor, layer: nn.Linear) -> Tensor:
    """x @ Wᵀ (+ b) in float32; W stays [out, in] (N×K), the layout IREE's matvec reads best."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x, layer.weight.float(), bias)


def linears(
    x: Tensor, *projections: nn.Module | Tensor | tuple[nn.Module, ...], scales: tuple[float, ...] | None = None
) -> tuple[Tensor, ...]:
    """(x @ W1ᵀ (+ b1), x @ W2ᵀ (+ b2), ...) for projections of the same x (modules with a
    `weight` [out, in] and optionally a `bias`, or a bare weight parameter [out, in]), as ONE
    matmul over the weights concatenated by rows, its columns split back. A decode step then launches one matvec where it launched one
    per projection (docs/perf.md, launches). A tuple of modules is one projection: its output is
    theirs side by side (transformers' q, k and v of a KDA layer: one [S, 3·H·K] block).

    The cat reads parameters only, so hoist-parameter-stacks computes it once into a global and
    IREE keeps only that global: the parameters it reads are loaded in its initializer alone, and
    the fused weight costs no memory beyond the separate ones. Each output column is the same dot
    product as before. Weights that differ in dtype, or of which only some have a bias, are
    multiplied one by one.

    `scales`: a factor per projection, applied to its columns by one elementwise product over
    the fused result, which IREE fuses into the matmul's dispatch (a factor applied to one
    projection's slice would be a dispatch of its own)."""
    groups = [p if isinstance(p, tuple) else (p,) for p in projections]
    layers = [m for g in groups for m in g]
    weights = [m if isinstance(m, Tensor) else m.weight for m in layers]
    biases = [None if isinstance(m, Tensor) else getattr(m, "bias", None) for m in layers]
    factors = scales or (1.0,) * len(groups)
    sizes = [sum(m.shape[0] if isinstance(m, Tensor) else m.weight.shape[0] for m in g) for g in groups]
    dtypes = {t.dtype for t in weights + [b for b in biases if b is not None]}
    if len(layers) == 1 or len({b is None for b in biases}) > 1 or len(dtypes) > 1:
        outs = iter([F.linear(x, w.float(), None if b is None else b.float()) for w, b in zip(weights, biases)])
        parts = [torch.cat([next(outs) for _ in g], -1) if len(g) > 1 else next(outs) for g in groups]
        return tuple(o if f == 1.0 else o * f for o, f in zip(parts, factors, strict=True))
    bias = None if biases[0] is None else torch.cat(biases).float()
    y = F.linear(x, torch.cat(weights).float(), bias)
    if any(f != 1.0 for f in factors):
        y = y * torch.cat([torch.full((n,), float(f)) for n, f in zip(sizes, factors, strict=True)])
    return tuple(y.split(sizes, dim=-1))


def swiglu(gate: Tensor, up: Tensor, limit: float | None = None) -> Tensor:
    """silu(gate) · up; with a `limit` (GLM-5's swiglu_limit) gate is clamped to at most limit
    and up to [-limit, limit] first."""
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.silu(gate) * up


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) · up(x)), optionally clamped (`swiglu`).
    Checkpoint names gate/up/down_proj, with biases when `bias` (the vision tower's)."""

    def __init__(self, hidden: int, intermediate: int, limit: float | None = None, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.limit = limit

    def forward(self, x: Tensor) -> Tensor:
        return self.from_gate(x, linear(x, self.gate_proj))

    def from_gate(self, x: Tensor, gate: Tensor) -> Tensor:
        """The output for x whose gate projection `gate` [S, I] the caller computed (with its other
        projections of x: layers.linears). gate and up stay two matvecs, not one over [gate; up]:
        swiglu then fuses into the second, where a fused product's halves need a dispatch of
        their own (docs/perf.md, launches)."""
        return linear(swiglu(gate, linear(x, self.up_proj), self.limit), self.down_proj)


def rope_tables(inv_freq: Tensor, max_positions: int, attention_scaling: float) -> dict[str, Tensor]:
    """cos and sin of every position below max_positions as two small float32 tables each,
    computed in float64: position p = hi·L + lo (L = 2^⌈bits/2⌉) is the angle sum

        cos(p) = cos(hi·L)·cos(lo) − sin(hi·L)·sin(lo),  sin(p) = sin(hi·L)·cos(lo) + cos(hi·L)·sin(lo)

    (rope_at), attention_scaling folded into the hi tables. 2·(H + L) rows instead of one table of
    max_positions rows: a 1M-position artifact carries 0.5 MB of tables, not 256 MB, and the
    values stay within ~2 float32 ulps of the float64 ones. IREE's CPU cos/sin lose precision at
    large arguments (≈4e-4 off at position 32K), which is why the graph looks angles up rather
    than computing them.
    """
    bits = max(int(max_positions - 1).bit_length(), 1)
    lo = 1 << -(-bits // 2)
    hi = -(-max_positions // lo)
    freq = inv_freq.double()[None, :]
    coarse = torch.arange(hi, dtype=torch.float64)[:, None] * lo * freq
    fine = torch.arange(lo, dtype=torch.float64)[:, None] * freq
    return {
        "rope_cos_hi": (coarse.cos() * attention_scaling).float(),
        "rope_sin_hi": (coarse.sin() * attention_scaling).float(),
        "rope_cos_lo": fine.cos().float(),
        "rope_sin_lo": fine.sin().float(),
    }


def rope_at(tables, positions: Tensor) -> tuple[Tensor, Tensor]:
    """cos, sin [S, dim/2] at positions [S] from rope_tables' tables (a module holding them as
    attributes)."""
    lo = tables.rope_cos_lo.shape[0]
    hi_i, lo_i = torch.div(positions, lo, rounding_mode="floor"), torch.remainder(positions, lo)
    ch, sh = tables.rope_cos_hi.index_select(0, hi_i), tables.rope_sin_hi.index_select(0, hi_i)
    cl, sl = tables.rope_cos_lo.index_select(0, lo_i), tables.rope_sin_lo.index_select(0, lo_i)
    return ch * cl - sh * sl, sh * cl + ch * sl


def _rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """(x1, x2) -> (x1·c − x2·s, x2·c + x1·s) for halves x1, x2 of x's last dim, as one elementwise
    expression: x·[c, c] + [x2, x1]·[−s, s], the swapped halves a flip of a [2, d/2] view. A
    torch.cat of the two halves costs IREE copies (flow.tensor.update) and a dispatch of their own;
    this form fuses into one dispatch with its neighbours."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    c = torch.stack([cos, cos], -2)  # [..., 2, d/2]
    s = torch.stack([-sin, sin], -2)
    halves = x.unflatten(-1, (2, -1))
    return (halves * c + halves.flip(-2) * s).flatten(-2)


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Llama-style (non-interleaved) rope: halves (x1, x2) -> (x1·c − x2·s, x2·c + x1·s)."""
    return _rotate_halves(x, cos, sin)


def rope_columns(x: Tensor, cos: Tensor, sin: Tensor, start: int, width: int, interleaved: bool) -> Tensor:
    """x [S, ..., d] with its columns [start, start + width) rotated and every other column
    unchanged, bit for bit what a torch.cat of the rotated part and the rest gives. cos, sin:
    [S, width/2]. `interleaved`: DeepSeek's rope on pairs (x0, x1), (x2, x3)…, emitted
    de-interleaved [evens', odds'] (q and k get the same permutation, so their dot products
    equal the interleaved form's); else `rotate_half_split`'s halves.

    Written as one elementwise expression over x: each output column reads its source and its
    partner column through a constant index (and its frequency's cos/sin the same way). IREE
    fuses such gathers into the producer's dispatch, where the slices and the cat were copies
    and dispatches of their own in every decode step (docs/perf.md, launches)."""
    inside, rotated = _rope_at(x, cos, sin, start, width, interleaved, torch.arange(x.shape[-1]))
    return torch.where(inside, rotated, x)  # x itself, not through an identity gather: IREE
    # fails to distribute a reduction's consumer that gathers the reduced tensor at its own index


def rope_gather(
    x: Tensor, cos: Tensor, sin: Tensor, start: int, width: int, interleaved: bool, columns: Tensor
) -> Tensor:
    """`rope_columns(x, ...)[..., columns]` (columns: a constant int64 index [n]) as the same one
    elementwise expression, each output column reading its sources in x directly: a caller can
    place rotated columns anywhere in a tensor it assembles without a slice or a cat."""
    inside, rotated = _rope_at(x, cos, sin, start, width, interleaved, columns)
    return torch.where(inside, rotated, x.index_select(-1, columns))


def _rope_at(
    x: Tensor, cos: Tensor, sin: Tensor, start: int, width: int, interleaved: bool, columns: Tensor
) -> tuple[Tensor, Tensor]:
    """(whether each of `columns` [n] is rotated, x's rotated value there [S, ..., n])."""
    half = width // 2
    j = columns
    inside = (j >= start) & (j < start + width)
    k = (j - start).clamp(0, width - 1)  # the column within the rotated part
    m, first = k % half, k < half  # its frequency, and whether it is in the first half
    if interleaved:  # pairs (2m, 2m+1): the first half takes the evens, the second the odds
        src, partner = start + 2 * m + (~first).long(), start + 2 * m + first.long()
    else:
        src, partner = start + k, start + torch.where(first, k + half, k - half)
    src, partner = torch.where(inside, src, j), torch.where(inside, partner, j)
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (j.shape[0],)
    c = cos.index_select(-1, m).reshape(shape)
    s = torch.where(first, -sin.index_select(-1, m), sin.index_select(-1, m)).reshape(shape)
    return inside, x.index_select(-1, src) * c + x.index_select(-1, partner) * s


def yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
