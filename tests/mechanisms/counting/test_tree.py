"""Binary tree mechanism (dp_beam.mechanisms.counting.tree; docs/privacy/counting.md, C-3 to C-7).

Statistical tests use many independent repetitions at once: the coordinates of
a ``dim``-dimensional mechanism get independent noise, so one run with
``dim = n`` yields n independent releases per step. Tolerances are 5 standard
errors of the estimator, derived in each test.
"""

import json
import math
import pickle

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import (
    BinaryTreeMechanism,
    NoiseSource,
    KeyedNoise,
    SeededNoise,
    ZeroNoise,
    gaussian_sigma,
    laplace_sum_halfwidth,
    rho_from_eps_delta,
)

#: Relative tolerance of the closed-form scales: every node scale is
#: calibrated for its sensitivity Δ plus a pad of at most two noise-grid
#: steps, 2^-29 of the scale (noise_grid.grid_padded_scale), so it exceeds the
#: textbook formula by a relative pad/Δ <= 2^-29·scale/Δ: below 1e-6 for
#: the scales these tests use (scale/Δ <= 224).
GRID_PAD = 1e-6


class CountingNoise(NoiseSource):
    """Zero noise that records every draw as (kind, scale, size)."""

    def __init__(self):
        self.draws = []

    def laplace(self, scale, size):
        self.draws.append(("laplace", scale, size))
        return np.zeros(size)

    def gaussian(self, sigma, size):
        self.draws.append(("gaussian", sigma, size))
        return np.zeros(size)


class TaggedNoise(NoiseSource):
    """The k-th draw (0-based) is 2**k in every coordinate.

    A release over zero data is then a sum of distinct powers of two, exact in
    float64 while they span at most 53 bits, and its binary digits say which
    draws (= which nodes, one per step) it contains.
    """

    def __init__(self):
        self.k = 0

    def laplace(self, scale, size):
        value = np.full(size, 2.0**self.k)
        self.k += 1
        return value

    gaussian = laplace


def popcount(c):
    return bin(c).count("1")


def run(mech, xs):
    return [mech.step(x) for x in xs]


def variance_tolerance(scales, kind, n):
    """5 standard errors of the sample variance of a sum of independent noises.

    Var(s²) ≈ (2σ⁴ + κ4)/n with κ4 the fourth cumulant of the sum; a Laplace
    term of variance v adds κ4 = 3v² (excess kurtosis 3), a Gaussian adds 0.
    """
    if kind == "laplace":
        variances = [2 * b * b for b in scales]
        kappa4 = sum(3 * v * v for v in variances)
    else:
        variances = [s * s for s in scales]
        kappa4 = 0.0
    var = sum(variances)
    return 5 * math.sqrt((2 * var * var + kappa4) / n)


# -- C-7: exactness with noise switched off ------------------------------------


@pytest.mark.parametrize("n_steps", [1, 2, 3, 7, 8, 1000])
@pytest.mark.parametrize("dim", [1, 3])
def test_zero_noise_releases_exact_prefix_sums(n_steps, dim):
    rng = np.random.default_rng(n_steps * 10 + dim)
    xs = rng.normal(size=(n_steps, dim)) * 5
    mech = BinaryTreeMechanism(1.0, horizon=n_steps, dim=dim, rng=ZeroNoise())
    inputs = xs[:, 0] if dim == 1 else xs
    out = np.array(run(mech, inputs)).reshape(n_steps, dim)
    np.testing.assert_allclose(out, np.cumsum(xs, axis=0), rtol=1e-12, atol=1e-9)
    if dim == 1:
        assert isinstance(mech.current(), float)
    np.testing.assert_allclose(np.reshape(mech.current(), dim), out[-1], rtol=0, atol=0)


def test_scalar_releases_are_floats_and_vectors_arrays():
    scalar = BinaryTreeMechanism(1.0, horizon=4, rng=1)
    assert type(scalar.step(1.0)) is float
    assert type(scalar.step(np.array([2.0]))) is float
    vector = BinaryTreeMechanism(1.0, horizon=4, dim=2, rng=1)
    out = vector.step([1.0, 2.0])
    assert isinstance(out, np.ndarray) and out.shape == (2,)


@pytest.mark.parametrize("dim", [1, 2])
def test_unbounded_zero_noise_is_exact_through_5000_steps(dim):
    rng = np.random.default_rng(77)
    xs = rng.uniform(-3, 3, size=(5000, dim))
    mech = BinaryTreeMechanism(0.5, horizon=None, dim=dim, rng=ZeroNoise())
    out = np.array(run(mech, xs[:, 0] if dim == 1 else xs)).reshape(5000, dim)
    np.testing.assert_allclose(out, np.cumsum(xs, axis=0), rtol=1e-12, atol=1e-9)


# -- C-7 / C-6: which nodes a release sums -------------------------------------


@pytest.mark.parametrize("horizon", [50, None])
def test_release_sums_exactly_the_dyadic_cover(horizon):
    tagged = TaggedNoise()
    mech = BinaryTreeMechanism(1.0, horizon=horizon, rng=tagged)
    for c in range(1, 51):
        value = mech.step(0.0)
        nodes = mech.release_nodes(c)
        # Decode the release into the set of steps whose node it contains.
        bits = int(value)
        assert float(bits) == value
        used = {k + 1 for k in range(bits.bit_length()) if (bits >> k) & 1}
        assert used == {last for _, last, _ in nodes}
        # Disjoint intervals tiling [1, c], each of length 2^level.
        covered = sorted(s for first, last, _ in nodes for s in range(first, last + 1))
        assert covered == list(range(1, c + 1))
        for first, last, level in nodes:
            assert last - first + 1 == 2**level
        if horizon is not None:
            assert len(nodes) == popcount(c)
            assert {(level, last >> level) for _, last, level in nodes} == {
                (i, c >> i) for i in range(c.bit_length()) if (c >> i) & 1
            }
        else:
            k = c.bit_length() - 1
            roots = nodes[:k]
            # C-6: epoch j's root covers exactly its 2^j steps 2^j … 2^{j+1}−1.
            assert roots == [(2**j, 2 ** (j + 1) - 1, j) for j in range(k)]
            assert len(nodes) == k + popcount(c - 2**k + 1)
            assert all(first >= 2**k for first, _, _ in nodes[k:])


