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

import functools
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


def _fill(stream, pool, available, bits):
    """``(pool, available)`` extended by the stream's next blocks to at least ``bits`` bits.

    The samplers keep a stream's pool in local variables while they draw
    (a method call per read cost more than the arithmetic); they pass it
    here and store it back before they return. Only the low ``available``
    bits of a pool are unread: the bits above them were read already and are
    cut off here rather than at every read, which saves two big-int
    operations per read.
    """
    hasher = stream._hasher
    block = stream._block
    if bits - available <= _BLOCK_BITS:
        # One block: the usual case, as the samplers' reads are shorter than a block.
        h = hasher.copy()
        h.update(block.to_bytes(8, "big"))
        stream._block = block + 1
        pool = ((pool & ((1 << available) - 1)) << _BLOCK_BITS) | int.from_bytes(h.digest(), "big")
        return pool, available + _BLOCK_BITS
    count = -((available - bits) // _BLOCK_BITS)
    digests = []
    for i in range(block, block + count):
        h = hasher.copy()
        h.update(i.to_bytes(8, "big"))
        digests.append(h.digest())
    stream._block = block + count
    fresh = count * _BLOCK_BITS
    pool = ((pool & ((1 << available) - 1)) << fresh) | int.from_bytes(b"".join(digests), "big")
    return pool, available + fresh


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

    # _pool: its low _available bits are the unread ones (see _fill);
    # _block: the counter of the next block to hash.
    __slots__ = ("_hasher", "_block", "_pool", "_available")

    def __init__(self, prefix_hasher):
        self._hasher = prefix_hasher
        self._block = 0
        self._pool = 0
        self._available = 0

    def randbits(self, k: int) -> int:
        """The next k bits as an int in [0, 2^k) (big-endian: earlier bits are higher)."""
        if k <= 0:
            if k == 0:
                return 0
            raise ValueError(f"k must be >= 0, got {k!r}")
        available = self._available
        if available < k:
            self._pool, available = _fill(self, self._pool, available, k)
        available -= k
        self._available = available
        return (self._pool >> available) & ((1 << k) - 1)

    def randbytes(self, n: int) -> bytes:
        """The next n bytes of the stream."""
        return self.randbits(8 * n).to_bytes(n, "big")

    def randbelow(self, n: int) -> int:
        """A uniform int in [0, n), by rejection of bit-length draws (no modulo bias)."""
        if n <= 0:
            raise ValueError(f"n must be >= 1, got {n!r}")
        k = (n - 1).bit_length()
        mask = (1 << k) - 1
        pool, available = self._pool, self._available
        # Each try succeeds with probability n/2^k > 1/2.
        while True:
            if available < k:
                pool, available = _fill(self, pool, available, k)
            available -= k
            value = (pool >> available) & mask
            if value < n:
                self._pool, self._available = pool, available
                return value


# The samplers below read the stream inline, with the pool in locals: every
# read is exactly BitStream.randbelow(n) (k = (n − 1).bit_length() bits per
# try, rejected while >= n) or randbits(1), in the order of the algorithm, so
# they consume the same bits as calls to those methods would.


def _bernoulli_exp_at_most_one(stream, num, den, first=1):
    """Bernoulli(exp(−num/den)) for 0 <= num <= den: CKS20 Algorithm 1, γ ∈ [0, 1].

    Draw A_k ~ Bernoulli(γ/k) for k = 1, 2, … until the first A_k = 0 and
    return whether that k is odd: P(first zero at k) = γ^(k−1)/(k−1)! −
    γ^k/k!, which summed over odd k is the series of exp(−γ). A caller that
    drew A_1, …, A_(first−1) = 1 itself continues with ``first``.
    """
    pool, available = stream._pool, stream._available
    k = first
    n = den * first
    # A_k = [randbelow(den·k) < num].
    while True:
        bits = (n - 1).bit_length()
        mask = (1 << bits) - 1
        while True:
            if available < bits:
                pool, available = _fill(stream, pool, available, bits)
            available -= bits
            value = (pool >> available) & mask
            if value < n:
                break
        if value >= num:
            break
        k += 1
        n += den
    stream._pool, stream._available = pool, available
    return k & 1 == 1


def _exp_minus_one_successes(stream, limit=None):
    """How many Bernoulli(exp(−1)) coins succeed before the first failure, stopping after
    ``limit`` successes if a limit is given.

    Each coin is :func:`_bernoulli_exp_at_most_one` with γ = 1. Without a
    limit the count V is geometric, P(V = v) = e^−v·(1 − e^−1).
    """
    pool, available = stream._pool, stream._available
    v = 0
    # v never equals a limit of None.
    while v != limit:
        # A_1 = [randbelow(1) < 1] reads no bits and is always 1: start at k = 2,
        # where A_k = [randbelow(k) == 0].
        k = 2
        while True:
            bits = (k - 1).bit_length()
            mask = (1 << bits) - 1
            while True:
                if available < bits:
                    pool, available = _fill(stream, pool, available, bits)
                available -= bits
                value = (pool >> available) & mask
                if value < k:
                    break
            if value:
                break
            k += 1
        if not k & 1:
            break
        v += 1
    stream._pool, stream._available = pool, available
    return v


def bernoulli_exp(stream: "BitStream", num: int, den: int) -> bool:
    """Bernoulli(exp(−num/den)) for num >= 0, den >= 1 (CKS20 Algorithm 1)."""
    whole, num = divmod(num, den)
    # exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)): one failure decides.
    if whole and _exp_minus_one_successes(stream, whole) < whole:
        return False
    return _bernoulli_exp_at_most_one(stream, num, den)


def _laplace_tail(stream):
    """``(V, negative)``: the geometric V of :func:`discrete_laplace`, then its sign bit."""
    v = _exp_minus_one_successes(stream)
    return v, stream.randbits(1)


class _Exhausted(Exception):
    pass


class _NoMoreBlocks:
    # The hasher of a stream of known bits only: reading past them raises.
    def copy(self):
        raise _Exhausted


def _tail_table(width):
    """For every ``width``-bit string, ``(V, negative, bits read)`` of :func:`_laplace_tail`
    on a stream that starts with it, or None where the tail reads past it.

    Built by running the tail itself on a stream of just those bits, so
    the table cannot disagree with it. Most tails are decided within 12
    bits (90%), and one table look-up replaces a few dozen bytecodes a bit.
    """
    table = []
    for bits in range(1 << width):
        stream = BitStream(_NoMoreBlocks())
        stream._pool, stream._available = bits, width
        try:
            v, negative = _laplace_tail(stream)
        except _Exhausted:
            table.append(None)
        else:
            table.append((v, negative, width - stream._available))
    return tuple(table)


_TAIL_BITS = 12
_TAIL_MASK = (1 << _TAIL_BITS) - 1
_TAIL = _tail_table(_TAIL_BITS)


def discrete_laplace(stream: "BitStream", t: int, s: int) -> int:
    """Z with P(Z = z) ∝ exp(−|z|·s/t) for ints t, s >= 1 (CKS20 Algorithm 2)."""
    t_bits = (t - 1).bit_length()
    t_mask = (1 << t_bits) - 1
    pool, available = stream._pool, stream._available
    while True:
        # u = randbelow(t).
        while True:
            if available < t_bits:
                pool, available = _fill(stream, pool, available, t_bits)
            available -= t_bits
            u = (pool >> available) & t_mask
            if u < t:
                break
        # Accepting u with probability exp(−u/t) and adding t·V with V
        # geometric (success 1 − e^−1) makes X = u + t·V geometric with
        # P(X = x) ∝ exp(−x/t); then ⌊X/s⌋ is geometric with ratio exp(−s/t).
        # The acceptance is _bernoulli_exp_at_most_one(u, t), inline: its
        # first try (k = 1) reads randbelow(t), of a known bit length.
        while True:
            if available < t_bits:
                pool, available = _fill(stream, pool, available, t_bits)
            available -= t_bits
            value = (pool >> available) & t_mask
            if value < t:
                break
        if value < u:
            # A_1 = 1: the coins from A_2 on decide.
            stream._pool, stream._available = pool, available
            accepted = _bernoulli_exp_at_most_one(stream, u, t, 2)
            pool, available = stream._pool, stream._available
            if not accepted:
                continue
        # V and the sign bit (_laplace_tail), looked up in _TAIL when the
        # next _TAIL_BITS bits decide them. Filling before the look-up reads
        # no bit, so it changes no value.
        if available < _TAIL_BITS:
            pool, available = _fill(stream, pool, available, _TAIL_BITS)
        tail = _TAIL[(pool >> (available - _TAIL_BITS)) & _TAIL_MASK]
        if tail is None:
            stream._pool, stream._available = pool, available
            v, negative = _laplace_tail(stream)
            pool, available = stream._pool, stream._available
        else:
            v, negative, used = tail
            available -= used
        y = (u + t * v) // s
        # A zero would be reached from both signs; rejecting one of them
        # gives 0 the same weight as every other magnitude.
        if negative:
            if y:
                stream._pool, stream._available = pool, available
                return -y
            continue
        stream._pool, stream._available = pool, available
        return y


def discrete_gaussian(stream: "BitStream", p: int, q: int) -> int:
    """Z with P(Z = z) ∝ exp(−z²/(2σ²)) for σ² = p/q, ints p, q >= 1 (CKS20 Algorithm 3)."""
    t, qt, den, den_bits, den_mask = _gaussian_constants(p, q)
    while True:
        y = discrete_laplace(stream, t, 1)
        diff = abs(y) * qt - p
        # bernoulli_exp(stream, diff², den), one call level fewer.
        whole, num = divmod(diff * diff, den)
        if whole and _exp_minus_one_successes(stream, whole) < whole:
            continue
        # _bernoulli_exp_at_most_one(stream, num, den) with its first coin inline, as in
        # discrete_laplace: A_1 = [randbelow(den) < num], and A_1 = 0 (the usual case)
        # accepts without another call.
        pool, available = stream._pool, stream._available
        while True:
            if available < den_bits:
                pool, available = _fill(stream, pool, available, den_bits)
            available -= den_bits
            value = (pool >> available) & den_mask
            if value < den:
                break
        stream._pool, stream._available = pool, available
        if value >= num or _bernoulli_exp_at_most_one(stream, num, den, 2):
            return y


@functools.lru_cache(maxsize=1024)
def _gaussian_constants(p, q):
    # A mechanism draws many values of one σ²: its constants are computed once.
    # t = ⌊σ⌋ + 1, exactly: ⌊√x⌋ = isqrt(⌊x⌋) for x >= 0.
    t = math.isqrt(p // q) + 1
    # Accept Y ~ DLap(t) with probability exp(−(|Y| − σ²/t)²/(2σ²)); over a
    # common denominator γ = (|Y|·q·t − p)² / (2·p·q·t²), all integers; then
    # the bit length and mask of randbelow(den), the first coin of the acceptance.
    den = 2 * p * q * t * t
    bits = (den - 1).bit_length()
    return t, q * t, den, bits, (1 << bits) - 1


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
