"""Keyed, reproducible, exact noise: the same draw identity gives the same noise.

A Beam runner retries a failed bundle from its last committed state, while
side effects of the first attempt (a release already written downstream) may
have been published. Noise from OS entropy (:class:`~dp_beam.mechanisms.noise.SecureNoise`)
then differs between attempts: two releases of one step with independent
noise, an uncounted extra release whose average halves the noise variance.
Here every draw is a deterministic function of a secret key and a public
*draw identity* (transform label, stream key, step, ...), so a retried bundle
re-releases exactly the numbers of the first attempt, and publishing them
twice reveals nothing new.

Layers, bottom up:

* :class:`NoiseKey` — the secret; :meth:`NoiseKey.stream` turns it and an
  identity into a :class:`BitStream`, keyed BLAKE2b in counter mode
  (block i = BLAKE2b_K(encode_identity(identity) ‖ i), see :func:`encode_identity`).
* Exact samplers of Canonne, Kamath & Steinke (2020), "The Discrete Gaussian
  for Differential Privacy", Algorithms 1–3, in integer and
  :class:`~fractions.Fraction` arithmetic driven by the bit stream:
  :func:`sample_bernoulli_exp`, :func:`sample_discrete_laplace`,
  :func:`sample_discrete_gaussian`. No floating point enters a sampler.
* The grid: noise of scale b is released as ``Z·2^k`` with
  ``k = grid_exponent(b) = floor(log2 b) − GRID_PRECISION`` and Z an exact
  discrete Laplace (or Gaussian) integer of scale ``b/2^k`` ∈ [2^30, 2^31)
  (:func:`grid_laplace`, :func:`grid_gaussian`). A caller that adds it to
  :func:`round_to_grid` of its statistic gets a float that is a function of
  the integer ``R + Z`` alone, so the guarantee of the discrete mechanism
  covers the released float (Mironov 2012's attack has no low-order bits to
  read).
* :class:`KeyedNoise` — a :class:`~dp_beam.mechanisms.noise.NoiseSource`
  that a mechanism can use in place of ``SecureNoise``.

Privacy of the grid: rounding x and a neighbour x' to the grid moves each by
at most ``2^(k−1)``, so each rounded coordinate changes by at most its
exact change plus ``2^k``. If a privacy unit can change d coordinates of
the noised vector (for a tree: every node it touches), the rounded vector
has sensitivity at most ``Δ1 + d·2^k`` in L1 and ``Δ2 + √d·2^k`` in L2.
Discrete Laplace of scale b = Δ1/ε on it is therefore ``(Δ1 + d·2^k)/b``-DP:
ε grows by the factor ``1 + d·2^k/Δ1 <= 1 + d·2^−30/ε``; likewise ρ of the
discrete Gaussian by ``(1 + √d·2^k/Δ2)²``. For ε >= 2^−10 and d <= 2^10 the
factor is below 1 + 2^−10; a caller outside that range should calibrate for
the enlarged sensitivity.
"""

import base64
import binascii
import functools
import hashlib
import hmac
import math
import numbers
import os
import re
import secrets
import struct
from fractions import Fraction

import numpy as np

from .checks import check_scale, check_size
from .noise import NoiseSource

__all__ = [
    "NoiseKey",
    "BitStream",
    "KeyedNoise",
    "encode_identity",
    "sample_bernoulli_exp",
    "sample_discrete_laplace",
    "sample_discrete_gaussian",
    "GRID_PRECISION",
    "grid_exponent",
    "round_to_grid",
    "grid_laplace",
    "grid_gaussian",
    "grid_padded_scale",
]

#: G: the grid of noise of scale b is 2^k with k = floor(log2 b) − G, so its
#: spacing is at most b·2^−G and the integer noise has scale in [2^G, 2^(G+1)).
GRID_PRECISION = 30

# Personalisation strings (BLAKE2b's built-in domain separation, <= 16 bytes):
# the noise streams, the public fingerprint and the compression of long keys
# must never produce related outputs from one key.
_PERSON_STREAM = b"dp_beam.noise.v1"
_PERSON_FINGERPRINT = b"dp_beam.fprnt.v1"
_PERSON_LONG_KEY = b"dp_beam.lkey.v1"

_KEY_BYTES = 32
_BLAKE2B_MAX_KEY = 64
_BLOCK_BYTES = 64
_BLOCK_BITS = 8 * _BLOCK_BYTES
# Smallest exponent of a float64 bit: below it Z·2^k would not be exact.
_MIN_EXPONENT = -1074
# Integers of magnitude <= 2^53 are exact in float64.
_EXACT_INT = 1 << 53