def test_bm2_example_six():
    mech = BinaryTreeMechanism(1.0, horizon=8, rng=ZeroNoise())
    assert mech.release_nodes(6) == [(1, 4, 2), (5, 6, 1)]


# -- C-3: membership and sensitivity ----------------------------------------------


def test_element_membership_and_h_for_1000():
    n = 1000
    mech = BinaryTreeMechanism(1.0, horizon=n, rng=ZeroNoise())
    assert mech.levels == 10
    assert max(popcount(c) for c in range(1, n + 1)) == 9
    created = [mech.release_nodes(c)[-1] for c in range(1, n + 1)]
    assert all(last == c for c, (_, last, _) in zip(range(1, n + 1), created))
    membership = np.zeros(n + 1, dtype=int)
    for first, last, _ in created:
        membership[first : last + 1] += 1
    # C-3 counts the full dyadic tree, |{i : ⌈s/2^i⌉·2^i <= N}|. The
    # CSS10 form creates one node per step (C-4), i.e. only the nodes (i, j)
    # with j odd, so s lies in those levels where j = ⌈s/2^i⌉ is odd: never
    # more than the full-tree count, and element 1 (j = 1 everywhere) hits h.
    for s in (1, 2, 3, 500, 999, 1000):
        full_tree = [i for i in range(10) if math.ceil(s / 2**i) * 2**i <= n]
        expected = sum(1 for i in full_tree if math.ceil(s / 2**i) % 2 == 1)
        assert membership[s] == expected <= len(full_tree)
    assert membership[1] == membership[1:].max() == mech.levels


def created_nodes(horizon, xs):
    """Exact value of every node, read from the state right after its creation step."""
    dim = xs.shape[1]
    mech = BinaryTreeMechanism(1.0, horizon=horizon, dim=dim, rng=ZeroNoise())
    nodes = []
    for c, x in enumerate(xs, start=1):
        mech.step(x if dim > 1 else x[0])
        level = (c & -c).bit_length() - 1
        nodes.append(np.array(mech.to_state()["nodes"][level]))
    return np.array(nodes)


@pytest.mark.parametrize("s", [1, 2, 5, 64, 100])
def test_node_vector_sensitivity_audit(s):
    n = 100  # h = 7, and 2^6 = 64 <= 100, so element 1 is in all 7 levels
    rng = np.random.default_rng(s)
    xs = rng.uniform(0, 1, size=(n, 1))
    ys = xs.copy()
    ys[s - 1, 0] += 0.75
    diff = created_nodes(n, xs) - created_nodes(n, ys)
    l1 = np.abs(diff).sum()
    h = n.bit_length()
    assert l1 <= h * 0.75 + 1e-9
    if s == 1:
        assert l1 == pytest.approx(h * 0.75, rel=1e-9)
    # Vector inputs: the L2 change of the node vector is √h·‖δ‖₂ at most.
    xs3 = rng.uniform(0, 1, size=(n, 3))
    ys3 = xs3.copy()
    ys3[s - 1] += np.array([0.3, -0.4, 0.0])
    l2 = np.linalg.norm(created_nodes(n, xs3) - created_nodes(n, ys3))
    assert l2 <= math.sqrt(h) * 0.5 + 1e-9


# -- C-4: draws, repeated reads, seeds -------------------------------------------


@pytest.mark.parametrize("horizon,noise,delta", [(100, "laplace", None), (None, "laplace", None), (None, "gaussian", 1e-6)])
def test_one_noise_draw_per_created_node(horizon, noise, delta):
    counting = CountingNoise()
    mech = BinaryTreeMechanism(1.0, horizon=horizon, noise=noise, delta=delta, dim=4, rng=counting)
    for c in range(1, 101):
        mech.step(np.ones(4))
        assert len(counting.draws) == c
        kind, scale, size = counting.draws[-1]
        assert kind == noise and size == 4
        # The node created at step c is the last of its release, with that scale.
        assert scale == mech.noise_scales(c)[-1]
        mech.current()
        mech.noise_std(c)
        mech.ci_halfwidth(c)
        assert len(counting.draws) == c


def test_repeated_reads_are_identical():
    mech = BinaryTreeMechanism(1.0, horizon=16, rng=3)
    released = [mech.step(1.0) for _ in range(5)]
    assert mech.current() == mech.current() == released[-1]
    vec = BinaryTreeMechanism(1.0, dim=3, rng=3)
    last = [vec.step(np.ones(3)) for _ in range(6)][-1]
    np.testing.assert_array_equal(vec.current(), last)
    np.testing.assert_array_equal(vec.current(), vec.current())


def test_before_any_step_current_is_zero():
    assert BinaryTreeMechanism(1.0, horizon=3, rng=1).current() == 0.0
    np.testing.assert_array_equal(BinaryTreeMechanism(1.0, dim=2, rng=1).current(), np.zeros(2))


def test_seed_reproduces_and_different_seeds_differ():
    xs = np.arange(20.0)
    a = run(BinaryTreeMechanism(1.0, horizon=20, rng=123), xs)
    b = run(BinaryTreeMechanism(1.0, horizon=20, rng=123), xs)
    c = run(BinaryTreeMechanism(1.0, horizon=20, rng=124), xs)
    assert a == b
    assert a != c


def test_default_rng_is_secure():
    mech = BinaryTreeMechanism(1.0, horizon=4)
    assert isinstance(mech.noise_source, KeyedNoise)
    assert mech.noise_source.secure
    assert isinstance(BinaryTreeMechanism(1.0, rng=5).noise_source, SeededNoise)


# -- C-3: state size, horizon ------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 2, 3, 7, 8, 1000, 2**16])
def test_state_size_bounded(horizon):
    mech = BinaryTreeMechanism(1.0, horizon=horizon, rng=ZeroNoise())
    h = horizon.bit_length()
    for _ in range(min(horizon, 300)):
        mech.step(1.0)
        # an O(log T) state bound allows 2h + 1 (h levels, C-3); this one keeps one float per level
        assert mech.state_size() == h <= math.floor(math.log2(horizon)) + 2
    assert mech.state_size() <= 2 * h + 1
    assert BinaryTreeMechanism(1.0, horizon=horizon, dim=5, rng=ZeroNoise()).state_size() == 5 * h


