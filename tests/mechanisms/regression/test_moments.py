"""Noisy moments (dp_beam.mechanisms.regression.moments): TreeMech (spec
private_erm_and_incremental_regression.md §4.5), the sensitivities of the two streams, the
budget split and the state size.
"""

import math

import numpy as np
import pytest
from scipy import optimize

from dp_beam.mechanisms import BinaryTreeMechanism, NoiseSource, ZeroNoise
from dp_beam.mechanisms.regression import (
    NoisyMoments,
    PrivIncReg1,
    PrivIncReg1Params,
    encode_point,
    gram_sensitivity,
    svec,
    svec_dim,
    upper_triangle,
    xy_sensitivity,
)
from dp_beam.mechanisms.regression.moments import treemech_sigma

from .helpers import TEST_SEED, unit_points


class _CallIndex(NoiseSource):
    """Draw j (1-based) is the constant vector j: shows which nodes a release sums."""

    def __init__(self):
        self.calls = 0

    def _gaussian(self, sigma, size):
        self.calls += 1
        return np.full(size, float(self.calls))


def test_tree_node_sets_are_the_dyadic_decomposition():
    tree = BinaryTreeMechanism(epsilon=1.0, noise="gaussian", delta=1e-6, horizon=16)
    as_intervals = lambda t: {(first - 1, last) for first, last, _ in tree.release_nodes(t)}  # noqa: E731
    assert as_intervals(7) == {(0, 4), (4, 6), (6, 7)}
    assert as_intervals(11) == {(0, 8), (8, 10), (10, 11)}
    for t in range(1, 17):
        assert len(tree.release_nodes(t)) == bin(t).count("1") <= tree.levels
    # Each step lies in at most h nodes over the whole horizon.
    nodes = {(f, l) for t in range(1, 17) for f, l, _ in tree.release_nodes(t)}
    assert max(sum(f <= s <= l for f, l in nodes) for s in range(1, 17)) <= 16 .bit_length()


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_without_noise_the_sums_are_the_exact_prefix_sums(counter):
    rng = np.random.default_rng(0)
    mom = NoisyMoments(dim=3, epsilon=1.0, delta=1e-6, horizon=32, counter=counter, rng=ZeroNoise())
    gram, xy = np.zeros((3, 3)), np.zeros(3)
    for t in range(1, 33):
        X = unit_points(rng, 5, 3)
        y = rng.uniform(-1, 1, size=5)
        enc = [encode_point(x, v) for x, v in zip(X, y)]
        Q, q = mom.step(sum(e[0] for e in enc), sum(e[1] for e in enc))
        gram += X.T @ X
        xy += X.T @ y
        np.testing.assert_allclose(Q, gram, atol=1e-7)
        np.testing.assert_allclose(q, xy, atol=1e-7)


def test_tree_noise_is_drawn_once_per_node_and_reused():
    source = _CallIndex()
    mom = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=16, counter="tree", rng=source)
    d_gram = svec_dim(2)
    releases = []
    for _ in range(8):
        mom.step(np.zeros(d_gram), np.zeros(2))
        releases.append(mom._gram.current())
    # The gram counter makes the odd draws: its node ending at step s carries 2s − 1.
    for t, value in enumerate(releases, start=1):
        expected = sum(2 * last - 1 for _, last, _ in mom._gram.release_nodes(t))
        np.testing.assert_array_equal(value, np.full(d_gram, float(expected)))
    # s_3 − s_2 is node (2, 3]'s noise alone; (0, 2]'s noise is shared by both.
    np.testing.assert_array_equal(releases[2] - releases[1], np.full(d_gram, 5.0))
    assert source.calls == 16   # one draw per step and counter, never a redraw


def test_treemech_sigma_matches_the_spec_and_the_project_calibration_is_within_a_permille():
    for horizon, want in ((1024, 72.0111), (4096, 78.2843), (2 ** 20, 99.4976)):
        assert treemech_sigma(2.0, horizon, 0.5, 5e-7) == pytest.approx(want, abs=1e-4)
        tree = BinaryTreeMechanism(epsilon=0.5, sensitivity=2.0, noise="gaussian", delta=5e-7,
                                   horizon=horizon)
        node_sigma = tree.noise_scales(1)[0]
        assert node_sigma / want == pytest.approx(1.0, abs=2e-3)
        analytic = BinaryTreeMechanism(epsilon=0.5, sensitivity=2.0, noise="gaussian", delta=5e-7,
                                       horizon=horizon, calibration="analytic")
        assert analytic.noise_scales(1)[0] < want


@pytest.mark.parametrize("counter", ["tree", "blt"])
def test_released_noise_matches_the_stated_std(counter):
    # R repetitions × D coordinates of i.i.d. Gaussian noise: the sample variance of
    # N = R·D draws has relative standard deviation √(2/N); 5 of them is the tolerance.
    reps, steps, d = 300, 6, 3
    dims = svec_dim(d) + d
    samples = {t: [] for t in range(1, steps + 1)}
    rng = np.random.default_rng(5)
    for r in range(reps):
        mom = NoisyMoments(dim=d, epsilon=1.0, delta=1e-6, horizon=8, counter=counter,
                           rng=np.random.default_rng(1000 + r))
        for t in range(1, steps + 1):
            mom.step(np.zeros(svec_dim(d)), np.zeros(d))
            std_gram, std_xy = mom.noise_std(t)
            samples[t].append(np.concatenate([mom._gram.current() / std_gram,
                                              mom._xy.current() / std_xy]))
    tol = 5 * math.sqrt(2.0 / (reps * dims))
    for t, rows in samples.items():
        z = np.array(rows)
        assert abs(float(np.mean(z * z)) - 1.0) < tol, (t, float(np.mean(z * z)))
        assert abs(float(np.mean(z))) < 5 / math.sqrt(reps * dims)
    del rng
    if counter == "tree":
        # spec §4.5 item 27: the variance is popcount(t)·σ² per coordinate.
        mom = NoisyMoments(dim=d, epsilon=1.0, delta=1e-6, horizon=8, counter="tree", rng=TEST_SEED)
        node = mom._gram.noise_scales(1)[0]
        for t in range(1, 8):
            assert mom.noise_std(t)[0] == pytest.approx(node * math.sqrt(bin(t).count("1")))


