"""Exact samplers driven by a deterministic bit stream (no floating point).

The samplers of Canonne, Kamath & Steinke (2020), "The Discrete Gaussian for
Differential Privacy" (arXiv:2004.00010), Algorithms 1–3, in integer and
:class:`~fractions.Fraction` arithmetic: Bernoulli(exp(−γ)), the discrete
Laplace and the discrete Gaussian. They read their randomness from a
:class:`BitStream`, the keyed counter-mode stream of one draw identity that
:meth:`dp_beam.mechanisms.noise_key.NoiseKey.stream` opens, so the same
identity gives the same integers in every process (``docs/design.md``, D5).
The exactness argument is claim C-9 of ``docs/privacy/counting.md``.

The functions :func:`bernoulli_exp`, :func:`discrete_laplace`
and :func:`discrete_gaussian` take the scale as two ints (numerator and
denominator) for callers that cache it; :func:`sample_bernoulli_exp`,
:func:`sample_discrete_laplace` and :func:`sample_discrete_gaussian` take any
rational (int, Fraction or float, which is a dyadic rational).
"""

import math
import numbers
from fractions import Fraction
from typing import Union

__all__ = [
    "BitStream",
    "bernoulli_exp",
    "discrete_gaussian",
    "discrete_laplace",
    "exact_rational",
    "sample_bernoulli_exp",
    "sample_discrete_gaussian",
    "sample_discrete_laplace",
]

# A block of the stream is one BLAKE2b-512 digest.
_BLOCK_BITS = 8 * 64


class BitStream:
    """A deterministic stream of cryptographically random bits (one draw identity).

    The stream is ``B_0 ‖ B_1 ‖ …`` with ``B_i = BLAKE2b-512(key=K,
    person="dp_beam.noise.v1", data=encode_identity(identity) ‖ i)``, i an
    8-byte big-endian counter, read as one big-endian bit string. Keyed
    BLAKE2b is a PRF, so without K the bits are indistinguishable from
    uniform, and distinct identities give independent-looking streams.
    Obtain streams from :meth:`NoiseKey.stream`; a stream is consumed as it
    is read and is not picklable (it holds a hash state).

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("demo")
    >>> first = s.randbytes(64)          # exactly block 0
    >>> s.randbelow(10) in range(10), 0 <= s.randbits(5) < 32
    (True, True)
    """

    __slots__ = ("_hasher", "_block", "_pool", "_available")

    def __init__(self, prefix_hasher):
        self._hasher = prefix_hasher
        self._block = 0
        self._pool = 0
        self._available = 0

    def _refill(self, bits):
        while self._available < bits:
            block = self._hasher.copy()
            block.update(self._block.to_bytes(8, "big"))
            self._block += 1
            self._pool = (self._pool << _BLOCK_BITS) | int.from_bytes(block.digest(), "big")
            self._available += _BLOCK_BITS

    def randbits(self, k: int) -> int:
        """The next k bits as an int in [0, 2^k) (big-endian: earlier bits are higher)."""
        if k <= 0:
            if k == 0:
                return 0
            raise ValueError(f"k must be >= 0, got {k!r}")
        if self._available < k:
            self._refill(k)
        self._available -= k
        value = self._pool >> self._available
        self._pool &= (1 << self._available) - 1
        return value

    def randbytes(self, n: int) -> bytes:
        """The next n bytes of the stream."""
        return self.randbits(8 * n).to_bytes(n, "big")

    def randbelow(self, n: int) -> int:
        """A uniform int in [0, n), by rejection of bit-length draws (no modulo bias)."""
        if n <= 0:
            raise ValueError(f"n must be >= 1, got {n!r}")
        k = (n - 1).bit_length()
        # Each try succeeds with probability n/2^k > 1/2.
        while True:
            value = self.randbits(k)
            if value < n:
                return value


def _bernoulli_exp_at_most_one(stream, num, den):
    """Bernoulli(exp(−num/den)) for 0 <= num <= den: CKS20 Algorithm 1, γ ∈ [0, 1].

    Draw A_k ~ Bernoulli(γ/k) for k = 1, 2, … until the first A_k = 0 and
    return whether that k is odd: P(first zero at k) = γ^(k−1)/(k−1)! −
    γ^k/k!, which summed over odd k is the series of exp(−γ).
    """
    k = 1
    while stream.randbelow(den * k) < num:
        k += 1
    return k & 1 == 1