def test_state_size_for_2_to_16_steps():
    for horizon in (2**16, None):
        mech = BinaryTreeMechanism(1.0, horizon=horizon, rng=ZeroNoise())
        for _ in range(2**16):
            mech.step(0.5)
        assert mech.state_size() <= 16 + 2
    assert BinaryTreeMechanism(1.0, horizon=2**16, rng=ZeroNoise()).state_size() == 17


def test_state_size_unbounded_grows_logarithmically():
    mech = BinaryTreeMechanism(1.0, dim=2, rng=ZeroNoise())
    for t in range(1, 5001):
        mech.step(np.ones(2))
        assert mech.state_size() <= (math.floor(math.log2(t)) + 2) * 2


def test_horizon_overflow_raises_and_keeps_state():
    mech = BinaryTreeMechanism(1.0, horizon=3, rng=ZeroNoise())
    run(mech, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="horizon exceeded"):
        mech.step(4.0)
    assert mech.t == 3
    assert mech.current() == 6.0
    with pytest.raises(ValueError, match="t must be <= horizon"):
        mech.noise_std(4)


# -- C-4 / C-5 / C-9: scales -----------------------------------------------------------


def test_laplace_scale_formula():
    mech = BinaryTreeMechanism(1.0, sensitivity=1.0, horizon=1000, rng=ZeroNoise())
    assert mech.levels == 10
    assert mech.noise_scales(1000) == pytest.approx([10.0] * popcount(1000), rel=GRID_PAD)
    # c_u = 16 folded into the sensitivity: T = 16000 → h = 14, b = 16·14 = 224.
    mech = BinaryTreeMechanism(1.0, sensitivity=16.0, horizon=16000, rng=ZeroNoise())
    assert mech.noise_scales(1) == pytest.approx([224.0], rel=GRID_PAD)
    assert mech.noise_std(7) == pytest.approx(math.sqrt(2 * 3) * 224.0, rel=GRID_PAD)
    mech = BinaryTreeMechanism(0.5, sensitivity=2.0, horizon=7, rng=ZeroNoise())
    assert mech.noise_scales(3) == pytest.approx([12.0, 12.0], rel=GRID_PAD)


def test_unbounded_scales_per_epoch():
    mech = BinaryTreeMechanism(2.0, sensitivity=3.0, rng=ZeroNoise())
    # epoch k has k+1 levels and scale (k+1)·Δ/ε = 1.5(k+1)
    assert mech.noise_scales(1) == pytest.approx([1.5], rel=GRID_PAD)
    assert mech.noise_scales(2) == pytest.approx([1.5, 3.0], rel=GRID_PAD)
    assert mech.noise_scales(3) == pytest.approx([1.5, 3.0], rel=GRID_PAD)
    assert mech.noise_scales(6) == pytest.approx([1.5, 3.0, 4.5, 4.5], rel=GRID_PAD)
    assert mech.noise_scales(7) == pytest.approx([1.5, 3.0, 4.5], rel=GRID_PAD)
    assert mech.noise_scales(8) == pytest.approx([1.5, 3.0, 4.5, 6.0], rel=GRID_PAD)
    assert mech.noise_std(6) == pytest.approx(math.sqrt(2 * (1.5**2 + 3**2 + 2 * 4.5**2)), rel=GRID_PAD)


