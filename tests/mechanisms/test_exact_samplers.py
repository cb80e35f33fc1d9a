"""Exact samplers on a keyed bit stream (dp_beam.mechanisms.exact_samplers).

Every key here is fixed, so every test is deterministic: a statistical test
either always passes or always fails. Tolerances are still taken from theory
so that a correct sampler passes for all but a negligible fraction of keys:
moment checks allow 5 standard errors of the estimator (two-sided
probability ~6e-7 under a normal approximation), goodness-of-fit tests
require a p-value above 1e-6, and frequency checks use a Clopper-Pearson
interval of confidence 1 − 1e-6.
"""


import hashlib
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dp_beam.mechanisms.exact_samplers import (
    BitStream,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    sample_bernoulli_exp,
    sample_discrete_gaussian,
    sample_discrete_laplace,
)
from dp_beam.mechanisms.noise_grid import integer_ratio
from dp_beam.mechanisms.noise_key import KeyedNoise, NoiseKey, encode_identity


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


# -- frozen reference: the same values from the same bits ---------------------------
#
# A copy of the samplers as first written (a plain bit pool, one BLAKE2b block
# per refill, one method call per read). The production code may read the
# stream faster, but it must return the same values and consume exactly the
# same bits, so every later draw on a stream (and every release under a fixed
# key) is unchanged. Only the reference depends on nothing in the package but
# the identity encoding.


class _RefBits:
    def __init__(self, key_bytes, *identity):
        self._prefix = encode_identity(identity)
        self._key = key_bytes
        self._block = 0
        self._pool = 0
        self._available = 0

    def randbits(self, k):
        while self._available < k:
            digest = hashlib.blake2b(self._prefix + self._block.to_bytes(8, "big"), key=self._key,
                                     digest_size=64, person=b"dp_beam.noise.v1").digest()
            self._block += 1
            self._pool = (self._pool << 512) | int.from_bytes(digest, "big")
            self._available += 512
        self._available -= k
        value = self._pool >> self._available
        self._pool &= (1 << self._available) - 1
        return value

    def randbelow(self, n):
        k = (n - 1).bit_length()
        while True:
            value = self.randbits(k)
            if value < n:
                return value


def _ref_bernoulli_exp_at_most_one(bits, num, den):
    k = 1
    while bits.randbelow(den * k) < num:
        k += 1
    return k & 1 == 1


def _ref_bernoulli_exp(bits, num, den):
    whole, num = divmod(num, den)
    for _ in range(whole):
        if not _ref_bernoulli_exp_at_most_one(bits, 1, 1):
            return False
    return _ref_bernoulli_exp_at_most_one(bits, num, den)


def _ref_discrete_laplace(bits, t, s):
    while True:
        u = bits.randbelow(t)
        if not _ref_bernoulli_exp_at_most_one(bits, u, t):
            continue
        v = 0
        while _ref_bernoulli_exp_at_most_one(bits, 1, 1):
            v += 1
        y = (u + t * v) // s
        negative = bits.randbits(1)
        if negative and y == 0:
            continue
        return -y if negative else y


