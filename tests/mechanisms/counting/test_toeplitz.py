"""Square-root Toeplitz factorisation (dp_beam.mechanisms.counting.toeplitz)."""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import SqrtToeplitzMechanism, ZeroNoise
from dp_beam.mechanisms.counting.factorisation import prefix_sum_matrix
from dp_beam.mechanisms.counting.toeplitz import sqrt_toeplitz_coefficients

from ..participation_helpers import brute_force_norm

GAUSS = dict(noise="gaussian", delta=1e-6)


def test_square_of_c_is_the_prefix_sum_matrix():
    c = SqrtToeplitzMechanism.right_factor(30)
    np.testing.assert_allclose(c @ c, prefix_sum_matrix(30), atol=1e-12)
    coef = sqrt_toeplitz_coefficients(10)
    assert coef.tolist() == pytest.approx([math.comb(2 * i, i) / 4**i for i in range(10)])


@pytest.mark.parametrize("horizon,expected", [(2**10, 3.2726), (2**14, 4.1552)])
def test_max_std(horizon, expected):
    plan = SqrtToeplitzMechanism._plan(horizon)
    assert SqrtToeplitzMechanism._var_factor(plan, horizon) ** 0.5 * plan.l2 == pytest.approx(expected, abs=1e-4)


def test_horizon_limit_and_laplace_refused():
    with pytest.raises(ValueError, match="horizon"):
        SqrtToeplitzMechanism(1.0, horizon=2**14 + 1, **GAUSS)
    SqrtToeplitzMechanism(1.0, horizon=2**14, rng=ZeroNoise(), **GAUSS)
    with pytest.raises(ValueError, match="noise"):
        SqrtToeplitzMechanism(1.0, horizon=10)


def test_state_grows_linearly_and_unbounded_epochs_cap():
    mech = SqrtToeplitzMechanism(1.0, horizon=100, dim=2, rng=ZeroNoise(), **GAUSS)
    for t in range(1, 101):
        mech.step([1.0, 1.0])
        assert mech.state_size() == 2 * t * 2    # every input (integer units) and every y
    assert SqrtToeplitzMechanism._epoch_of(2**14) == (14, 2**14, 2**14)
    assert SqrtToeplitzMechanism._epoch_of(2**15 - 1) == (14, 2**14, 2**14)
    assert SqrtToeplitzMechanism._epoch_of(2**15) == (15, 2**15, 2**14)


@pytest.mark.parametrize("horizon,k,b", [(10, 3, 1), (12, 3, 3), (14, 4, 2), (9, 2, 5)])
def test_participation_norm_greedy_is_optimal(horizon, k, b):
    right = SqrtToeplitzMechanism.right_factor(horizon)
    assert SqrtToeplitzMechanism.participation_norm(horizon, k, b) == pytest.approx(
        brute_force_norm(right, k, b), rel=1e-12
    )