def test_gaussian_scale_formula():
    mech = BinaryTreeMechanism(1.0, sensitivity=2.0, horizon=1000, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    rho = rho_from_eps_delta(1.0, 1e-6)
    sigma = math.sqrt(10) * 2.0 / math.sqrt(2 * rho)
    assert mech.noise_scales(7) == pytest.approx([sigma] * 3, rel=GRID_PAD)
    assert mech.noise_std(7) == pytest.approx(sigma * math.sqrt(3), rel=GRID_PAD)
    assert mech.rho == pytest.approx(rho, rel=1e-12)


# -- calibration and privacy cost ------------------------------------------------


def test_privacy_cost_laplace():
    cost = BinaryTreeMechanism(0.8, horizon=10, rng=ZeroNoise()).privacy_cost()
    assert cost == {"epsilon": 0.8, "delta": 0.0, "rho": pytest.approx(0.32)}


@pytest.mark.parametrize("noise, delta, calibration", [("laplace", None, "zcdp"), ("gaussian", 1e-6, "zcdp"),
                                                       ("gaussian", 1e-5, "analytic")])
def test_privacy_cost_is_a_cost_with_the_numbers_of_the_old_dict(noise, delta, calibration):
    from dp_beam.accounting.cost import Cost

    mech = BinaryTreeMechanism(0.7, horizon=None, noise=noise, delta=delta, calibration=calibration,
                               rng=ZeroNoise())
    cost = mech.privacy_cost()
    old = {"epsilon": mech.epsilon, "delta": 0.0 if mech.delta is None else mech.delta, "rho": mech.rho}
    assert isinstance(cost, Cost)
    assert (cost.epsilon, cost.delta, cost.rho) == (old["epsilon"], old["delta"], old["rho"])
    assert cost == old and dict(cost) == old


@pytest.mark.parametrize("horizon", [1000, None])
def test_gaussian_analytic_is_smaller_and_rho_consistent(horizon):
    kwargs = dict(sensitivity=1.5, horizon=horizon, noise="gaussian", delta=1e-6, rng=ZeroNoise())
    zcdp = BinaryTreeMechanism(1.0, calibration="zcdp", **kwargs)
    analytic = BinaryTreeMechanism(1.0, calibration="analytic", **kwargs)
    assert zcdp.privacy_cost() == {"epsilon": 1.0, "delta": 1e-6, "rho": pytest.approx(rho_from_eps_delta(1.0, 1e-6))}
    for t in (1, 5, 600):
        assert analytic.noise_std(t) < zcdp.noise_std(t)
    # A Gaussian mechanism with L2 sensitivity s and std σ is s²/(2σ²)-zCDP;
    # for the unbounded form every epoch k (s = √(k+1)·Δ) must give the same ρ.
    for t in (1, 2, 4, 8, 512) if horizon is None else (1,):
        levels = t.bit_length() if horizon is None else horizon.bit_length()
        sigma = analytic.noise_scales(t)[-1]
        assert sigma == pytest.approx(gaussian_sigma(math.sqrt(levels) * 1.5, 1.0, 1e-6, "analytic"), rel=GRID_PAD)
        assert analytic.rho == pytest.approx(levels * 1.5**2 / (2 * sigma**2), rel=GRID_PAD)
    assert analytic.rho > zcdp.rho


# -- C-4 / C-7: statistics of the noise ---------------------------------------------


N_REPS = 40000  # relative SE of a Laplace variance estimate ≈ √(5/n) ≈ 1.1 %


def sample_releases(mech, steps):
    return np.array([mech.step(np.zeros(mech.dim)) for _ in range(steps)])


def test_laplace_release_variance_and_covariance():
    # b = h·Δ/ε = 4·1/2 = 2 with horizon 15 (C-4).
    mech = BinaryTreeMechanism(2.0, horizon=15, dim=N_REPS, rng=SeededNoise(20240))
    assert mech.noise_scales(1) == pytest.approx([2.0], rel=GRID_PAD)
    r = sample_releases(mech, 15)
    for c, expected in [(1, 8.0), (3, 16.0), (7, 24.0), (8, 8.0), (15, 32.0)]:
        assert mech.noise_std(c) ** 2 == pytest.approx(expected, rel=GRID_PAD)
        assert abs(r[c - 1].mean()) < 5 * math.sqrt(expected / N_REPS)
        assert abs(r[c - 1].var() - expected) < variance_tolerance(mech.noise_scales(c), "laplace", N_REPS)
    # Releases at 4 and 6 share node (2,1), whose variance is 2b² = 8. With
    # X = A, Y = A + B (A, B iid Laplace) Var(XY) = 6σ_A⁴; with X = A + C,
    # Y = A + B it is 8σ_A⁴; 5 SE of the sample covariance.
    assert abs(np.cov(r[3], r[5])[0, 1] - 8.0) < 5 * 8.0 * math.sqrt(6 / N_REPS)
    assert abs(np.cov(r[4], r[5])[0, 1] - 8.0) < 5 * 8.0 * math.sqrt(8 / N_REPS)
    # Steps 3 and 4 share no node: independent, SE of the covariance σ3·σ4/√n.
    assert abs(np.cov(r[2], r[3])[0, 1]) < 5 * math.sqrt(16 * 8 / N_REPS)
    # The node created at step 1 is Lap(2) itself (C-4 KS test; seeded, so a
    # fixed threshold cannot flake).
    assert stats.kstest(r[0], "laplace", args=(0.0, 2.0)).pvalue > 1e-3
    # Exact 95 % interval: the empirical coverage is binomial, 5 SE.
    for c in (1, 7, 15):
        coverage = np.mean(np.abs(r[c - 1]) <= mech.ci_halfwidth(c))
        assert abs(coverage - 0.95) < 5 * math.sqrt(0.95 * 0.05 / N_REPS)


def test_gaussian_release_variance_and_covariance():
    mech = BinaryTreeMechanism(
        1.0, horizon=15, noise="gaussian", delta=1e-5, dim=N_REPS, rng=SeededNoise(99)
    )
    sigma = mech.noise_scales(1)[0]
    assert sigma == pytest.approx(gaussian_sigma(2.0, 1.0, 1e-5), rel=GRID_PAD)
    r = sample_releases(mech, 15)
    for c in (1, 3, 7, 8, 15):
        expected = sigma**2 * popcount(c)
        assert mech.noise_std(c) ** 2 == pytest.approx(expected, rel=GRID_PAD)
        assert abs(r[c - 1].mean()) < 5 * math.sqrt(expected / N_REPS)
        # Gaussian: Var(s²) = 2σ⁴/n.
        assert abs(r[c - 1].var() - expected) < 5 * expected * math.sqrt(2 / N_REPS)
    # Shared node (2,1): cov = σ²; Var(A(A+B)) = 3σ⁴ + σ⁴ − σ⁴ = 3σ⁴ for normals.
    assert abs(np.cov(r[3], r[5])[0, 1] - sigma**2) < 5 * sigma**2 * math.sqrt(3 / N_REPS)
    assert stats.kstest(r[0], "norm", args=(0.0, sigma)).pvalue > 1e-3
    for c in (1, 7):
        assert mech.ci_halfwidth(c) == pytest.approx(1.959963984540054 * mech.noise_std(c), rel=1e-12)
        coverage = np.mean(np.abs(r[c - 1]) <= mech.ci_halfwidth(c))
        assert abs(coverage - 0.95) < 5 * math.sqrt(0.95 * 0.05 / N_REPS)


def test_unbounded_release_variance():
    mech = BinaryTreeMechanism(1.0, horizon=None, dim=N_REPS, rng=SeededNoise(7))
    r = sample_releases(mech, 8)
    expected = {1: 2.0, 2: 10.0, 3: 10.0, 4: 28.0, 6: 46.0, 7: 28.0, 8: 60.0}
    for t, var in expected.items():
        assert mech.noise_std(t) ** 2 == pytest.approx(var, rel=GRID_PAD)
        assert abs(r[t - 1].var() - var) < variance_tolerance(mech.noise_scales(t), "laplace", N_REPS)
    # Step 3 releases A = root0 + root1 (Lap(1) + Lap(2), variance 10); step 4
    # releases A + B, B ~ Lap(3) (variance 18), so cov = 10. Var(A(A+B)) =
    # E[A⁴] − σ_A⁴ + σ_A²σ_B² = 2σ_A⁴ + κ4(A) + σ_A²σ_B², κ4(A) = 3(2² + 8²).
    var_xy = 2 * 10.0**2 + 3 * (2.0**2 + 8.0**2) + 10.0 * 18.0
    assert abs(np.cov(r[2], r[3])[0, 1] - 10.0) < 5 * math.sqrt(var_xy / N_REPS)


def test_secure_noise_tree_variance():
    n = 20000
    mech = BinaryTreeMechanism(1.0, horizon=3, dim=n)
    r = sample_releases(mech, 3)
    b = 2.0
    for c in (1, 3):
        var = 2 * b * b * popcount(c)
        assert abs(r[c - 1].var() - var) < variance_tolerance([b] * popcount(c), "laplace", n)


def test_ci_halfwidth_is_exact_laplace_sum_width():
    mech = BinaryTreeMechanism(1.0, horizon=1000, rng=ZeroNoise())
    assert mech.ci_halfwidth(1) == pytest.approx(10.0 * math.log(20), rel=GRID_PAD)
    assert mech.ci_halfwidth(7) == pytest.approx(laplace_sum_halfwidth([10.0] * 3), rel=GRID_PAD)
    unbounded = BinaryTreeMechanism(1.0, rng=ZeroNoise())
    assert unbounded.ci_halfwidth(6) == pytest.approx(laplace_sum_halfwidth([1.0, 2.0, 3.0, 3.0]), rel=GRID_PAD)
    assert unbounded.ci_halfwidth(6, level=0.5) < unbounded.ci_halfwidth(6)


# -- serialisation ---------------------------------------------------------------


CONFIGS = [
    dict(horizon=40, noise="laplace", dim=1),
    dict(horizon=40, noise="gaussian", delta=1e-6, dim=3),
    dict(horizon=None, noise="laplace", dim=1),
    dict(horizon=None, noise="gaussian", delta=1e-6, dim=2, calibration="analytic"),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("cut", [0, 1, 7, 8, 15, 16, 31])
def test_restored_mechanism_continues_identically(config, cut):
    total = 40
    data = np.random.default_rng(cut).normal(size=(total, config["dim"]))
    feed = data[:, 0] if config["dim"] == 1 else data

    full = BinaryTreeMechanism(1.5, rng=SeededNoise(np.random.default_rng(42)), **config)
    expected = run(full, feed)

    gen = np.random.default_rng(42)
    first = BinaryTreeMechanism(1.5, rng=SeededNoise(gen), **config)
    head = run(first, feed[:cut])
    state = json.loads(json.dumps(first.to_state()))
    assert state["mechanism"] == "tree" and state["version"] == 1 and state["t"] == cut
    restored = BinaryTreeMechanism.from_state(state, rng=gen)
    assert restored.t == cut
    assert restored.state_size() == first.state_size()
    tail = run(restored, feed[cut:])
    for got, want in zip(head + tail, expected):
        np.testing.assert_array_equal(got, want)
    assert restored.to_state() == full.to_state()


def test_restored_state_really_carries_the_nodes():
    mech = BinaryTreeMechanism(1.0, horizon=16, rng=ZeroNoise())
    run(mech, [1.0] * 5)
    state = mech.to_state()
    state["nodes"][0][0] += 100.0  # level 0 is live at t = 5
    restored = BinaryTreeMechanism.from_state(state, rng=ZeroNoise())
    assert restored.current() == 105.0
    state = mech.to_state()
    state["nodes"][1][0] += 100.0  # level 1 is open: a partial sum for step 6
    restored = BinaryTreeMechanism.from_state(state, rng=ZeroNoise())
    assert restored.current() == 5.0
    assert restored.step(1.0) == 106.0


def test_state_is_plain_and_pickles():
    mech = BinaryTreeMechanism(1.0, dim=2, noise="gaussian", delta=1e-5, rng=ZeroNoise())
    run(mech, [np.ones(2)] * 5)
    state = mech.to_state()
    assert json.loads(json.dumps(state)) == state
    for key in ("epsilon", "sensitivity", "horizon", "noise", "delta", "dim", "calibration", "t"):
        assert key in state
    # Whole mechanisms pickle too (a DoFn may be serialised), secure source included.
    secure = BinaryTreeMechanism(1.0, horizon=8)
    secure.step(1.0)
    copy = pickle.loads(pickle.dumps(secure))
    assert copy.current() == secure.current()
    copy.step(1.0)
    seeded = BinaryTreeMechanism(1.0, horizon=8, rng=4)
    seeded.step(1.0)
    clone = pickle.loads(pickle.dumps(seeded))
    assert clone.step(2.0) == seeded.step(2.0)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s: s.update(mechanism="hybrid"), "mechanism"),
        (lambda s: s.update(version=99), "version"),
        (lambda s: s.pop("nodes"), "nodes"),
        (lambda s: s.update(nodes=[[1.0]]), "nodes"),
        (lambda s: s.update(t=99), "t="),
        (lambda s: s.update(epsilon=-1), "epsilon"),
    ],
)
def test_from_state_rejects_bad_states(mutate, match):
    mech = BinaryTreeMechanism(1.0, horizon=16, rng=ZeroNoise())
    run(mech, [1.0] * 5)
    state = mech.to_state()
    mutate(state)
    with pytest.raises(ValueError, match=match):
        BinaryTreeMechanism.from_state(state, rng=ZeroNoise())


