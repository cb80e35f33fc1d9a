"""The power-of-two noise grid (dp_beam.mechanisms.noise_grid).

Every key here is fixed, so every test is deterministic: a statistical test
either always passes or always fails. Tolerances are still taken from theory
so that a correct sampler passes for all but a negligible fraction of keys:
moment checks allow 5 standard errors of the estimator (two-sided
probability ~6e-7 under a normal approximation), goodness-of-fit tests
require a p-value above 1e-6, and frequency checks use a Clopper-Pearson
interval of confidence 1 − 1e-6.
"""


from fractions import Fraction

import numpy as np
import pytest

from dp_beam.mechanisms.noise_grid import (
    GRID_PRECISION,
    grid_exponent,
    grid_float,
    grid_gaussian,
    grid_laplace,
    round_to_grid,
)
from dp_beam.mechanisms.noise_key import NoiseKey


KEY_BYTES = bytes(range(32))
KEY = NoiseKey.from_bytes(KEY_BYTES)


def _tol(std_of_estimate):
    return 5.0 * std_of_estimate


# -- the grid ----------------------------------------------------------------------


def _grid_multiple(value, k):
    q = Fraction(value) / Fraction(2) ** k
    return q.denominator == 1


def test_grid_exponent_is_floor_log2_minus_precision():
    assert GRID_PRECISION == 30
    for scale in (1e-9, 0.1, 0.75, 1.0, 1.5, 3.7, 1000.0, 2.0**40 + 0.5, 1e300):
        k = grid_exponent(scale)
        assert Fraction(2) ** 30 <= Fraction(scale) / Fraction(2) ** k < Fraction(2) ** 31
    # Subnormal scales: the grid cannot go below float64's smallest bit.
    assert grid_exponent(5e-324) == -1074
    with pytest.raises(ValueError, match="scale"):
        grid_exponent(0.0)
    with pytest.raises(ValueError, match="scale"):
        grid_exponent(float("inf"))


def test_round_to_grid_is_exact_half_to_even():
    k = grid_exponent(1.0)
    for x in (0.1, -0.1, 1 / 3, 12345.678, -2.0**-40, 0.0):
        expected = Fraction(round(Fraction(x) / Fraction(2) ** k)) * Fraction(2) ** k
        assert Fraction(round_to_grid(x, 1.0)) == expected
    assert round_to_grid(2.0**-31, 1.0) == 0.0
    assert round_to_grid(3 * 2.0**-31, 1.0) == 2.0**-29
    assert round_to_grid(-(2.0**-31), 1.0) == 0.0
    # Floats past 2^(53+k) are already on the grid.
    assert round_to_grid(2.0**60 + 2.0**8, 1.0) == 2.0**60 + 2.0**8
    arr = round_to_grid(np.array([[0.1, 2.0]]), 1.0)
    assert arr.shape == (1, 2) and arr.dtype == np.float64
    with pytest.raises(ValueError, match="x must be finite"):
        round_to_grid(float("nan"), 1.0)


@pytest.mark.parametrize("scale", [1e-3, 0.1, 1.0, 3.7, 1000.0, 5e-324])
def test_grid_noise_is_on_the_grid_and_sums_exactly(scale):
    k = grid_exponent(scale)
    stream = KEY.stream("grid", scale)
    rng = np.random.default_rng(0)
    for _ in range(200):
        for noise in (grid_laplace(stream, scale), grid_gaussian(stream, scale)):
            assert _grid_multiple(noise, k)
            # Statistics within the exactness bound |R + Z| <= 2^53 (times 2^k).
            x = float(rng.uniform(-1, 1)) * 2.0 ** (50 + k)
            r = round_to_grid(x, scale)
            assert _grid_multiple(r, k)
            assert Fraction(r + noise) == Fraction(r) + Fraction(noise)


def test_sums_past_the_bound_are_the_correctly_rounded_exact_sum():
    # Past 2^(53+k) the float sum is the exact sum correctly rounded, i.e. still
    # a function of R + Z only (post-processing of the discrete mechanism).
    scale = 1.0
    stream = KEY.stream("big")
    for x in (1e9, 3.3e12, -7.7e15):
        r = round_to_grid(x, scale)
        noise = grid_laplace(stream, scale)
        assert r + noise == float(Fraction(r) + Fraction(noise))


def test_grid_refuses_inexact_integers():
    with pytest.raises(OverflowError, match="2\\^53"):
        grid_float(2**53 + 1, -30)
    assert grid_float(2**53, -30) == 2.0**23


def test_grid_padded_scale_covers_one_grid_step_per_value():
    from dp_beam.mechanisms.noise_grid import grid_padded_scale

    for sens, ratio in [(1.0, 4.0), (0.3, 1000.0), (7.0, 2.0**-5)]:
        scale = grid_padded_scale(sens, lambda s: ratio * s)
        step = 2.0 ** grid_exponent(scale)
        # the scale pays for the sensitivity plus at least one step of its own grid
        assert scale >= ratio * (sens + step)
        assert scale <= ratio * sens * (1 + 2.0**-28 * ratio)
        spread = grid_padded_scale(sens, lambda s: ratio * s, spread=3.0)
        assert spread >= ratio * (sens + 3.0 * 2.0 ** grid_exponent(spread))


def test_round_to_grid_equals_exact_rational_rounding():
    """The float fast path of round_to_grid against exact Fraction rounding (half
    to even) on values across the float range, ties and huge/tiny magnitudes."""
    rng = np.random.default_rng(0)
    values = list(rng.standard_normal(300) * 10.0 ** rng.integers(-30, 30, 300))
    values += [2.0**-31, 3 * 2.0**-31, -5 * 2.0**-31, 1e308, -1e308, 5e-324, 2.0**60 + 2.0**8]
    for scale in (1.0, 3.7e-20, 2.5e25, 1e-300):
        k = grid_exponent(scale)
        for x in values:
            want = float(round(Fraction(x) / Fraction(2) ** k) * Fraction(2) ** k)
            assert round_to_grid(x, scale) == want


@pytest.mark.parametrize("scale", [1.0, 0.37, 3.7e-20, 2.5e25, 1e-300, 1e300, 5e-324])
def test_round_to_grid_of_an_array_has_the_bits_of_each_scalar(scale):
    # The array path works in whole-array operations; it must give every entry the bits of
    # the scalar path, signs of zero and the values kept past 2^(53+k) included.
    rng = np.random.default_rng(4)
    values = np.concatenate([
        rng.standard_normal(401) * 10.0 ** rng.integers(-300, 300, 401),
        [0.0, -0.0, -1e-300, 1e308, -1e308, 5e-324, -5e-324, 2.0**-31, -3 * 2.0**-31,
         2.0**53, -(2.0**53), 2.0**53 - 1, 2.0**60 + 2.0**8, 1e-320, -0.4 * 2.0**grid_exponent(scale)]])
    got = round_to_grid(values.reshape(2, -1), scale)
    assert got.shape == (2, values.size // 2)
    want = np.array([round_to_grid(float(v), scale) for v in values])
    assert got.ravel().tobytes() == want.tobytes()
    with pytest.raises(ValueError, match="finite"):
        round_to_grid(np.array([1.0, np.inf]), scale)
