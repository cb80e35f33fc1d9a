"""Key-selection thresholds (dp_beam.mechanisms.key_selection.thresholds and
KeySelection.threshold): tail quantiles and the certified sparse-vector bounds.

Statistical tests are seeded, so they are deterministic; their thresholds are
still derived from the sampling distribution, stated in each test, so that a
correct implementation passes for almost every seed and the planted bugs
show that the tests can fail."""

import math

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms import KeySelection
from dp_beam.mechanisms.key_selection.thresholds import (laplace_tail_quantile,
                                                         sparse_vector_admission_bounds)

from .helpers import laplace_log_below, svt


# -- 2. thresholds -------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [365, None])
def test_gaussian_threshold_is_the_exact_normal_quantile(horizon):
    sel = KeySelection(1.0, 1e-6, noise="gaussian", horizon=horizon)
    assert sel.delta_per_key == pytest.approx(0.5e-6 / (1 + math.e), rel=1e-12)
    for t in (1, 2, 3, 100, 255, 365):
        std = math.sqrt(sum(s * s for s in sel.noise_scales(t)))
        p = sel.delta_per_key * sel.weight(t)
        assert sel.noise_std(t) == pytest.approx(std, rel=1e-6)
        assert sel.threshold(t) == pytest.approx(1.0 + std * stats.norm.isf(p), rel=1e-6)
        assert sel.tail_probability(t) == pytest.approx(p, rel=1e-15)


def test_laplace_single_node_threshold_is_exact():
    sel = KeySelection(1.0, 1e-6, horizon=365)
    b = 365 .bit_length() / 1.0
    p = 1e-6 / (1 + math.e) / 365
    # t = 1, 2, 4, …: one node; P(Lap(b) >= q) = ½·e^{−q/b} exactly.
    for t in (1, 2, 4, 256):
        assert sel.noise_scales(t) == pytest.approx([b], rel=1e-6)  # scales carry a grid pad of relative <= 2^-29·b/Δ (grid_padded_scale)
        assert sel.threshold(t) == pytest.approx(1.0 + b * math.log(1 / (2 * p)), rel=1e-6)


@pytest.mark.parametrize(
    "scales,p",
    [([1.0, 1.0], 0.3), ([1.0] * 3, 1e-3), ([7.0] * 5, 1e-9), ([1.0, 2.0, 3.0, 4.0, 4.0], 1e-6),
     ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 7.0, 7.0], 1e-15), ([0.5, 100.0], 1e-4), ([1.0] * 20, 1e-300)],
)
def test_laplace_chernoff_quantile_matches_a_brute_force_grid(scales, p):
    q = laplace_tail_quantile(scales, p)
    b = np.asarray(scales)
    # The bound holds at every s in (0, 1/max b); a fine grid's minimum is an
    # upper bound on the true minimum, which the solver must reach.
    s = np.linspace(1e-6, 1 - 1e-12, 400001) / b.max()
    grid = (-math.log(p) - np.log1p(-(s[:, None] * b) ** 2).sum(axis=1)) / s
    assert q <= grid.min() * (1 + 1e-9)
    assert q >= grid.min() * (1 - 1e-6)


@pytest.mark.parametrize("scales", [[1.0] * 3, [1.0, 2.0, 3.0, 4.0, 4.0], [9.0] * 6])
def test_laplace_chernoff_quantile_is_an_upper_bound_and_not_loose(scales):
    n, p = 2_000_000, 1e-3
    gen = np.random.default_rng(len(scales))
    z = sum(gen.laplace(0.0, b, n) for b in scales)
    q = laplace_tail_quantile(scales, p)
    # Upper bound: the empirical tail at q is at most p, up to 5 binomial SE.
    assert np.mean(z >= q) <= p + 5 * math.sqrt(p / n)
    # Not absurdly loose: within 2x of the Monte Carlo quantile (whose own
    # error is far below 1 % at n = 2e6 and p = 1e-3).
    exact = np.quantile(z, 1 - p)
    assert exact < q < 2 * exact


def test_unbounded_thresholds_rise_across_epochs_and_weights_sum_to_at_most_one():
    for noise in ("laplace", "gaussian"):
        sel = KeySelection(1.0, 1e-6, noise=noise)
        starts = [sel.threshold(2**j) for j in range(16)]
        assert all(a < b for a, b in zip(starts, starts[1:]))
        peaks = [max(sel.threshold(t) for t in range(2**j, 2 ** (j + 1))) for j in range(11)]
        assert all(a < b for a, b in zip(peaks, peaks[1:]))
    sel = KeySelection(1.0, 1e-6)
    gen = np.random.default_rng(0)
    total = 0.0
    for j in range(200):
        w = sel.weight(2**j)
        # One weight per epoch: check both ends and a random inner step.
        inner = 2**j + (2**j * int(gen.integers(0, 1000))) // 1000
        assert sel.weight(2 ** (j + 1) - 1) == sel.weight(inner) == w == 2.0 ** (-(2 * j + 1))
        total += 2**j * w
    assert total <= 1.0
    assert total == pytest.approx(1.0, rel=1e-12)
    bounded = KeySelection(1.0, 1e-6, horizon=365)
    assert math.fsum(bounded.weight(t) for t in range(1, 366)) <= 1.0 + 1e-12


