"""Exact interval half-widths of sums of noises (dp_beam.mechanisms.halfwidths).

Statistical tolerances are 5 standard errors of the estimator, so a correct
implementation fails a seeded test never.
"""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import gaussian_halfwidth, laplace_sum_halfwidth
from dp_beam.mechanisms import halfwidths as noise_module  # private helpers under test

# -- half-widths ---------------------------------------------------------------


def test_single_laplace_halfwidth_is_b_ln_20():
    assert laplace_sum_halfwidth([2.5]) == pytest.approx(2.5 * math.log(20), rel=1e-12)
    assert laplace_sum_halfwidth([2.5], level=0.9) == pytest.approx(2.5 * math.log(10), rel=1e-12)


def test_two_equal_laplaces_match_the_closed_form():
    # Z1+Z2 with Z_i ~ Lap(1) has density (1+|s|)e^{-|s|}/4, so
    # P(|S| > x) = (2 + x) e^{-x} / 2; the numerical inversion must hit 5 %.
    x = laplace_sum_halfwidth([1.0, 1.0])
    assert (2 + x) * math.exp(-x) / 2 == pytest.approx(0.05, abs=1e-9)
    assert laplace_sum_halfwidth([3.0, 3.0]) == pytest.approx(3.0 * x, rel=1e-9)


def test_tiny_extra_term_barely_moves_the_halfwidth():
    assert laplace_sum_halfwidth([1.0, 1e-9]) == pytest.approx(math.log(20), rel=1e-6)
    assert laplace_sum_halfwidth([0.0, 0.0]) == 0.0
    assert laplace_sum_halfwidth([0.0, 2.0]) == pytest.approx(2.0 * math.log(20), rel=1e-12)


@pytest.mark.parametrize("scales", [[0.5, 1.0, 2.0, 2.0, 3.0], [4.0] * 17, [1.0, 2.0, 3.0] + [4.0] * 5])
def test_laplace_sum_halfwidth_has_the_stated_coverage(scales):
    n = 1_000_000
    rng = np.random.default_rng(2024)
    total = np.zeros(n)
    for b in scales:
        total += rng.laplace(0.0, b, n)
    x = laplace_sum_halfwidth(scales)
    coverage = np.mean(np.abs(total) <= x)
    # Binomial standard error of the empirical coverage; 5 of them.
    assert abs(coverage - 0.95) < 5 * math.sqrt(0.95 * 0.05 / n)
    # The exact width must respect the CSS10 tail bound of spec §1.3.
    nu = max(math.sqrt(sum(b * b for b in scales)), max(scales) * math.sqrt(math.log(40)))
    assert x <= nu * math.sqrt(8 * math.log(40))


def test_laplace_sum_halfwidth_is_order_independent_and_cached():
    a = laplace_sum_halfwidth([1.0, 2.0, 3.0])
    b = laplace_sum_halfwidth([3.0, 1.0, 2.0])
    assert a == b


@pytest.mark.parametrize("level", [0.0, 1.0, -0.5, float("nan")])
def test_halfwidths_validate_level(level):
    with pytest.raises(ValueError, match="level"):
        laplace_sum_halfwidth([1.0, 2.0], level=level)
    with pytest.raises(ValueError, match="level"):
        gaussian_halfwidth(1.0, level=level)


def test_laplace_sum_halfwidth_rejects_bad_scales():
    with pytest.raises(ValueError, match="scales"):
        laplace_sum_halfwidth([1.0, -2.0])
    with pytest.raises(ValueError, match="scales"):
        laplace_sum_halfwidth([1.0, float("inf")])


def test_gaussian_halfwidth_is_the_normal_quantile():
    assert gaussian_halfwidth(2.0) == pytest.approx(2.0 * 1.959963984540054, rel=1e-12)
    assert gaussian_halfwidth(0.0) == 0.0
    with pytest.raises(ValueError, match="std"):
        gaussian_halfwidth(-1.0)


# -- closed-form half-widths against the numerical reference -------------------

LEVELS = (0.5, 0.9, 0.95, 0.99)


def _key(groups):
    """Sorted, max-1 key of ``laplace_sum_halfwidth`` for ``[(scale, multiplicity)]``."""
    return tuple(sorted(s for s, m in groups for _ in range(m)))