# -- the key -------------------------------------------------------------------


def _key_bytes(value):
    if isinstance(value, str):
        raise ValueError(
            "noise_key must be bytes; decode hex or base64 text first "
            "(or use NoiseKey.from_env / NoiseKey.from_file)"
        )
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"noise_key must be bytes, got {type(value).__name__}")
    value = bytes(value)
    if len(value) < _KEY_BYTES:
        raise ValueError(f"noise_key must be at least {_KEY_BYTES} bytes (256 bits), got {len(value)}")
    return value


_HEX_TEXT = re.compile(r"[0-9a-fA-F]+")
_B64_TEXT = re.compile(r"[A-Za-z0-9+/]+={0,2}")
_B64URL_TEXT = re.compile(r"[A-Za-z0-9_-]+={0,2}")


def _parse_key_text(text, where):
    """Bytes of a key written as hex or base64 text; hex wins when both fit."""
    text = "".join(text.split())
    if not text:
        raise ValueError(f"noise_key: {where} is empty")
    # A hex string is also valid base64 (of other bytes), so hex is tried
    # first; a base64 key is hex-shaped with probability ~(22/64)^43.
    if _HEX_TEXT.fullmatch(text) and len(text) % 2 == 0:
        return _key_bytes(bytes.fromhex(text))
    padded = text + "=" * (-len(text) % 4)
    try:
        if _B64_TEXT.fullmatch(padded):
            raw = base64.b64decode(padded, validate=True)
        elif _B64URL_TEXT.fullmatch(padded):
            raw = base64.urlsafe_b64decode(padded)
        else:
            raw = None
    except (binascii.Error, ValueError):
        raw = None
    if raw is None:
        raise ValueError(f"noise_key: {where} is neither hex nor base64 text")
    try:
        return _key_bytes(raw)
    except ValueError as err:
        raise ValueError(f"{err} (decoded from {where})") from None