def test_threshold_cache_is_exact_per_pattern():
    fresh = KeySelection(1.0, 1e-6, horizon=1000)
    cached = KeySelection(1.0, 1e-6, horizon=1000)
    values = [cached.threshold(t) for t in range(1, 1001)]
    assert len(cached._quantiles) == 9  # popcounts 1..9
    for t in (7, 11, 1000):
        assert KeySelection(1.0, 1e-6, horizon=1000).threshold(t) == values[t - 1] == fresh.threshold(t)


# -- 9. thresholds --------------------------------------------------------------------------


def test_sparse_vector_thresholds_bounded_are_one_value_and_unbounded_rise_by_epoch():
    bounded = svt(horizon=365)
    tau = bounded.threshold(1)
    assert tau == pytest.approx(46.1, abs=0.05)
    assert all(bounded.threshold(t) == tau for t in (2, 3, 100, 255, 365))
    unbounded = svt()
    b = unbounded.step_scale
    values = [unbounded.threshold(t) for t in range(1, 2**12)]
    assert all(x <= y for x, y in zip(values, values[1:]))
    for t in (1, 2, 3, 4, 7, 8, 1000, 2**40 + 5):
        j = t.bit_length() - 1
        assert unbounded.threshold(t) == pytest.approx(unbounded.threshold(1) + 2 * j * b * math.log(2),
                                                       rel=1e-12)
    # Far below the counter's thresholds at the same parameters (module docstring).
    counter = KeySelection(1.0, 1e-6, horizon=365)
    assert tau < min(counter.threshold(t) for t in range(1, 366)) / 3.9


@pytest.mark.parametrize("m,horizon", [(1, 365), (1, None), (4, 64), (2, 1)])
@pytest.mark.parametrize("delta", [1e-6, 0.4])
def test_sparse_vector_threshold_is_certified_and_not_loose(m, horizon, delta):
    sel = svt(1.0, delta, max_keys_per_unit=m, horizon=horizon)
    d1 = sel.delta_per_key
    lower, upper = sel.admission_bounds(1)
    # Claim 13/14: the certified bound on a one-unit key's admission is <= δ₁ ...
    assert lower <= upper <= d1
    # ... and tight: the bracket is within 0.5 % and τ is the smallest such value,
    # up to 1 % of b_ν (a lower τ has a *lower* bound above δ₁).
    assert lower >= 0.994 * d1
    below = sparse_vector_admission_bounds(sel.base_threshold() - 1 - 0.01 * sel.step_scale,
                                           sel.offset_scale, sel.step_scale, horizon, d1 * 1e-10)
    assert below[0] > d1
    # Claim 15: a key without data, run from the start, is admitted with δ₀ <= δ₁.
    assert sel.admission_bounds(0)[1] < d1


@pytest.mark.parametrize("a,b", [(0.5, 1.0), (10.0, 1.0), (40.0, 2.0), (3.0, 0.25)])
def test_bounds_bracket_the_closed_form_for_one_step(a, b):
    # One step, equal scales: P(Lap(b) − Lap(b) >= a) = (2 + a/b)·e^{−a/b}/4.
    exact = (2 + a / b) * math.exp(-a / b) / 4
    lower, upper = sparse_vector_admission_bounds(a, b, b, 1, exact * 1e-10)
    assert lower <= exact <= upper
    assert upper / lower < 1.006


@pytest.mark.parametrize("horizon", [5, 365])
def test_bounds_bracket_direct_integration_with_unequal_scales(horizon):
    from scipy import integrate
    br, bn, a = 1.5, 3.0, 30.0

    def integrand(r):
        return -math.expm1(horizon * laplace_log_below(a + r, bn)) * math.exp(-abs(r) / br) / (2 * br)

    exact = sum(integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-12, limit=500)[0]
                for lo, hi in [(-200, -a), (-a, 0), (0, 200)])
    lower, upper = sparse_vector_admission_bounds(a, br, bn, horizon, exact * 1e-10)
    assert lower <= exact <= upper and upper / lower < 1.006


def test_unbounded_bound_covers_every_finite_horizon_and_the_limit():
    br = bn = 2.0
    a = 30.0
    inf_lower, inf_upper = sparse_vector_admission_bounds(a, br, bn, None, 1e-20)

    def finite(steps):
        # The exact h over t = 1..steps with the unbounded shifts g(t) = 2j·b·ln 2.
        def h(x):
            log_none = 0.0
            for j in range(steps.bit_length()):
                n = min(2**(j + 1), steps + 1) - 2**j
                log_none += n * laplace_log_below(x + 2 * j * bn * math.log(2), bn)
            return -math.expm1(log_none)
        from scipy import integrate
        f = lambda r: h(a + r) * math.exp(-abs(r) / br) / (2 * br)  # noqa: E731
        return sum(integrate.quad(f, lo, hi, epsabs=0, epsrel=1e-11, limit=500)[0]
                   for lo, hi in [(-150, -a), (-a, 0), (0, 150)])

    values = [finite(2**k - 1) for k in (1, 4, 10, 20, 40)]
    assert all(x < y for x, y in zip(values, values[1:]))
    assert values[-1] <= inf_upper
    # Epoch j adds about 2^{−j}·S: by 2^40 steps the sum has converged.
    assert values[-1] >= inf_lower
