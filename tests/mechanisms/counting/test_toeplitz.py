"""Square-root Toeplitz factorisation (dp_beam.mechanisms.counting.toeplitz)."""

import math

import numpy as np
import pytest

from dp_beam.mechanisms import SqrtToeplitzMechanism, ZeroNoise
from dp_beam.mechanisms.counting.factorisation import prefix_sum_matrix
from dp_beam.mechanisms.counting.toeplitz import sqrt_toeplitz_coefficients
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

from ..participation_helpers import brute_force_norm
from .cpu_kernels import fingerprint, stream_releases

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
    return fingerprint(stream_releases(mech, dim, steps))


@pytest.mark.parametrize("dim, horizon, steps, digest", [
    (1, 1024, 300, "e073fae83602c17ef1ba5889d1d52d766f073d6fa6c9336433cab592d4da491f"),
    (7, 256, 200, "4178783c05534ce1eee5d0573ba47a41a4ae6ff40de5fc8fad6e6d306be68052"),
    # Unbounded: epochs of 1, 2, 4, … steps.
    (2, None, 300, "93e60f5a5f8429168a400da16686eee7250b9b58abe188799f193172edb446ff"),
])
def test_releases_are_pinned_bit_for_bit(dim, horizon, steps, digest):
    """Replay stability: the same keyed draws give the same releases on every version and
    machine (a failure means a change altered the released bits; record the new digest
    only for a deliberate change, and say why)."""
    assert _replay(dim, horizon, steps) == digest


def test_release_sums_the_rounded_products_oldest_first():
    """What the release computes: c_(t−s)·y_s rounded, summed from the oldest step on with
    each sum rounded (Python floats as the reference), in every coordinate of a vector
    stream as in a scalar one."""
    for dim in (1, 3):
        mech = SqrtToeplitzMechanism(1.0, horizon=64, dim=dim, rng=KeyedNoise(KEY, ("sum", dim)),
                                     **GAUSS)
        data = np.random.default_rng(2)
        coef = sqrt_toeplitz_coefficients(64).tolist()
        for t in range(1, 41):
            release = np.atleast_1d(mech.step(data.uniform(-5, 5, size=dim) if dim > 1
                                              else float(data.uniform(-5, 5))))
            for j in range(dim):
                column = mech._core["noised"][:t, j].tolist()
                expect = coef[t - 1] * column[0]
                for s in range(1, t):
                    expect = expect + coef[t - 1 - s] * column[s]
                assert release[j] == expect
