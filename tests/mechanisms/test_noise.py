"""Noise sources (dp_beam.mechanisms.noise); the half-widths are tested in test_halfwidths.py.

Statistical tolerances are 5 standard errors of the estimator, so a correct
implementation fails a seeded test never and an unseeded (secure) one with
probability below ~1e-6.
"""

import math
import pickle

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import (
    NoiseSource,
    KeyedNoise,
    SecureNoise,
    SeededNoise,
    ZeroNoise,
    make_noise,
)

# -- make_noise ----------------------------------------------------------------


def test_make_noise_none_is_keyed_production_noise():
    source = make_noise(None)
    assert isinstance(source, KeyedNoise)
    assert source.secure is True and source.exact_grid is True
    # a fresh key each time: two default sources never share noise
    assert make_noise(None).noise_key != source.noise_key


def test_make_noise_int_and_generator_are_seeded_and_share_the_generator():
    assert isinstance(make_noise(3), SeededNoise)
    assert isinstance(make_noise(np.int64(3)), SeededNoise)
    gen = np.random.default_rng(5)
    source = make_noise(gen)
    assert isinstance(source, SeededNoise)
    assert source.generator is gen
    assert source.secure is False


def test_make_noise_passes_sources_through():
    zero = ZeroNoise()
    assert make_noise(zero) is zero


@pytest.mark.parametrize("bad", [True, False, 1.5, "7", [1], object()])
def test_make_noise_rejects_other_values_naming_rng(bad):
    with pytest.raises(ValueError, match="rng"):
        make_noise(bad)


def test_seeded_noise_rejects_bad_seed():
    with pytest.raises(ValueError, match="seed_or_generator"):
        SeededNoise(True)
    with pytest.raises(ValueError, match="seed_or_generator"):
        SeededNoise("x")


# -- sources -------------------------------------------------------------------


def test_seeded_noise_is_reproducible_and_matches_numpy():
    a = SeededNoise(11).laplace(2.0, 5)
    b = SeededNoise(11).laplace(2.0, 5)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, np.random.default_rng(11).laplace(0.0, 2.0, 5))
    g = SeededNoise(11).gaussian(3.0, 4)
    np.testing.assert_array_equal(g, np.random.default_rng(11).normal(0.0, 3.0, 4))
    assert a.dtype == np.float64 and a.shape == (5,)


@pytest.mark.parametrize("source", [SecureNoise(), SeededNoise(1), ZeroNoise()])
def test_zero_scale_gives_zeros_and_negative_scale_is_rejected(source):
    np.testing.assert_array_equal(source.laplace(0.0, 3), np.zeros(3))
    np.testing.assert_array_equal(source.gaussian(0.0, 3), np.zeros(3))
    with pytest.raises(ValueError, match="scale"):
        source.laplace(-1.0, 3)
    with pytest.raises(ValueError, match="sigma"):
        source.gaussian(float("nan"), 3)
    with pytest.raises(ValueError, match="size"):
        source.laplace(1.0, -1)


@pytest.mark.parametrize("make", [lambda: SeededNoise(5), ZeroNoise])
def test_float_noise_is_the_next_call_as_python_floats(make):
    """``float_noise`` is ``laplace`` or ``gaussian`` by ``kind``, as a list of floats, and
    advances the source as they do."""
    a, b = make(), make()
    for kind, scale, size in (("laplace", 2.0, 3), ("gaussian", 0.5, 1), ("laplace", 0.0, 2),
                              ("gaussian", 1.0, 0)):
        values = a.float_noise(kind, scale, size)
        assert all(type(v) is float for v in values)
        assert values == getattr(b, kind)(scale, size).tolist()
    with pytest.raises(ValueError, match="kind"):
        a.float_noise("uniform", 1.0, 1)


def test_zero_noise_is_zero_and_not_secure():
    z = ZeroNoise()
    np.testing.assert_array_equal(z.laplace(5.0, 4), np.zeros(4))
    np.testing.assert_array_equal(z.gaussian(5.0, 4), np.zeros(4))
    assert z.secure is False


def test_base_class_has_no_sampler():
    with pytest.raises(NotImplementedError):
        NoiseSource().laplace(1.0, 2)


def _variance_tolerance(var, excess_kurtosis, n):
    # Var(sample variance) ≈ (μ4 − σ⁴)/n = σ⁴(2 + κ)/n with κ the excess
    # kurtosis (3 for Laplace, 0 for Gaussian); allow 5 standard errors.
    return 5.0 * var * math.sqrt((2.0 + excess_kurtosis) / n)


def test_secure_laplace_has_the_laplace_law():
    n, b = 20000, 1.5
    draws = SecureNoise().laplace(b, n)
    assert draws.shape == (n,) and draws.dtype == np.float64
    var = 2 * b * b
    assert abs(draws.mean()) < 5 * math.sqrt(var / n)
    assert abs(draws.var() - var) < _variance_tolerance(var, 3.0, n)
    # Unseeded: a threshold of 1e-6 keeps the false-alarm rate negligible
    # while still rejecting, e.g., a Gaussian of the same variance at n=20000.
    assert stats.kstest(draws, "laplace", args=(0.0, b)).pvalue > 1e-6


def test_secure_gaussian_has_the_normal_law():
    n, sigma = 20000, 2.5
    draws = SecureNoise().gaussian(sigma, n)
    var = sigma * sigma
    assert abs(draws.mean()) < 5 * math.sqrt(var / n)
    assert abs(draws.var() - var) < _variance_tolerance(var, 0.0, n)
    assert stats.kstest(draws, "norm", args=(0.0, sigma)).pvalue > 1e-6


def test_secure_noise_draws_fresh_values_and_caches_measurements():
    source = SecureNoise()
    a = source.laplace(1.0, 8)
    b = source.laplace(1.0, 8)
    assert not np.array_equal(a, b)
    assert len(source._cache) == 1


def test_secure_noise_pickles_without_its_cache():
    source = SecureNoise()
    source.laplace(1.0, 3)
    source.gaussian(1.0, 3)
    restored = pickle.loads(pickle.dumps(source))
    assert isinstance(restored, SecureNoise)
    assert restored._cache == {}
    assert restored.laplace(1.0, 3).shape == (3,)


def test_secure_pool_serves_every_sample_once_and_keeps_the_scale():
    # Draws cross several pool refills; a repeated value would mean a sample was
    # served twice (two nodes sharing noise). Exact ties between independent
    # continuous draws on OpenDP's fine grid have negligible probability.
    source = SecureNoise()
    draws = np.concatenate([source.laplace(2.0, 1) for _ in range(3 * SecureNoise.POOL + 7)]
                           + [source.laplace(2.0, 5) for _ in range(40)])
    assert len(np.unique(draws)) == draws.size
    # Var of Lap(2) is 8; with n ≈ 970 draws the sample variance has std
    # ≈ 8·sqrt((6 - 1)/n) ≈ 0.57 (Laplace kurtosis 6): 5 standard errors ≈ 2.9.
    assert abs(draws.var() - 8.0) < 2.9
    clone = pickle.loads(pickle.dumps(source))
    assert clone._pool == {}  # unused noise never travels with a pickled source