# -- validation ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(epsilon=0.0), "epsilon"),
        (dict(epsilon=-1.0), "epsilon"),
        (dict(epsilon=float("inf")), "epsilon"),
        (dict(epsilon="1"), "epsilon"),
        (dict(epsilon=1.0, sensitivity=-1.0), "sensitivity"),
        (dict(epsilon=1.0, sensitivity=float("nan")), "sensitivity"),
        (dict(epsilon=1.0, horizon=0), "horizon"),
        (dict(epsilon=1.0, horizon=2.5), "horizon"),
        (dict(epsilon=1.0, horizon=True), "horizon"),
        (dict(epsilon=1.0, noise="gauss"), "noise"),
        (dict(epsilon=1.0, delta=1e-6), "delta"),
        (dict(epsilon=1.0, noise="gaussian"), "delta"),
        (dict(epsilon=1.0, noise="gaussian", delta=0.0), "delta"),
        (dict(epsilon=1.0, noise="gaussian", delta=1.0), "delta"),
        (dict(epsilon=1.0, dim=0), "dim"),
        (dict(epsilon=1.0, dim=2.0), "dim"),
        (dict(epsilon=1.0, rng="seed"), "rng"),
        (dict(epsilon=1.0, rng=True), "rng"),
        (dict(epsilon=1.0, calibration="classical"), "calibration"),
    ],
)
def test_constructor_validation_names_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        BinaryTreeMechanism(**kwargs)


