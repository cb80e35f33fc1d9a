"""Square-root Toeplitz factorisation (dp_beam.mechanisms.counting.toeplitz)."""

import hashlib
import math

import numpy as np
import pytest

from dp_beam.mechanisms import SqrtToeplitzMechanism, ZeroNoise
from dp_beam.mechanisms.counting.factorisation import prefix_sum_matrix
from dp_beam.mechanisms.counting.toeplitz import sqrt_toeplitz_coefficients
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

from ..participation_helpers import brute_force_norm

GAUSS = dict(noise="gaussian", delta=1e-6)
KEY = NoiseKey.from_bytes(bytes(range(32)))


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


def _replay(dim, horizon, steps):
    """SHA-256 of the exact bits (``float.hex``) of one keyed stream's releases."""
    mech = SqrtToeplitzMechanism(1.0, sensitivity=1.5, horizon=horizon, dim=dim,
                                 rng=KeyedNoise(KEY, ("toeplitz", dim)), **GAUSS)
    data = np.random.default_rng(5)
    out = []
    for _ in range(steps):
        x = data.uniform(-3, 3, size=dim) if dim > 1 else float(data.uniform(-3, 3))
        out.extend(np.atleast_1d(mech.step(x)).tolist())
    return hashlib.sha256(repr([v.hex() for v in out]).encode()).hexdigest()


@pytest.mark.parametrize("dim, horizon, steps, digest", [
    (1, 1024, 300, "bab224e31b057af1a0607c9905ea109d9c3a9c8b6042c10cb2ea79233d2f1d32"),
    (7, 256, 200, "3dc98895e1572c546027ef980caaf6c6bf3494fb8802a611a1584aa4d4ecad9b"),
    # Unbounded: epochs of 1, 2, 4, … steps.
    (2, None, 300, "c607d8fdeb36a9cf9e0066563440d33c210581bfb5de7af24bcd32e2b863b502"),
])
def test_releases_are_pinned_bit_for_bit(dim, horizon, steps, digest):
    """Replay stability: the same keyed draws give the same releases on every version and
    machine (a failure means a change altered the released bits; record the new digest
    only for a deliberate change, and say why)."""
    assert _replay(dim, horizon, steps) == digest


def test_release_is_the_correctly_rounded_sum_of_the_rounded_products():
    """What the release computes, against exact rational arithmetic: each product
    c_(t−s)·y_s rounded to a float, their sum rounded once."""
    from fractions import Fraction

    mech = SqrtToeplitzMechanism(1.0, horizon=64, dim=3, rng=KeyedNoise(KEY, ("exact",)), **GAUSS)
    data = np.random.default_rng(2)
    for t in range(1, 41):
        release = mech.step(data.uniform(-5, 5, size=3))
        core = mech._core
        weights = mech._plan(64).reversed[64 - t:].tolist()
        for j in range(3):
            column = core["noised"][:t, j].tolist()
            exact = sum(Fraction(w * y) for w, y in zip(weights, column))
            assert release[j] == float(exact)