class NoiseKey:
    """A secret 256-bit key from which all noise of one release is derived.

    Everything the key produces is a deterministic function of it and of a
    public draw identity, so the key is the only secret protecting the
    noise: whoever holds it can subtract the noise and read the exact
    statistics. Keep it like the data.

    Hazards:

    * **One key per release, never reused on changed data.** Two runs with
      the same key and identities draw the same noise; if their data differ,
      the difference of their releases is the exact difference of the
      statistics. A re-run on corrected or grown data, or a second query over
      the same keys, needs a fresh key. Reuse is only safe for a retry or
      replay of the *same* computation on the *same* input, which is what
      the key exists for.
    * **A key generated at pipeline construction travels in the pipeline.**
      :meth:`generate` on the launching machine puts the key into the
      serialized DoFns, i.e. into the job graph and the staging location
      (and, for templates, the template file). Either those locations are
      secret, or the workers read the key themselves with :meth:`from_env`
      or :meth:`from_file` (e.g. from a secret mounted on the worker).

    Constructors: :meth:`generate` (32 bytes of OS entropy), :meth:`from_bytes`,
    :meth:`from_env` and :meth:`from_file` (hex or base64 text, or a raw
    binary file). Keys longer than 64 bytes (BLAKE2b's key limit) are first
    compressed with domain-separated BLAKE2b. The ``repr`` shows only a
    fingerprint (4 bytes of a BLAKE2b under another domain than the noise),
    enough to check that two workers hold the same key without revealing it.
    Instances are immutable, compare by key, and pickle (the key is in the
    pickle, see the hazards above).

    >>> key = NoiseKey.from_bytes(bytes(range(32)))
    >>> key
    NoiseKey(<secret>, fingerprint=f41f641e)
    >>> key.stream("release", "key-1", 7).randbits(16) == key.stream("release", "key-1", 7).randbits(16)
    True
    >>> NoiseKey.from_bytes(b"short")
    Traceback (most recent call last):
    ...
    ValueError: noise_key must be at least 32 bytes (256 bits), got 5
    """

    __slots__ = ("_key",)

    def __init__(self, key_bytes):
        key_bytes = _key_bytes(key_bytes)
        if len(key_bytes) > _BLAKE2B_MAX_KEY:
            key_bytes = hashlib.blake2b(
                key_bytes, digest_size=_BLAKE2B_MAX_KEY, person=_PERSON_LONG_KEY
            ).digest()
        self._key = key_bytes

    @classmethod
    def generate(cls):
        """A fresh key of 32 bytes from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def from_bytes(cls, key_bytes):
        """The key with these raw bytes (at least 32)."""
        return cls(key_bytes)

    @classmethod
    def from_env(cls, name):
        """The key written as hex or base64 text in environment variable ``name``.

        Whitespace is ignored; text made only of hex digits (even length) is
        read as hex, anything else as standard or URL-safe base64.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"noise_key: environment variable name must be a non-empty str, got {name!r}")
        text = os.environ.get(name)
        if text is None:
            raise ValueError(f"noise_key: environment variable {name!r} is not set")
        return cls(_parse_key_text(text, f"environment variable {name!r}"))

    @classmethod
    def from_file(cls, path):
        """The key stored in file ``path``: hex or base64 text, or raw bytes.

        A file whose content is printable ASCII and whitespace is text and
        must be valid hex or base64; anything else is used as raw key bytes
        (at least 32). Random raw bytes are all of that kind with probability
        (100/256)^32 < 2^−43, and a text key with a typo fails loudly instead
        of silently becoming a different raw key.
        """
        try:
            with open(path, "rb") as handle:
                content = handle.read()
        except OSError as err:
            raise ValueError(f"noise_key: cannot read key file {os.fspath(path)!r}: {err}") from None
        stripped = content.strip()
        # Printable ASCII or whitespace (a hex key may be wrapped over lines).
        if stripped and all(0x20 <= c < 0x7F or c in b"\t\n\r\x0b\x0c" for c in stripped):
            return cls(_parse_key_text(stripped.decode("ascii"), f"key file {os.fspath(path)!r}"))
        try:
            return cls(content)
        except ValueError as err:
            raise ValueError(f"{err} (raw key file {os.fspath(path)!r})") from None

    @property
    def fingerprint(self):
        """8 hex digits identifying the key; a hash under its own domain, not part of the noise."""
        return hashlib.blake2b(b"", key=self._key, digest_size=4, person=_PERSON_FINGERPRINT).hexdigest()

    def secret_hex(self):
        """The key bytes as hex text, to store it in a secret manager. Reveals the secret."""
        return self._key.hex()

    def stream(self, *identity):
        """The :class:`BitStream` of the draw named by the public labels ``identity``.

        Labels are str, bytes, int, float, bool, None, or tuples/lists of them
        (see :func:`encode_identity`); equal identities give equal streams in
        every process, different ones independent-looking streams.
        """
        return BitStream(self._prefix_hasher(encode_identity(identity)))

    def _prefix_hasher(self, encoded):
        hasher = hashlib.blake2b(key=self._key, digest_size=_BLOCK_BYTES, person=_PERSON_STREAM)
        hasher.update(encoded)
        return hasher

    def __repr__(self):
        return f"NoiseKey(<secret>, fingerprint={self.fingerprint})"

    def __eq__(self, other):
        if not isinstance(other, NoiseKey):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __hash__(self):
        return hash((NoiseKey, self.fingerprint))

    def __reduce__(self):
        return (NoiseKey, (self._key,))


# -- identity encoding and the bit stream ------------------------------------


def _encode_length(n):
    return n.to_bytes(8, "big")


def _encode_label(value, out):
    # Every label is a one-byte type tag followed by a self-delimiting body,
    # so the encoding of a tuple is injective and prefix-free: ("a", "bc")
    # and ("ab", "c") differ, and so do 1, 1.0, "1" and True.
    kind = type(value)
    # Exact built-in types first (the labels of every draw): the ABC checks
    # below cost more than the encoding itself.
    if kind is int:
        body = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out.append(b"I" + _encode_length(len(body)) + body)
    elif kind is str:
        body = value.encode("utf-8", "surrogatepass")
        out.append(b"S" + _encode_length(len(body)) + body)
    elif value is None:
        out.append(b"N")
    elif isinstance(value, (bool, np.bool_)):
        out.append(b"B\x01" if value else b"B\x00")
    elif isinstance(value, numbers.Integral):
        value = int(value)
        body = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out.append(b"I" + _encode_length(len(body)) + body)
    elif isinstance(value, (float, np.floating)):
        out.append(b"F" + struct.pack(">d", float(value)))
    elif isinstance(value, str):
        body = value.encode("utf-8", "surrogatepass")
        out.append(b"S" + _encode_length(len(body)) + body)
    elif isinstance(value, (bytes, bytearray, memoryview)):
        body = bytes(value)
        out.append(b"Y" + _encode_length(len(body)) + body)
    elif isinstance(value, (tuple, list)):
        out.append((b"T" if isinstance(value, tuple) else b"L") + _encode_length(len(value)))
        for item in value:
            _encode_label(item, out)
    else:
        raise ValueError(
            "identity labels must be str, bytes, int, float, bool, None or tuples/lists of them, "
            f"got {type(value).__name__}: {value!r}"
        )