def test_laplace_accepts_zero_delta():
    assert BinaryTreeMechanism(1.0, delta=0, rng=ZeroNoise()).privacy_cost()["delta"] == 0.0


@pytest.mark.parametrize(
    "dim,x",
    [(1, float("nan")), (1, float("inf")), (1, [1.0, 2.0]), (1, "3"), (1, None), (3, [1.0, 2.0]), (3, 1.0), (3, [1.0, np.nan, 2.0])],
)
def test_step_rejects_bad_input_without_changing_state(dim, x):
    mech = BinaryTreeMechanism(1.0, horizon=8, dim=dim, rng=ZeroNoise())
    mech.step(np.ones(dim) if dim > 1 else 1.0)
    before = mech.to_state()
    with pytest.raises(ValueError, match="x must"):
        mech.step(x)
    assert mech.to_state() == before


@pytest.mark.parametrize("t", [0, -1, 1.5, True])
def test_noise_queries_validate_t(t):
    mech = BinaryTreeMechanism(1.0, rng=ZeroNoise())
    with pytest.raises(ValueError, match="t must"):
        mech.noise_std(t)
    with pytest.raises(ValueError, match="t must"):
        mech.release_nodes(t)


def test_name_and_levels():
    assert BinaryTreeMechanism.name == "tree"
    unbounded = BinaryTreeMechanism(1.0, rng=ZeroNoise())
    assert unbounded.levels == 1
    run(unbounded, [0.0] * 6)
    assert unbounded.levels == 3
    assert unbounded.t == 6


# -- skip: zero steps in O(log t) draws --------------------------------------------


SKIP_CASES = [(0, 1), (0, 7), (0, 8), (0, 100), (3, 5), (5, 3), (7, 9), (8, 8), (13, 50), (31, 1), (31, 33)]


@pytest.mark.parametrize("horizon", [150, None])
@pytest.mark.parametrize("before,n", SKIP_CASES)
def test_skip_with_zero_noise_gives_prefix_sums_and_the_state_of_zero_steps(horizon, before, n):
    rng = np.random.default_rng(before * 100 + n)
    xs = rng.normal(size=before + n + 10)
    xs[before:before + n] = 0.0
    skipped = BinaryTreeMechanism(1.0, horizon=horizon, rng=ZeroNoise())
    stepped = BinaryTreeMechanism(1.0, horizon=horizon, rng=ZeroNoise())
    head = run(skipped, xs[:before])
    assert head == run(stepped, xs[:before])
    skipped.skip(n)
    run(stepped, xs[before:before + n])
    assert skipped.t == stepped.t == before + n
    # Without noise the state is exact partial sums: skipping must leave the
    # very state n zero steps leave (including folded roots when unbounded).
    assert skipped.to_state() == stepped.to_state()
    tail = run(skipped, xs[before + n:])
    expected = np.cumsum(xs)
    np.testing.assert_allclose(head + tail, np.concatenate([expected[:before], expected[before + n:]]),
                               rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("horizon", [1000, None])
def test_skip_state_matches_zero_steps_for_random_splits(horizon):
    rng = np.random.default_rng(11)
    for _ in range(60):
        before, n, dim = int(rng.integers(0, 200)), int(rng.integers(0, 400)), int(rng.integers(1, 3))
        a = BinaryTreeMechanism(1.0, horizon=horizon, dim=dim, rng=ZeroNoise())
        b = BinaryTreeMechanism(1.0, horizon=horizon, dim=dim, rng=ZeroNoise())
        for x in rng.normal(size=(before, dim)):
            a.step(x)
            b.step(x)
        a.skip(n)
        run(b, [np.zeros(dim)] * n)
        assert a.to_state() == b.to_state()


def covariance_of_shared_nodes(mech, t0, t1):
    """Covariance of the releases at t0 and t1: the variance of the nodes both sum (§1.3)."""
    factor = 2.0 if mech.noise == "laplace" else 1.0
    nodes0 = dict(zip(mech.release_nodes(t0), mech.noise_scales(t0)))
    nodes1 = set(mech.release_nodes(t1))
    return sum(factor * s * s for node, s in nodes0.items() if node in nodes1)


SKIP_CONFIGS = [
    dict(horizon=100, noise="laplace"),
    dict(horizon=None, noise="laplace"),
    dict(horizon=100, noise="gaussian", delta=1e-6),
    dict(horizon=None, noise="gaussian", delta=1e-6),
]


@pytest.mark.parametrize("config", SKIP_CONFIGS)
@pytest.mark.parametrize("before,n,after", [(0, 5, 3), (0, 31, 2), (6, 9, 4), (11, 20, 1), (9, 54, 3)])
def test_skip_release_noise_has_the_distribution_of_zero_steps(config, before, n, after):
    # Each coordinate of a dim-N mechanism is an independent run (module
    # docstring), so one mechanism gives N seeded samples of every release.
    reps = 20000
    mech = BinaryTreeMechanism(1.0, dim=reps, rng=SeededNoise(before * 1000 + n * 10 + after), **config)
    released = sample_releases(mech, before)
    mech.skip(n)
    later = sample_releases(mech, after)
    for j in range(1, after + 1):
        t = before + n + j
        r = later[j - 1]
        sigma = mech.noise_std(t)
        # The sample std's standard error is SE(s²)/(2σ) (delta method), SE(s²)
        # as in variance_tolerance (which already takes 5 of them).
        tol = variance_tolerance(mech.noise_scales(t), mech.noise, reps) / (2 * sigma)
        assert abs(r.std() - sigma) < tol
        assert abs(r.mean()) < 5 * sigma / math.sqrt(reps)
        if before:
            # Nodes alive before the skip are kept, not redrawn: the release
            # before the skip still shares exactly their variance with the one
            # after. Tolerance: 5 standard errors of the sample covariance,
            # estimated from the products themselves.
            x, y = released[before - 1], r
            expected = covariance_of_shared_nodes(mech, before, t)
            assert abs(np.mean(x * y) - expected) < 5 * np.std(x * y) / math.sqrt(reps)
    if config["noise"] == "laplace" and not before:
        # A fresh skip followed by one step: the release is a sum of
        # independent Laplaces of the stated scales; compare its whole law with
        # a direct sample of that sum (two-sample KS; under the null the
        # p-value is uniform, and the seeds are fixed).
        t = n + 1
        gen = np.random.default_rng(t)
        direct = sum(gen.laplace(0.0, s, reps) for s in mech.noise_scales(t))
        assert stats.ks_2samp(later[0], direct).pvalue > 1e-3


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("before,n", [(0, 13), (5, 11), (8, 23)])
def test_state_round_trip_after_skip(config, before, n):
    data = np.random.default_rng(n).normal(size=(40, config["dim"]))
    feed = data[:, 0] if config["dim"] == 1 else data
    gen = np.random.default_rng(5)
    mech = BinaryTreeMechanism(1.5, rng=SeededNoise(gen), **config)
    run(mech, feed[:before])
    mech.skip(n)
    state = json.loads(json.dumps(mech.to_state()))
    assert state["t"] == before + n
    restored = BinaryTreeMechanism.from_state(state, rng=np.random.default_rng(9))
    original_tail = BinaryTreeMechanism.from_state(mech.to_state(), rng=np.random.default_rng(9))
    np.testing.assert_array_equal(restored.current(), mech.current())
    for x in feed[before + n:before + n + 5]:
        np.testing.assert_array_equal(restored.step(x), original_tail.step(x))
    assert restored.to_state() == original_tail.to_state()


@pytest.mark.parametrize("n", [1, 2, 7, 8, 1000, 2**20 - 1, 2**20])
def test_fresh_skip_draws_one_noise_per_live_node(n):
    counting = CountingNoise()
    mech = BinaryTreeMechanism(1.0, horizon=2**20, rng=counting)
    mech.skip(n)
    # After zeros only, the live nodes of release n are all the state holds,
    # and each is one fresh draw of its level's scale: popcount(n) <= h draws.
    assert len(counting.draws) == popcount(n) <= mech.levels
    assert sorted(s for _, s, _ in counting.draws) == sorted(mech.noise_scales(n))


@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 1000, 10**6])
def test_fresh_unbounded_skip_draws_roots_and_live_nodes(n):
    counting = CountingNoise()
    mech = BinaryTreeMechanism(1.0, noise="gaussian", delta=1e-6, rng=counting)
    mech.skip(n)
    # One root per completed epoch plus the current epoch's live nodes: the
    # nodes of release n, ⌊log2 n⌋ + popcount(...) <= 2·log2(n) + 1.
    assert len(counting.draws) == len(mech.release_nodes(n)) <= 2 * math.log2(n) + 1
    assert sorted(s for _, s, _ in counting.draws) == sorted(mech.noise_scales(n))
    assert mech.state_size() <= math.floor(math.log2(n)) + 2