def _worst_pairs(d, rng, n=4000):
    a = unit_points(rng, n, d)
    b = unit_points(rng, n, d)
    a[:d], b[:d] = np.eye(d), np.roll(np.eye(d), 1, axis=0)    # orthogonal unit vectors
    a[d:2 * d], b[d:2 * d] = np.eye(d), -np.eye(d)              # antipodal
    return a, b


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_gram_and_xy_replace_sensitivities_by_brute_force(d):
    rng = np.random.default_rng(d)
    a, b = _worst_pairs(d, rng)
    ya, yb = rng.uniform(-1, 1, len(a)), rng.uniform(-1, 1, len(b))
    ya[: 2 * d], yb[: 2 * d] = 1.0, 1.0
    gram = [np.linalg.norm(svec(np.outer(x, x)) - svec(np.outer(z, z))) for x, z in zip(a, b)]
    plain = [np.linalg.norm(upper_triangle(np.outer(x, x)) - upper_triangle(np.outer(z, z)))
             for x, z in zip(a, b)]
    xy = [np.linalg.norm(x * u - z * v) for x, z, u, v in zip(a, b, ya, yb)]
    assert max(gram) <= math.sqrt(2) + 1e-12 and max(plain) <= math.sqrt(2) + 1e-12
    assert max(xy) <= 2.0 + 1e-12
    assert max(xy) == pytest.approx(2.0)                      # x' = −x
    if d >= 2:
        assert max(gram) == pytest.approx(math.sqrt(2))       # orthogonal unit vectors
        assert max(plain) == pytest.approx(math.sqrt(2))
    # svec keeps the Frobenius norm; the encoded (grid-rounded) stream stays within the pad.
    for x, z, u, v in zip(a[:200], b[:200], ya, yb):
        assert np.linalg.norm(svec(np.outer(x, x))) == pytest.approx(np.linalg.norm(np.outer(x, x)))
        (ga, ba), (gb, bb) = encode_point(x, u), encode_point(z, v)
        assert np.linalg.norm(ga - gb) <= gram_sensitivity(d)
        assert np.linalg.norm(ba - bb) <= xy_sensitivity(d)


def test_gram_sensitivity_supremum_by_optimisation():
    # Maximise ‖svec(xxᵀ) − svec(zzᵀ)‖ over the unit ball from random starts: √2, never more.
    rng = np.random.default_rng(1)
    d = 3

    def neg(v):
        x, z = v[:d], v[d:]
        x = x / max(1.0, np.linalg.norm(x))
        z = z / max(1.0, np.linalg.norm(z))
        return -np.linalg.norm(upper_triangle(np.outer(x, x)) - upper_triangle(np.outer(z, z)))

    best = max(-optimize.minimize(neg, rng.normal(size=2 * d), method="Nelder-Mead",
                                  options={"maxiter": 4000, "xatol": 1e-10, "fatol": 1e-12}).fun
               for _ in range(20))
    assert best == pytest.approx(math.sqrt(2), abs=1e-6)


def test_budget_split_basic_is_two_halves_and_zcdp_is_half_rho_each():
    basic = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=64, counter="tree", split="basic",
                         rng=ZeroNoise())
    assert basic._gram.epsilon == basic._xy.epsilon == 0.5
    assert basic._gram.delta == basic._xy.delta == 5e-7
    assert basic._xy.sensitivity == pytest.approx(2.0) and basic._gram.sensitivity == pytest.approx(math.sqrt(2))
    zcdp = NoisyMoments(dim=2, epsilon=1.0, delta=1e-6, horizon=64, counter="tree", rng=ZeroNoise())
    # Each counter is ρ/2-zCDP for its true sensitivity: calibrated at (ε, δ) for √2 times it.
    assert zcdp._xy.sensitivity == pytest.approx(2.0 * math.sqrt(2))
    cost = zcdp.privacy_cost()
    assert cost["epsilon"] == 1.0 and cost["delta"] == 1e-6
    assert zcdp._gram.rho == pytest.approx(cost["rho"])
    # The zCDP split adds less noise than the spec's basic split.
    assert zcdp.noise_std(5)[1] < basic.noise_std(5)[1]


def test_state_is_bounded_by_the_counters():
    d = 4
    D = svec_dim(d) + d
    blt = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6), rng=TEST_SEED)   # unbounded
    tree = PrivIncReg1(PrivIncReg1Params(dim=d, epsilon=1.0, delta=1e-6, horizon=1024, counter="tree"),
                       rng=TEST_SEED)
    for t in range(1, 600):
        blt.step(np.zeros(svec_dim(d)), np.zeros(d), 0)
        tree.step(np.zeros(svec_dim(d)), np.zeros(d), 0)
        # BLT: (2b + 1) numbers per coordinate and epoch (b <= 5 buffers) plus the running roots.
        assert blt.state_size() <= 12 * D
        assert tree.state_size() <= 1024 .bit_length() * D
