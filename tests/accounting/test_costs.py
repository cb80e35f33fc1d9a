"""Conversions and (ε, δ) composition (dp_beam.accounting.costs)."""

import math

import numpy as np
import pytest
from scipy import optimize, special

from dp_beam.accounting.costs import (best_epsilon, pld_epsilon, scale, zcdp_to_epsilon,
                                      zcdp_to_epsilon_classic)


def _cks_epsilon(rho, delta):
    # Canonne–Kamath–Steinke 2020, Prop. 12 for the Rényi curve ε(α) = ρα:
    # ε = inf_{α>1} αρ + (ln(1/δ) + (α−1) ln(1−1/α) − ln α) / (α−1).
    f = lambda a: a * rho + (math.log(1 / delta) + (a - 1) * math.log(1 - 1 / a)
                             - math.log(a)) / (a - 1)
    return optimize.minimize_scalar(f, bounds=(1.0001, 1e4), method="bounded").fun


@pytest.mark.parametrize("rho, delta", [(0.5, 1e-6), (0.05, 1e-5), (2.0, 1e-9)])
def test_zcdp_conversion_is_the_tight_one(rho, delta):
    tight = zcdp_to_epsilon(rho, delta)
    exact = _cks_epsilon(rho, delta)
    # The accountant evaluates α on a grid, so it can only be at or above the
    # infimum; a 2 % margin bounds the grid's slack.
    assert exact - 1e-9 <= tight <= exact * 1.02
    assert tight < zcdp_to_epsilon_classic(rho, delta)


def test_gaussian_charges_compose_exactly():
    # k Gaussian mechanisms of ρ each are one Gaussian of kρ (μ adds in squares).
    many = pld_epsilon([(0.0, 0.0, 0.02, "gaussian")] * 10, 1e-6)
    one = pld_epsilon([(0.0, 0.0, 0.2, "gaussian")], 1e-6)
    assert many == pytest.approx(one, rel=0.01)


def _exact_delta(k, eps, eps_total):
    # Optimal composition of k ε-DP mechanisms (Kairouz et al. 2015): the
    # privacy loss is (k − 2j)ε with j ~ Binomial(k, 1/(1+e^ε)).
    p = 1 / (1 + math.exp(eps))
    j = np.arange(k + 1)
    pmf = special.comb(k, j) * p ** j * (1 - p) ** (k - j)
    return float(np.sum(pmf * np.maximum(0.0, 1 - np.exp(eps_total - (k - 2 * j) * eps))))


def test_pure_charges_compose_to_the_optimal_bound():
    k, eps, delta = 30, 0.1, 1e-6
    got = pld_epsilon([(eps, 0.0, eps * eps / 2, "laplace")] * k, delta)
    assert got < k * eps  # better than basic composition
    assert _exact_delta(k, eps, got) <= delta * 1.0001  # valid
    assert _exact_delta(k, eps, 0.97 * got) > delta     # and within 3 % of optimal


def test_group_privacy_scaling():
    assert scale(0.5, 1e-6, 0.125, 4) == pytest.approx((2.0, 4 * math.exp(1.5) * 1e-6, 2.0))
    with pytest.raises(ValueError, match="k"):
        scale(0.5, 0.0, 0.125, 0)


def test_best_epsilon_routes():
    pure = [(0.5, 0.0, 0.125, "laplace")] * 2
    assert best_epsilon(pure, 0.0) == (1.0, "basic composition")
    gauss = [(1.0, 1e-7, 0.05, "gaussian")] * 20
    eps, method = best_epsilon(gauss, 1e-6)
    assert eps < 20 and method in ("privacy loss distribution", "zCDP")
    assert best_epsilon(gauss, 0.0) == (None, "none")  # a pure budget admits no δ
