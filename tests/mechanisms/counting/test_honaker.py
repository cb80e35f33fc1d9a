"""Online Honaker estimator on the binary tree (dp_beam.mechanisms.counting.honaker)."""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import HonakerTreeMechanism, ZeroNoise

from ..participation_helpers import brute_force_norm


@pytest.mark.parametrize("log2,expected", [(10, 7.99), (16, 12.23), (20, 15.06)])
def test_max_std_matches_exact_computation(log2, expected):
    horizon = 1 << log2
    plan = HonakerTreeMechanism._plan(horizon)
    # The worst step sets every bit below the top one (t = 2^log2 − 1).
    worst = max(HonakerTreeMechanism._var_factor(plan, t) for t in (horizon - 1, horizon))
    assert math.sqrt(worst) * plan.l2 == pytest.approx(expected, abs=0.005)
    # Strictly better than the plain tree's √h·√popcount at every step.
    for t in (1, 3, 7, 100, horizon - 1):
        assert HonakerTreeMechanism._var_factor(plan, t) <= bin(t).count("1") + 1e-12


def test_weights_are_inverse_variance():
    plan = HonakerTreeMechanism._plan(1 << 12)
    for ell in range(1, plan.levels):
        # Combining variances 1 and 2 v_{ℓ−1} by inverse variance.
        assert plan.var[ell] == pytest.approx(1 / (1 + 1 / (2 * plan.var[ell - 1])))
    # Each estimate's Laplace coefficients reproduce its variance.
    for t in (1, 6, 4095):
        terms = HonakerTreeMechanism._laplace_terms(plan, t)
        assert sum(a * a * m for a, m in terms) == pytest.approx(HonakerTreeMechanism._var_factor(plan, t))


@pytest.mark.parametrize("horizon", [1, 2, 3, 8, 1000, 2**16])
def test_state_size(horizon):
    mech = HonakerTreeMechanism(1.0, horizon=horizon, dim=3, rng=ZeroNoise())
    assert mech.state_size() == 2 * horizon.bit_length() * 3
    unbounded = HonakerTreeMechanism(1.0, rng=ZeroNoise())
    for t in range(1, 200):
        unbounded.step(1.0)
        assert unbounded.state_size() <= 2 * (int(math.log2(t)) + 1) + 1


def test_one_node_per_completed_level():
    mech = HonakerTreeMechanism(1.0, horizon=64, rng=ZeroNoise())
    draws = []
    source = mech.noise_source
    source.laplace = lambda scale, size: draws.append(size) or np.zeros(size)
    for t in range(1, 65):
        mech.step(0.0)
        assert draws[-1] == (t & -t).bit_length()


@pytest.mark.parametrize("horizon,k,b", [(8, 3, 1), (8, 2, 2), (16, 3, 4), (12, 3, 3), (11, 4, 2)])
def test_participation_norm_vs_brute_force(horizon, k, b):
    right = HonakerTreeMechanism.right_factor(horizon)
    exact = brute_force_norm(right, k, b)
    bound = HonakerTreeMechanism.participation_norm(horizon, k, b)
    assert bound >= exact - 1e-12
    if horizon & (horizon - 1) == 0 and b & (b - 1) == 0 and k * b <= horizon:
        assert bound == pytest.approx(exact, rel=1e-12)
