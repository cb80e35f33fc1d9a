"""Exact samplers on a keyed bit stream (dp_beam.mechanisms.exact_samplers).

Every key here is fixed, so every test is deterministic: a statistical test
either always passes or always fails. Tolerances are still taken from theory
so that a correct sampler passes for all but a negligible fraction of keys:
moment checks allow 5 standard errors of the estimator (two-sided
probability ~6e-7 under a normal approximation), goodness-of-fit tests
require a p-value above 1e-6, and frequency checks use a Clopper-Pearson
interval of confidence 1 − 1e-6.
"""


import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms.exact_samplers import (
    BitStream,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dp_beam.mechanisms.noise_key import NoiseKey


KEY_BYTES = bytes(range(32))
KEY = NoiseKey.from_bytes(KEY_BYTES)


def _tol(std_of_estimate):
    return 5.0 * std_of_estimate


# -- exact samplers ----------------------------------------------------------------


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(7), 0.75])
def test_bernoulli_exp_frequency(gamma):
    n = 20000
    stream = KEY.stream("bernoulli", str(gamma))
    hits = sum(sample_bernoulli_exp(stream, gamma) for _ in range(n))
    p = math.exp(-float(gamma))
    ci = stats.binomtest(hits, n).proportion_ci(confidence_level=1 - 1e-6, method="exact")
    assert ci.low <= p <= ci.high


def test_bernoulli_exp_validates_gamma():
    stream = KEY.stream("bad")
    for bad in (-1, Fraction(-1, 2), float("inf"), float("nan"), "1", True):
        with pytest.raises(ValueError, match="gamma"):
            sample_bernoulli_exp(stream, bad)


def _chi_square_pvalue(samples, support, pmf):
    """p-value of Pearson's test; cells with expected count < 5 are pooled into the tails."""
    n = len(samples)
    expected = n * pmf
    inner = np.nonzero(expected >= 5)[0]
    lo, hi = inner[0], inner[-1]
    counts = {}
    for z in samples:
        counts[z] = counts.get(z, 0) + 1
    observed = np.array([counts.get(int(z), 0) for z in support[lo:hi + 1]], dtype=float)
    exp_cells = expected[lo:hi + 1]
    below = sum(c for z, c in counts.items() if z < support[lo])
    above = sum(c for z, c in counts.items() if z > support[hi])
    observed = np.concatenate([[below], observed, [above]])
    # Tails of the exact pmf beyond the tabulated support are < 1e-30.
    exp_cells = np.concatenate([[expected[:lo].sum()], exp_cells, [expected[hi + 1:].sum()]])
    keep = exp_cells > 0
    assert observed[~keep].sum() == 0
    observed, exp_cells = observed[keep], exp_cells[keep]
    exp_cells *= observed.sum() / exp_cells.sum()
    return stats.chisquare(observed, exp_cells).pvalue


def _check_moments(samples, support, pmf):
    x = np.asarray(samples, dtype=float)
    n = len(x)
    var = float(np.sum(pmf * support**2))
    mu4 = float(np.sum(pmf * support**4))
    assert float(np.sum(pmf * support)) == pytest.approx(0.0, abs=1e-12)
    assert abs(x.mean()) < _tol(math.sqrt(var / n))
    # Var of the second-moment estimator (mean 0 known) is (μ4 − σ⁴)/n.
    assert abs(np.mean(x * x) - var) < _tol(math.sqrt((mu4 - var * var) / n))


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(1, 2), Fraction(7, 3), Fraction(5, 2), Fraction(10)])
def test_discrete_laplace_matches_the_exact_pmf(scale):
    n = 20000
    stream = KEY.stream("dlap", str(scale))
    samples = [sample_discrete_laplace(stream, scale) for _ in range(n)]
    assert all(isinstance(z, int) for z in samples)
    support = np.arange(-int(80 * scale) - 20, int(80 * scale) + 21)
    # scipy's dlaplace(a) has pmf tanh(a/2)·exp(−a|k|): scale 1/a.
    pmf = stats.dlaplace(1.0 / float(scale)).pmf(support)
    _check_moments(samples, support, pmf)
    assert _chi_square_pvalue(samples, support, pmf) > 1e-6


@pytest.mark.parametrize("sigma_squared", [Fraction(1, 4), Fraction(1), Fraction(5, 2), Fraction(49, 4), Fraction(100)])
def test_discrete_gaussian_matches_the_exact_pmf(sigma_squared):
    n = 20000
    stream = KEY.stream("dgauss", str(sigma_squared))
    samples = [sample_discrete_gaussian(stream, sigma_squared) for _ in range(n)]
    assert all(isinstance(z, int) for z in samples)
    sigma = math.sqrt(sigma_squared)
    support = np.arange(-int(40 * sigma) - 20, int(40 * sigma) + 21)
    # Exact pmf up to the normaliser, which is summed over ±40σ (the rest is < e^−800).
    weights = np.exp(-(support.astype(float) ** 2) / (2 * float(sigma_squared)))
    pmf = weights / weights.sum()
    _check_moments(samples, support, pmf)
    assert _chi_square_pvalue(samples, support, pmf) > 1e-6


def test_samplers_validate_their_parameter():
    stream = KEY.stream("bad")
    with pytest.raises(ValueError, match="scale"):
        sample_discrete_laplace(stream, 0)
    with pytest.raises(ValueError, match="sigma_squared"):
        sample_discrete_gaussian(stream, Fraction(-1))


def test_bit_stream_is_exported_type():
    assert isinstance(KEY.stream("x"), BitStream)