@pytest.mark.parametrize("horizon", [2**16, None])
def test_skip_after_steps_draws_at_most_log_many(horizon):
    rng = np.random.default_rng(3)
    for _ in range(40):
        counting = CountingNoise()
        mech = BinaryTreeMechanism(1.0, horizon=horizon, rng=counting)
        before = int(rng.integers(0, 600))
        n = int(rng.integers(0, 2**16 - before))
        run(mech, [1.0] * before)
        mech.skip(n)
        drawn = len(counting.draws) - before
        t = before + n
        # Bounded: at most one per level. Unbounded: at most one per level of
        # each epoch the skip enters, i.e. a root per completed epoch plus the
        # levels of the last one.
        bound = mech.levels if horizon is not None else 2 * max(t, 1).bit_length()
        assert drawn <= bound


def test_skip_zero_and_validation_leave_the_state_unchanged():
    mech = BinaryTreeMechanism(1.0, horizon=10, rng=4)
    run(mech, [1.0, 2.0, 3.0])
    before = mech.to_state()
    mech.skip(0)
    assert mech.to_state() == before
    for bad in (-1, 1.5, True, "2", None):
        with pytest.raises(ValueError, match="n must"):
            mech.skip(bad)
    with pytest.raises(ValueError, match="horizon exceeded"):
        mech.skip(8)
    assert mech.to_state() == before
    mech.skip(7)
    assert mech.t == 10
    with pytest.raises(ValueError, match="horizon exceeded"):
        mech.step(0.0)


def test_skip_numpy_int_and_repeated_skips_compose():
    a = BinaryTreeMechanism(1.0, rng=ZeroNoise())
    b = BinaryTreeMechanism(1.0, rng=ZeroNoise())
    a.step(3.0)
    b.step(3.0)
    a.skip(np.int64(4))
    a.skip(10)
    b.skip(14)
    assert a.t == b.t == 15
    assert a.to_state() == b.to_state()


def test_keyed_nodes_are_exact_grid_values_for_off_grid_inputs():
    """With the keyed source each noisy node is round(exact) + noise on the
    noise grid, exactly; without the rounding an input such as 0.1 would show
    through as the node's offset from the grid (the old behaviour)."""
    from fractions import Fraction

    from dp_beam.mechanisms import KeyedNoise, NoiseKey
    from dp_beam.mechanisms.noise_grid import grid_exponent

    for noise, delta in (("laplace", None), ("gaussian", 1e-6)):
        mech = BinaryTreeMechanism(0.01, sensitivity=1.0, horizon=64, noise=noise, delta=delta,
                                   rng=KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("tree", noise)))
        exponent = grid_exponent(mech.noise_scales(1)[0])
        for t in range(1, 40):
            mech.step(0.1 * t + 1.0 / 3.0)
            live = [v for i, v in enumerate(mech._nodes[:, 0]) if (t >> i) & 1]
            for value in live:
                assert (Fraction(value) / Fraction(2) ** exponent).denominator == 1