def _ref_discrete_gaussian(bits, p, q):
    t = math.isqrt(p // q) + 1
    den = 2 * p * q * t * t
    qt = q * t
    while True:
        y = _ref_discrete_laplace(bits, t, 1)
        diff = abs(y) * qt - p
        if _ref_bernoulli_exp(bits, diff * diff, den):
            return y


def _ref_grid(scale, power):
    # k = floor(log2 scale) − 30 and the exact ratio (scale/2^k)^power.
    k = math.frexp(scale)[1] - 1 - 30
    ratio = (Fraction(scale) / Fraction(2) ** k) ** power
    return k, ratio.numerator, ratio.denominator


def _same_draws(sampler, reference, args, identity, n=2000):
    stream, bits = KEY.stream(*identity), _RefBits(KEY_BYTES, *identity)
    got = [sampler(stream, *args) for _ in range(n)]
    want = [reference(bits, *args) for _ in range(n)]
    assert got == want
    # The same bits were consumed: the stream continues identically.
    assert stream.randbits(64) == bits.randbits(64)
    assert stream.randbits(700) == bits.randbits(700)


_LAPLACE_SCALES = [(1, 1), (1, 2), (7, 3), (3, 7), (10, 1), (1, 1000),
                   (2**31 - 1, 3), (2**40 + 12345, 1), (2**33 + 1, 2**20 + 7),
                   _ref_grid(7.2, 1)[1:], _ref_grid(0.1, 1)[1:], _ref_grid(1000.0, 1)[1:]]


@pytest.mark.parametrize("t, s", _LAPLACE_SCALES)
def test_discrete_laplace_matches_the_frozen_reference(t, s):
    _same_draws(discrete_laplace, _ref_discrete_laplace, (t, s), ("ref-dlap", t, s))


_GAUSSIAN_SCALES = [(1, 4), (1, 1), (5, 2), (49, 4), (100, 1), (7, 1000),
                    _ref_grid(3.1, 2)[1:], _ref_grid(0.37, 2)[1:],
                    integer_ratio(1.5, -60, 2), integer_ratio(0.3, -30, 2)]


@pytest.mark.parametrize("p, q", _GAUSSIAN_SCALES)
def test_discrete_gaussian_matches_the_frozen_reference(p, q):
    _same_draws(discrete_gaussian, _ref_discrete_gaussian, (p, q), ("ref-dgauss", p, q))


@pytest.mark.parametrize("num, den", [(0, 1), (1, 3), (1, 1), (5, 2), (7, 1), (22, 7),
                                      (10**6 + 1, 10**5), (3 * 2**61 + 5, 2**60)])
def test_bernoulli_exp_matches_the_frozen_reference(num, den):
    _same_draws(bernoulli_exp, _ref_bernoulli_exp, (num, den), ("ref-bern", num, den), n=3000)


def test_bit_stream_reads_match_the_frozen_reference():
    stream, bits = KEY.stream("ref-bits"), _RefBits(KEY_BYTES, "ref-bits")
    rng = random.Random(0)
    for i in range(4000):
        op = i % 4
        if op == 0:
            k = rng.randrange(1200)
            assert stream.randbits(k) == bits.randbits(k)
        elif op == 1:
            n = rng.randrange(1, 2 ** rng.randrange(1, 200))
            assert stream.randbelow(n) == bits.randbelow(n)
        elif op == 2:
            assert stream.randbelow(1) == bits.randbelow(1) == 0
        else:
            n = rng.randrange(70)
            assert stream.randbytes(n) == bits.randbits(8 * n).to_bytes(n, "big")
    assert stream.randbits(64) == bits.randbits(64)


def _keyed_reference(identity, call, reference, args, size):
    bits = _RefBits(KEY_BYTES, *identity, call)
    return [reference(bits, *args) for _ in range(size)]


#: kind -> (power of the scale in the grid ratio, frozen reference sampler)
_KEYED_REFERENCES = {"laplace": (1, _ref_discrete_laplace), "gaussian": (2, _ref_discrete_gaussian)}


@pytest.mark.parametrize("kind, scale", [("laplace", b) for b in (7.2, 1.0, 0.1, 1000.0, 3.7e-5)]
                         + [("gaussian", sigma) for sigma in (3.1, 1.0, 0.37, 2500.0)])
def test_keyed_draws_match_the_frozen_reference(kind, scale):
    source = KeyedNoise(KEY, ("ref-keyed", kind, scale))
    power, reference = _KEYED_REFERENCES[kind]
    k, a, b = _ref_grid(scale, power)
    for call, size in enumerate([1, 1, 1000, 1, 1000]):
        want = [math.ldexp(float(z), k)
                for z in _keyed_reference(source.identity, call, reference, (a, b), size)]
        assert getattr(source, kind)(scale, size).tolist() == want


@pytest.mark.parametrize("kind, scale, exponent", [("gaussian", 1.5, -60), ("gaussian", 0.3, -30),
                                                   ("laplace", 1.5, -60), ("laplace", 7.2, -40)])
def test_keyed_integer_noise_matches_the_frozen_reference(kind, scale, exponent):
    source = KeyedNoise(KEY, ("ref-keyed", kind, scale, exponent))
    power = 1 if kind == "laplace" else 2
    ratio = (Fraction(scale) / Fraction(2) ** exponent) ** power
    reference = _ref_discrete_laplace if kind == "laplace" else _ref_discrete_gaussian
    for call in range(30):
        want = _keyed_reference(source.identity, call, reference,
                                (ratio.numerator, ratio.denominator), 77)
        assert source.integer_noise(kind, scale, exponent, 77) == want