def encode_identity(identity):
    """Canonical bytes of a draw identity (a tuple of public labels).

    Tag-and-length encoding, independent of the Python version, hash seed
    and platform: ``None`` → ``N``; bool → ``B`` + 1 byte; int → ``I`` +
    8-byte big-endian length + two's-complement big-endian bytes; float →
    ``F`` + IEEE-754 binary64 big-endian; str → ``S`` + length + UTF-8;
    bytes → ``Y`` + length + bytes; tuple/list → ``T``/``L`` + item count +
    items. NumPy integer, float and bool scalars encode like their Python
    counterparts.

    >>> encode_identity(("ab", 1)).hex()   # T, 2 items; S, 2 bytes, "ab"; I, 1 byte, 1
    '540000000000000002530000000000000002616249000000000000000101'
    >>> encode_identity(("a", "bc")) != encode_identity(("ab", "c"))
    True
    >>> encode_identity((1,)) != encode_identity((1.0,)) != encode_identity(("1",))
    True
    """
    if not isinstance(identity, tuple):
        raise ValueError(f"identity must be a tuple of labels, got {type(identity).__name__}")
    out = []
    _encode_label(identity, out)
    return b"".join(out)


class BitStream:
    """A deterministic stream of cryptographically random bits (one draw identity).

    The stream is ``B_0 ‖ B_1 ‖ …`` with ``B_i = BLAKE2b-512(key=K,
    person="dp_beam.noise.v1", data=encode_identity(identity) ‖ i)``, i an
    8-byte big-endian counter, read as one big-endian bit string. Keyed
    BLAKE2b is a PRF, so without K the bits are indistinguishable from
    uniform, and distinct identities give independent-looking streams.
    Obtain streams from :meth:`NoiseKey.stream`; a stream is consumed as it
    is read and is not picklable (it holds a hash state).

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

    def randbits(self, k):
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

    def randbytes(self, n):
        """The next n bytes of the stream."""
        return self.randbits(8 * n).to_bytes(n, "big")

    def randbelow(self, n):
        """A uniform int in [0, n), by rejection of bit-length draws (no modulo bias)."""
        if n <= 0:
            raise ValueError(f"n must be >= 1, got {n!r}")
        k = (n - 1).bit_length()
        # Each try succeeds with probability n/2^k > 1/2.
        while True:
            value = self.randbits(k)
            if value < n:
                return value


# -- exact samplers (Canonne, Kamath & Steinke 2020) ---------------------------


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


def _bernoulli_exp(stream, num, den):
    """Bernoulli(exp(−num/den)) for num >= 0, den >= 1 (CKS20 Algorithm 1)."""
    whole, num = divmod(num, den)
    # exp(−γ) = exp(−1)^⌊γ⌋ · exp(−(γ − ⌊γ⌋)): one failure decides.
    for _ in range(whole):
        if not _bernoulli_exp_at_most_one(stream, 1, 1):
            return False
    return _bernoulli_exp_at_most_one(stream, num, den)


def _discrete_laplace(stream, t, s):
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


def _discrete_gaussian(stream, p, q):
    """Z with P(Z = z) ∝ exp(−z²/(2σ²)) for σ² = p/q, ints p, q >= 1 (CKS20 Algorithm 3)."""
    # t = ⌊σ⌋ + 1, exactly: ⌊√x⌋ = isqrt(⌊x⌋) for x >= 0.
    t = math.isqrt(p // q) + 1
    # Accept Y ~ DLap(t) with probability exp(−(|Y| − σ²/t)²/(2σ²)); over a
    # common denominator γ = (|Y|·q·t − p)² / (2·p·q·t²), all integers.
    den = 2 * p * q * t * t
    qt = q * t
    while True:
        y = _discrete_laplace(stream, t, 1)
        diff = abs(y) * qt - p
        if _bernoulli_exp(stream, diff * diff, den):
            return y


def _fraction(name, value, positive):
    if isinstance(value, bool) or not isinstance(value, (numbers.Rational, float)):
        raise ValueError(f"{name} must be an int, Fraction or float, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    # Floats are dyadic rationals, so this conversion is exact.
    value = Fraction(value)
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return value


def sample_bernoulli_exp(stream, gamma):
    """True with probability exactly ``exp(−gamma)``, for rational gamma >= 0.

    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "bern")
    >>> sample_bernoulli_exp(s, 0)
    True
    >>> isinstance(sample_bernoulli_exp(s, Fraction(3, 2)), bool)
    True
    """
    gamma = _fraction("gamma", gamma, positive=False)
    return _bernoulli_exp(stream, gamma.numerator, gamma.denominator)


def sample_discrete_laplace(stream, scale):
    """An int Z with ``P(Z = z) ∝ exp(−|z|/scale)``, for rational scale > 0.

    The discrete Laplace of CKS20 (Algorithm 2, scale ``t/s``); its variance
    is ``2e^(−1/scale)/(1 − e^(−1/scale))²`` (≈ 2·scale² for large scales).

    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "dlap")
    >>> isinstance(sample_discrete_laplace(s, Fraction(7, 2)), int)
    True
    """
    scale = _fraction("scale", scale, positive=True)
    return _discrete_laplace(stream, scale.numerator, scale.denominator)


def sample_discrete_gaussian(stream, sigma_squared):
    """An int Z with ``P(Z = z) ∝ exp(−z²/(2·sigma_squared))``, for rational sigma_squared > 0.

    The discrete Gaussian of CKS20 (Algorithm 3); its variance is below
    ``sigma_squared`` and within ``e^(−2π²σ²)``-small terms of it for σ >= 1.

    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "dgauss")
    >>> isinstance(sample_discrete_gaussian(s, Fraction(9, 4)), int)
    True
    """
    sigma_squared = _fraction("sigma_squared", sigma_squared, positive=True)
    return _discrete_gaussian(stream, sigma_squared.numerator, sigma_squared.denominator)


# -- the grid ------------------------------------------------------------------


def _positive_float(name, value):
    value = check_scale(name, value)
    if value == 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def grid_exponent(scale):
    """The exponent k of the grid 2^k on which noise of this scale lives.

    ``k = floor(log2 scale) − GRID_PRECISION`` (computed exactly from the
    float's exponent), so ``scale/2^k`` ∈ [2^30, 2^31); it is raised to
    −1074, float64's smallest bit, for scales below 2^−1044. The grid is a
    public function of the public scale.

    >>> grid_exponent(1.0), grid_exponent(1.5), grid_exponent(0.75), grid_exponent(1000.0)
    (-30, -30, -31, -21)
    """
    scale = _positive_float("scale", scale)
    # frexp gives scale = m·2^e with m ∈ [0.5, 1), so floor(log2 scale) = e − 1.
    return max(math.frexp(scale)[1] - 1 - GRID_PRECISION, _MIN_EXPONENT)


def _round_scalar(x, k):
    x = float(x)
    if not math.isfinite(x):
        raise ValueError(f"x must be finite, got {x!r}")
    # Exact: scaling by a power of two is exact unless it overflows or falls
    # below 2^-1022 (then |y| < 1/2, which rounds to 0 either way); round() of
    # a float is exact, half to even. If |x| >= 2^(53+k) (an overflow
    # included), x is already a multiple of 2^k.
    try:
        y = math.ldexp(x, -k)
    except OverflowError:
        return x
    r = round(y)
    if abs(r) > _EXACT_INT:
        return x
    return math.ldexp(float(r), k)


def round_to_grid(x, scale):
    """x rounded (half to even, exactly) to the grid 2^k of noise of this scale.

    Returns a float for a scalar x and a float64 array of x's shape
    otherwise. Add noise of the same scale from :func:`grid_laplace`,
    :func:`grid_gaussian` or :class:`KeyedNoise`: both are multiples of 2^k,
    so ``round_to_grid(x, b) + noise`` is exact whenever
    ``|round_to_grid(x, b) + noise| <= 2^(53+k)`` (at least ``2^22·b`` for
    G = 30: e.g. statistics up to ~4·10^6 at b = 1). Beyond it IEEE-754
    addition rounds the exact sum ``(R + Z)·2^k`` correctly, which is still a
    function of ``R + Z`` alone, so the released float stays post-processing
    of the discrete mechanism; only low-order bits are lost.

    >>> round_to_grid(0.1, 1.0) == 107374182 / 2**30
    True
    >>> round_to_grid(2.0**-31, 1.0), round_to_grid(3 * 2.0**-31, 1.0) == 2.0**-29   # ties to even
    (0.0, True)
    >>> round_to_grid([1e9, -0.5], 1.0).tolist()
    [1000000000.0, -0.5]
    """
    k = grid_exponent(scale)
    if np.ndim(x) == 0:
        return _round_scalar(x, k)
    if type(x) is np.ndarray and x.shape == (1,):
        # A scalar mechanism's node: the same rounding without the array round trip.
        return np.array([_round_scalar(x[0], k)])
    values = np.asarray(x, dtype=np.float64)
    return np.array([_round_scalar(v, k) for v in values.ravel()], dtype=np.float64).reshape(values.shape)


def _to_grid_float(z, k):
    # |Z| <= 2^53 and k >= −1074 make Z·2^k exact; the integer scale is below
    # 2^31, so |Z| > 2^53 has probability below exp(−2^22) (Laplace) or
    # exp(−2^43) (Gaussian). The check is on the noise alone, independent of
    # the data, so refusing it reveals nothing (resampling would truncate
    # the law instead).
    if abs(z) > _EXACT_INT:
        raise OverflowError(f"noise integer {z} exceeds 2^53 on grid 2^{k}; not exact in float64")
    # ldexp raises OverflowError if Z·2^k exceeds float64's range (scales
    # near 1e300 only).
    return math.ldexp(float(z), k)


@functools.lru_cache(maxsize=4096)
def _grid_ratio(scale, power):
    """``(k, p, q)`` with ``p/q = (scale/2^k)^power`` exactly, k = :func:`grid_exponent`.

    A mechanism draws many values of one public scale: the exact ratio is
    computed once per scale (the Fractions cost more than a draw's hashing).
    """
    scale = _positive_float("scale" if power == 1 else "sigma", scale)
    k = grid_exponent(scale)
    return (k,) + _integer_ratio(scale, k, power)


@functools.lru_cache(maxsize=4096)
def _integer_ratio(scale, exponent, power):
    """``(p, q)`` with ``p/q = (scale/2^exponent)^power`` exactly (one public scale per
    mechanism: computed once, not at every draw)."""
    ratio = (Fraction(scale) / Fraction(2) ** exponent) ** power
    return ratio.numerator, ratio.denominator


def grid_laplace(stream, scale):
    """One Laplace-like noise of float scale b > 0: ``Z·2^k`` with Z ~ DLap(b/2^k).

    ``k = grid_exponent(b)``; the integer scale ``b/2^k`` (exact Fraction) is
    in [2^30, 2^31), so the law is the discrete Laplace with
    ``P(Z·2^k = z·2^k) ∝ exp(−|z|·2^k/b)``, whose variance differs from
    ``2b²`` by less than ``2^−60·b²``.

    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "glap")
    >>> v = grid_laplace(s, 2.5)
    >>> (Fraction(v) / Fraction(2) ** grid_exponent(2.5)).denominator
    1
    """
    k, num, den = _grid_ratio(scale, 1)
    return _to_grid_float(_discrete_laplace(stream, num, den), k)


def grid_gaussian(stream, sigma):
    """One Gaussian-like noise of float σ > 0: ``Z·2^k`` with Z a discrete Gaussian of σ/2^k.

    ``k = grid_exponent(σ)``; Z has ``P(Z = z) ∝ exp(−z²/(2(σ/2^k)²))`` with
    ``σ/2^k`` ∈ [2^30, 2^31) exact, so the variance equals σ² up to a relative
    ``e^(−2^60)``.

    >>> s = NoiseKey.from_bytes(bytes(32)).stream("doc", "ggauss")
    >>> v = grid_gaussian(s, 2.5)
    >>> (Fraction(v) / Fraction(2) ** grid_exponent(2.5)).denominator
    1
    """
    k, num, den = _grid_ratio(sigma, 2)
    return _to_grid_float(_discrete_gaussian(stream, num, den), k)


def grid_padded_scale(sensitivity, scale_of, spread=1.0):
    """The noise scale for values rounded to the grid of that same scale first.

    ``scale_of(s)`` is the scale a mechanism calibrates for a per-value
    sensitivity s (e.g. ``lambda s: laplace_scale(levels * s, eps)``).
    Rounding a value and its neighbour to the grid ``2^k`` of the noise moves
    their difference by at most ``2^k`` (half a step each), so the rounded
    values have sensitivity ``s + 2^k``: the returned scale is
    ``scale_of(s + pad)`` for a pad of at least the grid step of the result.
    One pass gives ``pad = 2^(k0+1)`` with k0 the grid of ``scale_of(s)``; it
    is kept when the grid of the padded scale is at most ``pad`` (always,
    unless the scale is over 2^29 times the sensitivity), else doubled.
    ``spread`` is the norm of the rounding errors in units of the step when
    several coordinates share one sensitivity (√p for p coordinates under an
    L2 sensitivity): the scale is then ``scale_of(s + spread·pad)``.

    >>> grid_padded_scale(1.0, lambda s: 4.0 * s) == 4.0 * (1.0 + 2.0 ** -27)
    True
    """
    base = scale_of(sensitivity)
    if base == 0.0:
        return base
    pad = math.ldexp(1.0, grid_exponent(base) + 1)
    while True:
        scale = scale_of(sensitivity + spread * pad)
        if math.ldexp(1.0, grid_exponent(scale)) <= pad:
            return scale
        pad *= 2.0


# -- the noise source ----------------------------------------------------------


class KeyedNoise(NoiseSource):
    """Production noise that is reproducible: draw n of an identity is always the same.

    ``KeyedNoise(noise_key, identity)`` makes its n-th call (n = 0, 1, …),
    ``laplace(scale, size)`` or ``gaussian(sigma, size)``, read the stream
    ``noise_key.stream(*identity, n)`` and draw the ``size`` values from it
    in order with :func:`grid_laplace` / :func:`grid_gaussian`. The same key,
    identity and sequence of calls give bit-identical arrays in any process,
    so a retried bundle re-releases exactly what its first attempt released.
    Every call consumes one counter value, also for a zero scale or size, so
    a call's stream depends only on its position. The counter is part of
    the pickled state: a restored source continues where the pickled one
    stood. The samplers are exact pure Python; ``secure = True``.

    The caller must give every draw a **unique identity**: e.g.
    ``identity = (transform label, stream key, step)`` with at most the
    draws a mechanism makes in that step, always in the same order. Two
    sources with the same identity (or one source rebuilt and asked again)
    return the same noise; that is the point for retries, and a privacy
    breach if the two draws protect different values (the difference of the
    releases is then exact). The key hazards of :class:`NoiseKey` apply.

    Values are on the grid of :func:`grid_exponent` (spacing <= scale·2^−30).
    To cover the released float by the discrete mechanism's guarantee, add
    them to ``round_to_grid(statistic, scale)`` rather than to the raw
    statistic; adding to a raw float gives the usual (OpenDP-like) float
    noise without that guarantee.

    Cost (one core of the development machine, CPython 3.11, ``python -m
    timeit`` on ``laplace(b, 1)`` / ``gaussian(b, 1)``, each call a new
    stream, b ∈ {0.1, 1, 3.7, 1000}): 11–13 µs per scalar Laplace and
    15–18 µs per scalar Gaussian draw, of which ~2.5 µs is the stream set-up;
    in a vector draw (size 1000) ~9 and ~14 µs per value. The cost does not
    depend on the scale, since the integer scale is always in [2^30, 2^31).
    A tree release draws one noise per step and key, so this is a small part
    of a step.

    >>> key = NoiseKey.from_bytes(bytes(range(32)))
    >>> a = KeyedNoise(key, ("counts", "user-7"))
    >>> b = KeyedNoise(key, ("counts", "user-7"))
    >>> first = a.laplace(2.0, 3)
    >>> bool((first == b.laplace(2.0, 3)).all())     # same identity and call: same noise
    True
    >>> bool((first == a.laplace(2.0, 3)).any())     # the next call reads a new stream
    False
    >>> a.draws, a.for_identity("step", 5).identity
    (2, ('counts', 'user-7', 'step', 5))
    """

    secure = True
    exact_grid = True

    def __init__(self, noise_key, identity):
        if not isinstance(noise_key, NoiseKey):
            raise ValueError(f"noise_key must be a NoiseKey, got {type(noise_key).__name__}")
        if not isinstance(identity, tuple):
            raise ValueError(f"identity must be a tuple of labels, got {identity!r}")
        # Encoding now both validates the labels eagerly and gives the fixed
        # part of every draw's encoded identity, reused by _next_stream.
        parts = []
        for label in identity:
            _encode_label(label, parts)
        self._noise_key = noise_key
        self._identity = identity
        self._draws = 0
        self._prefix = None
        self._encoded = b"".join(parts)

    @property
    def noise_key(self):
        return self._noise_key

    @property
    def identity(self):
        return self._identity

    @property
    def draws(self):
        """How many draws (calls) were made; the next call uses stream ``identity + (draws,)``."""
        return self._draws

    def for_identity(self, *more):
        """A fresh source (counter 0) for the identity extended by the labels ``more``."""
        if not more:
            raise ValueError("for_identity needs at least one label, else the child repeats this source's identity")
        if self._encoded is None:
            return KeyedNoise(self._noise_key, self._identity + more)
        # The labels are encoded one after another, so the child's encoding
        # is this one's followed by the new labels' (what __init__ would
        # compute, without encoding the shared prefix again).
        parts = [self._encoded]
        for label in more:
            _encode_label(label, parts)
        child = KeyedNoise.__new__(KeyedNoise)
        child._noise_key = self._noise_key
        child._identity = self._identity + more
        child._draws = 0
        child._prefix = None
        child._encoded = b"".join(parts)
        return child

    def __getstate__(self):
        # The cached hash state cannot be pickled; it is rebuilt on demand.
        return {"noise_key": self._noise_key, "identity": self._identity, "draws": self._draws}

    def __setstate__(self, state):
        self._noise_key = state["noise_key"]
        self._identity = state["identity"]
        self._draws = state["draws"]
        self._prefix = None
        self._encoded = None

    def __repr__(self):
        return f"KeyedNoise({self._noise_key!r}, identity={self._identity!r}, draws={self._draws})"

    def _next_stream(self):
        if self._prefix is None:
            # The identity of draw n is identity + (n,): a tuple of one more
            # label, so its encoding is a fixed prefix (with the longer
            # count) followed by the encoded counter.
            if self._encoded is None:
                parts = []
                for label in self._identity:
                    _encode_label(label, parts)
                self._encoded = b"".join(parts)
            header = b"T" + _encode_length(len(self._identity) + 1)
            self._prefix = self._noise_key._prefix_hasher(header + self._encoded)
        parts = []
        _encode_label(self._draws, parts)
        hasher = self._prefix.copy()
        hasher.update(parts[0])
        self._draws += 1
        return BitStream(hasher)

    def laplace(self, scale, size):
        scale = check_scale("scale", scale)
        size = check_size(size)
        stream = self._next_stream()
        if scale == 0.0 or size == 0:
            return np.zeros(size, dtype=np.float64)
        return np.array([grid_laplace(stream, scale) for _ in range(size)], dtype=np.float64)

    def gaussian(self, sigma, size):
        sigma = check_scale("sigma", sigma)
        size = check_size(size)
        stream = self._next_stream()
        if sigma == 0.0 or size == 0:
            return np.zeros(size, dtype=np.float64)
        return np.array([grid_gaussian(stream, sigma) for _ in range(size)], dtype=np.float64)

    def integer_noise(self, kind, scale, exponent, size):
        """``size`` exact discrete Laplace or Gaussian ints of scale ``scale/2^exponent``.

        One call, one stream, as :meth:`laplace`. ``exponent`` is the caller's
        grid, typically much finer than :func:`grid_exponent` (BLT computes
        its noised vector in units of it); the samplers' cost grows only
        with the bit length of the integer scale.

        >>> src = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("doc", "ints"))
        >>> z = src.integer_noise("gaussian", 1.5, -60, 2)
        >>> len(z), all(isinstance(v, int) for v in z), src.draws
        (2, True, 1)
        """
        if kind not in ("laplace", "gaussian"):
            raise ValueError(f"kind must be 'laplace' or 'gaussian', got {kind!r}")
        scale = check_scale("scale", scale)
        size = check_size(size)
        if isinstance(exponent, bool) or not isinstance(exponent, numbers.Integral):
            raise ValueError(f"exponent must be an int, got {exponent!r}")
        stream = self._next_stream()
        if scale == 0.0 or size == 0:
            return [0] * size
        num, den = _integer_ratio(scale, int(exponent), 1 if kind == "laplace" else 2)
        if kind == "laplace":
            return [_discrete_laplace(stream, num, den) for _ in range(size)]
        return [_discrete_gaussian(stream, num, den) for _ in range(size)]

    def exponential_choice(self, gammas):
        """Index i drawn with probability exactly ``exp(−γ_i) / Σ_j exp(−γ_j)``.

        ``gammas`` are finite reals >= 0 (floats are exact dyadic rationals).
        Rejection sampling with exact coins: propose i uniformly, accept with
        probability ``exp(−(γ_i − min γ))`` (:func:`sample_bernoulli_exp`);
        the accepted index has exactly the softmax law, and a proposal is
        accepted with probability at least 1/n. No floating point enters the
        choice (Ilvento 2020 shows how a float softmax leaks), and the draw is
        keyed like every other, so a retry makes the same choice.

        >>> src = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("doc", "em"))
        >>> src.exponential_choice([0.0, 50.0, 50.0])
        0
        """
        values = [_fraction("gamma", g, positive=False) for g in gammas]
        if not values:
            raise ValueError("gammas must not be empty")
        stream = self._next_stream()
        low = min(values)
        shifted = [v - low for v in values]
        while True:
            i = stream.randbelow(len(shifted))
            if _bernoulli_exp(stream, shifted[i].numerator, shifted[i].denominator):
                return i