def _reference_tolerance(level):
    # The numerical reference gets P(|S| <= x) to epsrel 1e-12 + epsabs 1e-13
    # (QUADPACK, two pieces), i.e. the tail to ~1.1e-12/(1 - level) relative,
    # and moves x by at most ~1.5 times that (tail/(x·density) <= 1.5 for
    # level >= 0.5), plus its brentq rtol 1e-12; the closed form is held to
    # 1.5e-11 by its checked error bound. 1.8e-10 at 99 %, 2.1e-11 at 50 %.
    # Measured worst over 1264 pattern×level pairs: 2.5e-13.
    return 1.5 * 1.1e-12 / (1.0 - level) + 1e-12 + 1.5e-11


PATTERNS = (
    [((1.0, n),) for n in range(1, 41)]
    + [((b, m1), (1.0, m2)) for b in (0.25, 0.5, 0.9) for m1, m2 in ((1, 1), (3, 5), (13, 20), (20, 7))]
    + [((b2, m1), (b3, m2), (1.0, m3)) for b2, b3 in ((0.2, 0.6), (0.5, 0.75), (1 / 3, 2 / 3))
       for m1, m2, m3 in ((1, 1, 1), (2, 3, 4), (13, 13, 13))]
    # Many distinct scales (the epoch roots of an unbounded tree): Decimal tier.
    + [tuple((k / 25, 1) for k in range(1, 25)) + ((1.0, 3),)]
)


@pytest.mark.parametrize("groups", PATTERNS, ids=lambda g: "+".join(f"{s:.3g}x{m}" for s, m in g))
def test_closed_form_matches_the_numerical_reference(groups):
    key = _key(groups)
    for level in LEVELS:
        closed = noise_module._closed_form_halfwidth(key, level)
        assert closed is not None  # none of these needs the fallback
        reference = noise_module._numerical_halfwidth(key, level)
        assert closed == pytest.approx(reference, rel=_reference_tolerance(level), abs=0)


def test_gamma_difference_tail_is_the_two_term_closed_form():
    # Two Lap(1): P(|S| > y) = (1 + y/2) e^{-y}; every tail starts at d_0 = 1.
    assert [a / b for a, b in noise_module._gamma_difference_tail(2)] == [1.0, 0.5]
    assert all(a == b for a, b in [noise_module._gamma_difference_tail(n)[0] for n in range(1, 60)])


def test_cancelling_scales_are_rescued_by_decimal_digits():
    terms = tuple((k / 25, 1) for k in range(1, 25)) + ((1.0, 3),)
    full = [(0.0, 200.0)]
    _, float_ratio = noise_module._closed_form_root(terms, None, 0.95, full)
    assert float_ratio > 1.0  # floats alone fail their error bound here
    root, ratio = noise_module._closed_form_root(terms, 40, 0.95, full)
    assert ratio <= 1.0
    assert root == noise_module._closed_form_halfwidth(_key(terms), 0.95)


def test_near_equal_distinct_scales_fall_back_to_integration(monkeypatch):
    # Scales 1e-9 apart with multiplicity 5 each: partial-fraction terms of
    # size ~(5e8)^10 cancel to O(1), beyond the 60 Decimal digits allowed.
    key = _key(((1.0 - 1e-9, 5), (1.0, 5)))
    assert noise_module._closed_form_halfwidth(key, 0.95) is None
    # With multiplicity 40 the float coefficients overflow outright.
    assert noise_module._closed_form_halfwidth(_key(((1.0 - 1e-9, 40), (1.0, 40))), 0.95) is None
    calls = []
    numerical = noise_module._numerical_halfwidth

    def spy(scales, level):
        calls.append(scales)
        return numerical(scales, level)

    monkeypatch.setattr(noise_module, "_numerical_halfwidth", spy)
    noise_module._normalised_halfwidth.cache_clear()
    width = laplace_sum_halfwidth(list(key))
    assert calls == [key]
    # The law is continuous in the scales: within ~1e-9 of ten equal Lap(1).
    assert width == pytest.approx(noise_module._closed_form_halfwidth((1.0,) * 10, 0.95), rel=1e-8)


def test_closed_form_has_the_stated_coverage_for_three_scales():
    # 13 each of Lap(0.5), Lap(0.75), Lap(1) at 90 % (the Decimal tier).
    # n = 400 000 seeded draws: binomial SE √(0.9·0.1/n) ≈ 4.7e-4; 5 SE ≈ 2.4e-3.
    n, level = 400_000, 0.9
    scales = [0.5] * 13 + [0.75] * 13 + [1.0] * 13
    rng = np.random.default_rng(7)
    total = np.zeros(n)
    for b in scales:
        total += rng.laplace(0.0, b, n)
    x = laplace_sum_halfwidth(scales, level)
    assert abs(np.mean(np.abs(total) <= x) - level) < 5 * math.sqrt(level * (1 - level) / n)