@pytest.mark.parametrize("horizon", [16, None])
def test_set_noise_source_equals_a_state_round_trip(horizon):
    """The release DoFn swaps in each step's keyed source instead of restoring
    the mechanism from its state: the releases must be bit-for-bit the same."""
    from dp_beam.mechanisms import BLTMechanism, KeyedNoise, NoiseKey

    key = NoiseKey.from_bytes(bytes(32))
    for make in (lambda: BinaryTreeMechanism(1.0, horizon=horizon),
                 lambda: BLTMechanism(1.0, horizon=horizon, noise="gaussian", delta=1e-6)):
        swapped, restored = make(), make()
        for step in range(12):
            rng = KeyedNoise(key, ("step", step))
            swapped.set_noise_source(rng)
            restored = type(restored).from_state(restored.to_state(), rng=KeyedNoise(key, ("step", step)))
            x = 0.3 * step
            assert swapped.step(x) == restored.step(x)


@pytest.mark.parametrize("horizon", [72, 1000, None])
@pytest.mark.parametrize("source", ["seed", "keyed"])
def test_scalar_step_is_bit_for_bit_the_array_step(horizon, source):
    """A float input takes the scalar path (``_step_scalar``), a one-element array the array
    path: same releases, same states, same noise draws, to the last bit. Horizon 1000 and the
    unbounded stream reach popcounts >= 8, where the scalar path defers to NumPy's pairwise
    sum; the unbounded one also closes epochs."""
    from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

    def make():
        rng = (KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("tree", "scalar"))
               if source == "keyed" else 7)
        return BinaryTreeMechanism(epsilon=0.7, sensitivity=3.0, horizon=horizon, rng=rng)

    scalar, array = make(), make()
    values = np.random.default_rng(3).normal(0.0, 50.0, size=1000)
    values[::7] = 0.0
    for x in values[:horizon or len(values)]:
        a, b = scalar.step(float(x)), array.step(np.array([x]))
        assert type(a) is float and a.hex() == b.hex()
    assert json.dumps(scalar.to_state()) == json.dumps(array.to_state())
    with pytest.raises(ValueError, match="finite"):
        scalar.step(math.nan)


@pytest.mark.parametrize("horizon", [64, None])
@pytest.mark.parametrize("dim", [1, 2])
def test_list_paths_and_array_readers_interleave(horizon, dim):
    """Between list-path steps the nodes live in Python floats; every reader of the array
    (the array step, ``current``, ``to_state``, ``skip``, ``state_size``) must see them, and
    the next list step must continue from what those readers left. One stream mixes them
    all, another takes the array path only: the same releases and states, bit for bit."""
    from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

    def make():
        return BinaryTreeMechanism(epsilon=0.7, sensitivity=2.0, horizon=horizon, dim=dim,
                                   rng=KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("mix", dim)))

    mixed, array = make(), make()
    values = np.random.default_rng(11).normal(0.0, 5.0, size=(60, dim))
    for t, x in enumerate(values):
        as_list = float(x[0]) if dim == 1 else x.tolist()
        if t % 6 == 1:
            a, b = mixed.step(x.copy()), array.step(x.copy())
        elif t % 6 == 3:
            assert json.dumps(mixed.to_state()) == json.dumps(array.to_state())
            a, b = mixed.step(as_list), array.step(x.copy())
        elif t % 6 == 5:
            mixed.skip(1)
            array.skip(1)
            a, b = mixed.current(), array.current()
        else:
            a, b = mixed.step(as_list), array.step(x.copy())
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        assert np.asarray(mixed.current()).tobytes() == np.asarray(b).tobytes()
        assert mixed.state_size() == array.state_size()
    assert json.dumps(mixed.to_state()) == json.dumps(array.to_state())


@pytest.mark.parametrize("dim", [1, 3])
def test_a_list_step_that_raises_leaves_the_state_unchanged(dim):
    """A draw that fails (here a planted error on the fourth node) must not leave the list
    path's nodes half updated: retried, the step releases what an unfailing stream does."""

    class FailOnce(SeededNoise):
        def __init__(self, seed):
            super().__init__(seed)
            self.calls = 0

        def float_noise(self, kind, scale, size):
            self.calls += 1
            if self.calls == 4:
                raise OverflowError("planted")
            return super().float_noise(kind, scale, size)

    failing = BinaryTreeMechanism(epsilon=1.0, horizon=16, dim=dim, rng=FailOnce(9))
    clean = BinaryTreeMechanism(epsilon=1.0, horizon=16, dim=dim, rng=9)
    for t in range(10):
        x = 1.5 * t + 0.25
        x = x if dim == 1 else [x, -x, 2.0][:dim]
        if t == 3:
            with pytest.raises(OverflowError, match="planted"):
                failing.step(x)
            assert failing.t == 3
        assert np.asarray(failing.step(x)).tobytes() == np.asarray(clean.step(x)).tobytes()
    assert json.dumps(failing.to_state()) == json.dumps(clean.to_state())


@pytest.mark.parametrize("horizon", [72, 1000, None])
@pytest.mark.parametrize("source", ["seed", "keyed"])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("dim", [2, 3])
def test_list_step_is_bit_for_bit_the_array_step(horizon, source, noise, dim):
    """A list of floats takes the row path (``_step_rows``), an array the array path: same
    releases (arrays), same states, same noise draws, to the last bit; popcounts >= 8 (horizon
    1000, unbounded) defer to NumPy's pairwise sum, and the unbounded stream closes epochs."""
    from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey

    def make():
        rng = (KeyedNoise(NoiseKey.from_bytes(bytes(range(32))), ("tree", "rows", noise, dim))
               if source == "keyed" else 7)
        delta = 1e-6 if noise == "gaussian" else None
        return BinaryTreeMechanism(epsilon=0.7, sensitivity=3.0, horizon=horizon, noise=noise,
                                   delta=delta, dim=dim, rng=rng)

    rows, array = make(), make()
    values = np.random.default_rng(dim).normal(0.0, 50.0, size=(1000, dim))
    values[::7] = 0.0
    values[::11, 0] = -0.0
    for x in values[:horizon or len(values)]:
        a, b = rows.step(x.tolist()), array.step(x.copy())
        assert type(a) is np.ndarray and a.shape == (dim,) and a.tobytes() == b.tobytes()
    assert json.dumps(rows.to_state()) == json.dumps(array.to_state())
    with pytest.raises(ValueError, match="finite"):
        rows.step([math.nan] + [0.0] * (dim - 1))
