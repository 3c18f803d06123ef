"""Choosing the next token from one row of logits (numpy, host side).

    sample(logits, temperature, top_k, top_p, rng) -> token id

temperature == 0 is greedy: argmax, the lowest id among equal maxima (the same tie rule as
day0's top-k everywhere). Otherwise p = softmax(logits / temperature), restricted to the
top_k most likely ids (0 = no limit), then to the nucleus: the smallest set of most likely
ids whose probability sums to >= top_p (never empty), renormalized, and drawn with `rng`.
Same logits, parameters and seed -> same token.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def validate_sampling(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> None:
    """Raise ValueError naming the parameter and its allowed range when one is out of range."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not (0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def make_rng(seed: int | None = None) -> np.random.Generator:
    """The generator `sample` draws from; None seeds from the OS."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
        raise ValueError(f"seed must be an integer >= 0 (or None), got {seed!r}")
    return np.random.default_rng(seed)


def greedy(logits: np.ndarray) -> int:
    """argmax; np.argmax returns the first (lowest) index among equal maxima."""
    return int(np.argmax(logits))


def probabilities(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The distribution `sample` draws from: [vocab] float64, zero outside the kept ids."""
    x = np.asarray(logits, dtype=np.float64)  # [V]
    # Shift before dividing: logits / 1e-30 would overflow, (logits - max) / 1e-30 only underflows.
    z = (x - x.max()) / temperature
    if not top_k and top_p >= 1.0:
        p = np.exp(z)  # no filtering, so no sort (its cost: docs/perf.md, 'Sampling on the host')
        return p / p.sum()
    order = np.argsort(-z, kind="stable")  # most likely first, lower id first among equals
    if top_k:
        order = order[:top_k]
    kept = z[order]
    p = np.exp(kept)  # kept[0] == 0 is the max: p[0] == 1, no overflow
    p /= p.sum()
    if top_p < 1.0:
        # Smallest prefix with cumulative probability >= top_p (at least one id).
        n = int(np.searchsorted(np.cumsum(p), top_p, side="left")) + 1
        p = p[:n] / p[:n].sum()
        order = order[:n]
    out = np.zeros(z.shape, dtype=np.float64)
    out[order] = p
    return out


def sample(
    logits: np.ndarray,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    rng: np.random.Generator | None = None,
) -> int:
    """Next token id from `logits` [vocab] (any float dtype). See the module docstring."""
    validate_sampling(temperature, top_k, top_p)
    logits = np.asarray(logits)
    if logits.ndim != 1 or logits.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array [vocab], got shape {logits.shape}")
    if np.isnan(logits).any() or np.isposinf(logits).any() or np.isneginf(logits).all():
        raise ValueError("logits must be finite or -inf (masked), with at least one finite value")
    if temperature == 0 or top_k == 1:
        return greedy(logits)
    p = probabilities(logits, temperature, top_k, top_p)
    if rng is None:
        rng = make_rng()
    # Inverse CDF in id order, one uniform per call (a seed fixes the whole run). The first id
    # with cdf > u has cdf[id] > cdf[id - 1], i.e. p[id] > 0: never a filtered-out id.
    cdf = np.cumsum(p)
    u = rng.random() * cdf[-1]
    return int(np.searchsorted(cdf, u, side="right"))


def logprobs(logits: np.ndarray, token: int, top: int = 0) -> tuple[float, list[tuple[int, float]]]:
    """log-softmax of the raw logits row (the model's distribution, before temperature or
    filtering, as OpenAI-style APIs report it): the chosen `token`'s log-probability and the
    `top` most likely (id, log-probability) pairs, most likely first (lower id among equals)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    lp = x - (m + math.log(np.exp(x - m).sum()))
    best = []
    if top:
        part = np.argpartition(-lp, min(top, lp.size) - 1)[:top]
        best = [(int(i), float(lp[i])) for i in sorted(part, key=lambda i: (-lp[i], i))]
    return float(lp[token]), best