def bernoulli_exp(stream: "BitStream", num: int, den: int) -> bool:
    """Bernoulli(exp(−num/den)) for num >= 0, den >= 1 (CKS20 Algorithm 1)."""
    whole, num = divmod(num, den)
    # exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)): one failure decides.
    for _ in range(whole):
        if not _bernoulli_exp_at_most_one(stream, 1, 1):
            return False
    return _bernoulli_exp_at_most_one(stream, num, den)


def discrete_laplace(stream: "BitStream", t: int, s: int) -> int:
    """Z with P(Z = z) ∝ exp(−|z|·s/t) for ints t, s >= 1 (CKS20 Algorithm 2)."""
    while True:
        u = stream.randbelow(t)
        # Accepting u with probability exp(−u/t) and adding t·V with V
        # geometric (success 1 − e^−1) makes X = u + t·V geometric with
        # P(X = x) ∝ exp(−x/t); then ⌊X/s⌋ is geometric with ratio exp(−s/t).
        if not _bernoulli_exp_at_most_one(stream, u, t):
            continue
        v = 0
        while _bernoulli_exp_at_most_one(stream, 1, 1):
            v += 1
        y = (u + t * v) // s
        negative = stream.randbits(1)
        # A zero would be reached from both signs; rejecting one of them
        # gives 0 the same weight as every other magnitude.
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(stream: "BitStream", p: int, q: int) -> int:
    """Z with P(Z = z) ∝ exp(−z²/(2σ²)) for σ² = p/q, ints p, q >= 1 (CKS20 Algorithm 3)."""
    # t = ⌊σ⌋ + 1, exactly: ⌊√x⌋ = isqrt(⌊x⌋) for x >= 0.
    t = math.isqrt(p // q) + 1
    # Accept Y ~ DLap(t) with probability exp(−(|Y| − σ²/t)²/(2σ²)); over a
    # common denominator γ = (|Y|·q·t − p)² / (2·p·q·t²), all integers.
    den = 2 * p * q * t * t
    qt = q * t
    while True:
        y = discrete_laplace(stream, t, 1)
        diff = abs(y) * qt - p
        if bernoulli_exp(stream, diff * diff, den):
            return y


def exact_rational(name: str, value: Union[numbers.Rational, float], positive: bool) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (numbers.Rational, float)):
        raise ValueError(f"{name} must be an int, Fraction or float, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    # Floats are dyadic rationals, so this conversion is exact.
    value = Fraction(value)
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def sample_bernoulli_exp(stream: BitStream, gamma: Union[numbers.Rational, float]) -> bool:
    """True with probability exactly ``exp(−gamma)``, for rational gamma >= 0.

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "bern")
    >>> sample_bernoulli_exp(s, 0)
    True
    >>> isinstance(sample_bernoulli_exp(s, Fraction(3, 2)), bool)
    True
    """
    gamma = exact_rational("gamma", gamma, positive=False)
    return bernoulli_exp(stream, gamma.numerator, gamma.denominator)


def sample_discrete_laplace(stream: BitStream, scale: Union[numbers.Rational, float]) -> int:
    """An int Z with ``P(Z = z) ∝ exp(−|z|/scale)``, for rational scale > 0.

    The discrete Laplace of CKS20 (Algorithm 2, scale ``t/s``); its variance
    is ``2e^(−1/scale)/(1 − e^(−1/scale))²`` (≈ 2·scale² for large scales).

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "dlap")
    >>> isinstance(sample_discrete_laplace(s, Fraction(7, 2)), int)
    True
    """
    scale = exact_rational("scale", scale, positive=True)
    return discrete_laplace(stream, scale.numerator, scale.denominator)


def sample_discrete_gaussian(stream: BitStream,
                             sigma_squared: Union[numbers.Rational, float]) -> int:
    """An int Z with ``P(Z = z) ∝ exp(−z²/(2·sigma_squared))``, for rational sigma_squared > 0.

    The discrete Gaussian of CKS20 (Algorithm 3); its variance is below
    ``sigma_squared`` and within ``e^(−2π²σ²)``-small terms of it for σ >= 1.

    >>> from dp_beam.mechanisms.noise_key import NoiseKey
    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "dgauss")
    >>> isinstance(sample_discrete_gaussian(s, Fraction(9, 4)), int)
    True
    """
    sigma_squared = exact_rational("sigma_squared", sigma_squared, positive=True)
    return discrete_gaussian(stream, sigma_squared.numerator, sigma_squared.denominator)
