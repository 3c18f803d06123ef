"""runtime/sampling.py: greedy tie rule, top-k / top-p filtering, distribution, determinism."""

import math

import numpy as np
import pytest

from day0.runtime.sampling import make_rng, probabilities, sample, validate_sampling

V = 50


def random_logits(seed=0, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(V) * scale).astype(np.float32)


def test_greedy_is_argmax():
    for seed in range(20):
        logits = random_logits(seed)
        assert sample(logits) == int(np.argmax(logits))


def test_greedy_ties_take_lowest_index():
    logits = np.zeros(V, np.float32)
    logits[[7, 3, 41]] = 5.0
    assert sample(logits, temperature=0.0) == 3
    assert sample(logits, temperature=0.7, top_k=1, rng=make_rng(0)) == 3


@pytest.mark.parametrize("temperature", [0.01, 1.0, 5.0, 100.0])
def test_top_k_1_is_greedy(temperature):
    rng = make_rng(1)
    for seed in range(10):
        logits = random_logits(seed)
        assert sample(logits, temperature=temperature, top_k=1, rng=rng) == int(np.argmax(logits))


def test_tiny_top_p_is_greedy():
    rng = make_rng(2)
    for seed in range(10):
        logits = random_logits(seed, scale=0.1)  # flat: the best id has little mass
        assert sample(logits, temperature=1.0, top_p=1e-6, rng=rng) == int(np.argmax(logits))


def test_top_k_draws_only_the_k_best():
    logits = random_logits(3, scale=0.5)  # flat, so every kept id is drawn often
    k = 5
    best = set(np.argsort(-logits)[:k].tolist())
    rng = make_rng(3)
    drawn = {sample(logits, temperature=2.0, top_k=k, rng=rng) for _ in range(3000)}
    assert drawn == best


def test_top_p_keeps_smallest_nucleus():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float64)).astype(np.float32)
    p = probabilities(logits, 1.0, top_p=0.8)  # 0.5 + 0.3 reaches 0.8: two ids
    assert np.nonzero(p)[0].tolist() == [0, 1]
    np.testing.assert_allclose(p[:2], [0.5 / 0.8, 0.3 / 0.8], rtol=1e-5)
    p = probabilities(logits, 1.0, top_p=0.81)  # needs the third
    assert np.nonzero(p)[0].tolist() == [0, 1, 2]
    rng = make_rng(4)
    assert {sample(logits, 1.0, top_p=0.8, rng=rng) for _ in range(500)} == {0, 1}


def test_top_k_then_top_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float64)).astype(np.float32)
    # top_k=2 renormalizes to [4/7, 3/7]; top_p=0.5 then keeps only id 0.
    assert np.nonzero(probabilities(logits, 1.0, top_k=2, top_p=0.5))[0].tolist() == [0]
    assert np.nonzero(probabilities(logits, 1.0, top_k=3, top_p=0.95))[0].tolist() == [0, 1, 2]


def test_distribution_matches_softmax():
    logits = random_logits(5, scale=1.0)[:8]
    expected = np.exp(logits - logits.max())
    expected /= expected.sum()
    n = 40_000
    rng = make_rng(5)
    counts = np.bincount([sample(logits, temperature=1.0, rng=rng) for _ in range(n)], minlength=8)
    chi2 = float((((counts - n * expected) ** 2) / (n * expected)).sum())
    # 7 degrees of freedom: P(chi2 > 30) ~ 1e-4 for a correct sampler; a wrong temperature
    # or an off-by-one in the CDF gives thousands.
    assert chi2 < 30, (chi2, counts, n * expected)


def test_temperature_sharpens():
    logits = random_logits(6, scale=1.0)
    hot = probabilities(logits, 10.0)
    cold = probabilities(logits, 0.1)
    assert cold.max() > hot.max()
    assert abs(hot.sum() - 1) < 1e-12 and abs(cold.sum() - 1) < 1e-12


def test_seed_determinism():
    logits = random_logits(7, scale=1.0)

    def draw(seed):
        rng = make_rng(seed)
        return [sample(logits, 0.8, 10, 0.9, rng=rng) for _ in range(200)]

    assert draw(123) == draw(123)
    assert draw(123) != draw(124)


def test_large_logits_and_tiny_temperature_are_safe():
    logits = np.array([1e30, -1e30, 3e38, 3e38 - 1e32, -np.inf], np.float32)
    p = probabilities(logits, 1.0)
    assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-12
    assert sample(logits, temperature=1e-30, rng=make_rng(0)) in (2, 3)
    assert sample(np.array([0.0, 1.0, -np.inf], np.float32), temperature=1.0, rng=make_rng(0)) in (0, 1)


def test_bad_logits_raise():
    with pytest.raises(ValueError, match="logits"):
        sample(np.array([0.0, np.nan], np.float32), temperature=1.0)
    with pytest.raises(ValueError, match="logits"):
        sample(np.zeros((2, 3), np.float32))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature="1"), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
        (dict(top_p=math.nan), "top_p"),
    ],
)
def test_invalid_parameters_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        validate_sampling(**kwargs)
    with pytest.raises(ValueError, match=name):
        sample(np.zeros(4, np.float32), **kwargs)


def test_valid_parameters_pass():
    validate_sampling(0.0, 0, 1.0)
    validate_sampling(1.5, np.int64(4), 0.3)
