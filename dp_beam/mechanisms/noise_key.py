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
* Exact samplers of Canonne, Kamath & Steinke (2020), Algorithms 1–3,
  driven by the bit stream (:mod:`dp_beam.mechanisms.exact_samplers`). No
  floating point enters a sampler.
* The grid (:mod:`dp_beam.mechanisms.noise_grid`): noise of scale b is
  released as ``Z·2^k`` with Z an exact discrete Laplace (or Gaussian)
  integer, ``k = grid_exponent(b)``, and added to the statistic rounded to
  the same grid.
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
from typing import Any, List, Sequence, Union

import numpy as np

from .checks import check_dim, check_scale, check_size
from .exact_samplers import (BitStream, bernoulli_exp, discrete_gaussian, discrete_laplace,
                             exact_rational)
from .noise import NoiseSource
from .noise_grid import grid_float, grid_ratio, integer_ratio

__all__ = [
    "NoiseKey",
    "KeyedNoise",
    "encode_identity",
]

# Personalisation strings (BLAKE2b's built-in domain separation, <= 16 bytes):
# the noise streams, the public fingerprint and the compression of long keys
# must never produce related outputs from one key.
_PERSON_STREAM = b"dp_beam.noise.v1"
_PERSON_FINGERPRINT = b"dp_beam.fprnt.v1"
_PERSON_LONG_KEY = b"dp_beam.lkey.v1"

_KEY_BYTES = 32
_BLAKE2B_MAX_KEY = 64
# One block of a stream: a BLAKE2b-512 digest.
_BLOCK_BYTES = 64


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

    # _keyed: the hash state after the key block and the tuple tag every encoded identity
    # starts with, built on first use (not pickled: __reduce__ passes the key alone).
    __slots__ = ("_key", "_keyed")

    def __init__(self, key_bytes):
        key_bytes = _key_bytes(key_bytes)
        if len(key_bytes) > _BLAKE2B_MAX_KEY:
            key_bytes = hashlib.blake2b(
                key_bytes, digest_size=_BLAKE2B_MAX_KEY, person=_PERSON_LONG_KEY
            ).digest()
        self._key = key_bytes
        self._keyed = None

    @classmethod
    def generate(cls) -> "NoiseKey":
        """A fresh key of 32 bytes from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(_KEY_BYTES))

    @classmethod
    def from_bytes(cls, key_bytes: bytes) -> "NoiseKey":
        """The key with these raw bytes (at least 32)."""
        return cls(key_bytes)

    @classmethod
    def from_env(cls, name: str) -> "NoiseKey":
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
    def from_file(cls, path: Union[str, os.PathLike]) -> "NoiseKey":
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
    def fingerprint(self) -> str:
        """8 hex digits identifying the key; a hash under its own domain, not part of the noise."""
        return hashlib.blake2b(b"", key=self._key, digest_size=4, person=_PERSON_FINGERPRINT).hexdigest()

    def secret_hex(self) -> str:
        """The key bytes as hex text, to store it in a secret manager. Reveals the secret."""
        return self._key.hex()

    def stream(self, *identity: Any) -> BitStream:
        """The :class:`BitStream` of the draw named by the public labels ``identity``.

        Labels are str, bytes, int, float, bool, None, or tuples/lists of them
        (see :func:`encode_identity`); equal identities give equal streams in
        every process, different ones independent-looking streams.
        """
        return BitStream(self._prefix_hasher(encode_identity(identity)))

    def _prefix_hasher(self, encoded):
        if encoded[:1] != b"T":
            hasher = hashlib.blake2b(key=self._key, digest_size=_BLOCK_BYTES, person=_PERSON_STREAM)
            hasher.update(encoded)
            return hasher
        # A copy of a state that has absorbed the key and the tag "T" (the encoding of every
        # identity starts with it) hashes the same bytes: every draw then skips building a
        # keyed hasher and compressing the key block (≈ 0.2 µs of a ≈ 4 µs scalar draw).
        keyed = self._keyed
        if keyed is None:
            keyed = hashlib.blake2b(key=self._key, digest_size=_BLOCK_BYTES, person=_PERSON_STREAM)
            keyed.update(b"T")
            self._keyed = keyed
        hasher = keyed.copy()
        hasher.update(memoryview(encoded)[1:])
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


_pack_double = struct.Struct(">d").pack


@functools.lru_cache(maxsize=256)
def _tagged_doubles(n):
    """The packer of n floats, each behind the tag ``F`` (big-endian, no padding)."""
    return struct.Struct(">" + "cd" * n).pack


#: The float types a float label is packed as it is (np.float64 is a float subclass).
_DOUBLES = frozenset({float, np.float64})


def _encode_label(value, out):
    # Every label is a one-byte type tag followed by a self-delimiting body,
    # so the encoding of a tuple is injective and prefix-free: ("a", "bc")
    # and ("ab", "c") differ, and so do 1, 1.0, "1" and True.
    kind = type(value)
    # Exact built-in types first (the labels of every draw): the ABC checks
    # below cost more than the encoding itself. (_encode_length inline: a
    # release encodes a step and a str label per stream and step.)
    if kind is int:
        body = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out.append(b"I" + len(body).to_bytes(8, "big") + body)
    elif kind is str:
        body = value.encode("utf-8", "surrogatepass")
        out.append(b"S" + len(body).to_bytes(8, "big") + body)
    elif kind is float:
        out.append(b"F" + _pack_double(value))
    elif kind is tuple and value and set(map(type, value)) <= _DOUBLES:
        # A vector of floats (an ERM point's features): each value behind its tag, packed
        # in one call. The same bytes as the items one by one, at a fifth of the time for
        # d = 10 (an ERM point is hashed once per release for its tie-breaker).
        n = len(value)
        args = [b"F", 0.0] * n
        args[1::2] = value
        out.append(b"T" + n.to_bytes(8, "big") + _tagged_doubles(n)(*args))
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


def encode_identity(identity: tuple) -> bytes:
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
    # The tuple's header here, not through _encode_label's type tests (a draw's identity
    # is encoded once per draw): the same bytes.
    out = [b"T" + _encode_length(len(identity))]
    for label in identity:
        _encode_label(label, out)
    return b"".join(out)


# -- the noise source ----------------------------------------------------------


#: The encoded counter label of draw 0 (what _encode_label writes for the int 0).
_FIRST_DRAW = b"I" + _encode_length(1) + b"\x00"
#: Box–Muller's constants (KeyedNoise.direction): 53 random bits make a uniform float.
_TWO_TO_MINUS_53 = 2.0 ** -53
_TWO_PI = 2.0 * math.pi
#: Encodings of (int, str) label pairs given to :meth:`KeyedNoise.for_identity`, the
#: (step, phase) of a release: encoded once per step, not once per stream and step.
_STEP_LABELS = {}
_STEP_LABELS_MAX = 4096


class KeyedNoise(NoiseSource):
    """Production noise that is reproducible: draw n of an identity is always the same.

    ``KeyedNoise(noise_key, identity)`` makes its n-th call (n = 0, 1, …),
    ``laplace(scale, size)`` or ``gaussian(sigma, size)`` (or :meth:`float_noise`,
    the same draws as a list), read the stream
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

    Cost (2-core development machine under load ≈ 2, CPython 3.11,
    ``python benchmarks/samplers.py``, each call a new stream): ≈ 4.1–4.6 µs
    per scalar Laplace draw (``laplace(7.2, 1)``) and ≈ 6.5–6.6 µs per scalar
    Gaussian draw (``gaussian(3.1, 1)``), about 0.45 µs of it per 512-bit
    block hashed (≈ 1.1 blocks per Laplace, ≈ 1.8 per Gaussian draw). The
    cost hardly depends on the scale, since the integer scale is always in
    [2^30, 2^31). A tree release draws one noise per step and key.

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
    def noise_key(self) -> NoiseKey:
        return self._noise_key

    @property
    def identity(self) -> tuple:
        return self._identity

    @property
    def draws(self) -> int:
        """How many draws (calls) were made; the next call uses stream ``identity + (draws,)``."""
        return self._draws

    def for_identity(self, *more: Any) -> "KeyedNoise":
        """A fresh source (counter 0) for the identity extended by the labels ``more``."""
        if not more:
            raise ValueError("for_identity needs at least one label, else the child repeats this source's identity")
        if self._encoded is None:
            return KeyedNoise(self._noise_key, self._identity + more)
        # The labels are encoded one after another, so the child's encoding
        # is this one's followed by the new labels' (what __init__ would
        # compute, without encoding the shared prefix again).
        if len(more) == 2 and type(more[0]) is int and type(more[1]) is str:
            # A release's (step, phase): every stream of a shard asks for the same one.
            # Only exact (int, str) pairs are stored, so 1, 1.0 and True never share one.
            suffix = _STEP_LABELS.get(more)
            if suffix is None:
                parts = []
                _encode_label(more[0], parts)
                _encode_label(more[1], parts)
                suffix = b"".join(parts)
                if len(_STEP_LABELS) >= _STEP_LABELS_MAX:
                    _STEP_LABELS.clear()
                _STEP_LABELS[more] = suffix
            encoded = self._encoded + suffix
        else:
            parts = [self._encoded]
            for label in more:
                _encode_label(label, parts)
            encoded = b"".join(parts)
        child = KeyedNoise.__new__(KeyedNoise)
        child._noise_key = self._noise_key
        child._identity = self._identity + more
        child._draws = 0
        child._prefix = None
        child._encoded = encoded
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
            if self._draws == 0:
                # A source made for one step usually draws once: hash the first
                # counter with the prefix, without keeping (and copying) the prefix.
                self._draws = 1
                return BitStream(self._noise_key._prefix_hasher(header + self._encoded + _FIRST_DRAW))
            self._prefix = self._noise_key._prefix_hasher(header + self._encoded)
        n = self._draws
        # The counter's label exactly as _encode_label writes an int (tag,
        # 8-byte length, two's-complement body), without its type dispatch:
        # this runs once per draw.
        body = n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True)
        hasher = self._prefix.copy()
        hasher.update(b"I" + len(body).to_bytes(8, "big") + body)
        self._draws = n + 1
        return BitStream(hasher)

    def laplace(self, scale: float, size: int) -> np.ndarray:
        return np.array(self.float_noise("laplace", scale, size), dtype=np.float64)

    def gaussian(self, sigma: float, size: int) -> np.ndarray:
        return np.array(self.float_noise("gaussian", sigma, size), dtype=np.float64)

    def float_noise(self, kind: str, scale: float, size: int) -> List[float]:
        """``size`` draws from one new stream, as Python floats: what :func:`grid_laplace`
        (``kind`` ``"laplace"``) or :func:`grid_gaussian` (``"gaussian"``) draws, with
        the scale's grid and ratio looked up once per call. :meth:`laplace` and
        :meth:`gaussian` are it as an array; a tree node's scalar draw skips the
        array (≈ 1 µs of a ≈ 5 µs draw).

        >>> a = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("doc", "floats"))
        >>> b = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("doc", "floats"))
        >>> a.float_noise("laplace", 2.0, 2) == b.laplace(2.0, 2).tolist()
        True
        """
        if kind == "laplace":
            name, power, sampler = "scale", 1, discrete_laplace
        elif kind == "gaussian":
            name, power, sampler = "sigma", 2, discrete_gaussian
        else:
            raise ValueError(f"kind must be 'laplace' or 'gaussian', got {kind!r}")
        scale = check_scale(name, scale)
        # An exact int skips check_size's ABC test (~0.4 µs, a tenth of a scalar draw).
        size = size if type(size) is int and size >= 0 else check_size(size)
        stream = self._next_stream()
        if scale == 0.0 or size == 0:
            return [0.0] * size
        k, num, den = grid_ratio(scale, power)
        if size == 1:
            # A tree node's scalar draw: no comprehension frame.
            return [grid_float(sampler(stream, num, den), k)]
        return [grid_float(sampler(stream, num, den), k) for _ in range(size)]

    def direction(self, dim: int) -> np.ndarray:
        """A unit vector uniform on the sphere in R^dim, from one new stream (one draw).

        Box–Muller pairs from the stream's 64-bit words (the top 53 bits of each a
        uniform u in [0, 1)): ``r = √(−2·ln(1 − u₁))``, ``(r·cos 2πu₂, r·sin 2πu₂)``
        are two independent N(0, 1) (to float precision), and ``g/‖g‖`` of such a
        vector is uniform on the sphere. The direction is a float computation in any
        source (the L2-Laplace vector it scales is rounded to its noise grid by the
        caller, erm.md E-4), so an exact discrete Gaussian per coordinate bought no
        exactness here; it cost ≈ 10 µs a coordinate (σ = 1 on a grid 2^30 times
        finer), against ≈ 0.5 µs for a pair here. The functions are CPython's
        ``math`` ones on scalars, and ``‖g‖`` is :func:`math.hypot`, so the values do
        not depend on NumPy's SIMD kernels. A zero vector (every u₁ = 0, probability
        2^−53 per pair) reads the next words of the same stream.

        >>> a = KeyedNoise(NoiseKey.from_bytes(bytes(32)), ("doc", "dir"))
        >>> u = a.direction(5)
        >>> round(float(u @ u), 12), a.draws
        (1.0, 1)
        """
        dim = check_dim(dim)
        stream = self._next_stream()
        pairs = (dim + 1) // 2
        log1p, cos, sin, sqrt = math.log1p, math.cos, math.sin, math.sqrt
        while True:
            words = struct.unpack(f">{2 * pairs}Q", stream.randbytes(16 * pairs))
            g = []
            for i in range(0, 2 * pairs, 2):
                radius = sqrt(-2.0 * log1p(-(words[i] >> 11) * _TWO_TO_MINUS_53))
                angle = _TWO_PI * ((words[i + 1] >> 11) * _TWO_TO_MINUS_53)
                g.append(radius * cos(angle))
                g.append(radius * sin(angle))
            del g[dim:]
            norm = math.hypot(*g)
            if norm > 0.0:
                return np.array(g, dtype=np.float64) / norm

    def integer_noise(self, kind: str, scale: float, exponent: int, size: int) -> List[int]:
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
        # Exact ints skip the ABC tests (~1 µs of a scalar BLT step; bool is not int here).
        size = size if type(size) is int and size >= 0 else check_size(size)
        if type(exponent) is not int and (isinstance(exponent, bool)
                                          or not isinstance(exponent, numbers.Integral)):
            raise ValueError(f"exponent must be an int, got {exponent!r}")
        stream = self._next_stream()
        if scale == 0.0 or size == 0:
            return [0] * size
        num, den = integer_ratio(scale, int(exponent), 1 if kind == "laplace" else 2)
        sampler = discrete_laplace if kind == "laplace" else discrete_gaussian
        if size == 1:
            # A scalar stream's draw: no comprehension frame.
            return [sampler(stream, num, den)]
        return [sampler(stream, num, den) for _ in range(size)]

    def exponential_choice(self, gammas: Sequence[Union[numbers.Rational, float]]) -> int:
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
        values = [exact_rational("gamma", g, positive=False) for g in gammas]
        if not values:
            raise ValueError("gammas must not be empty")
        stream = self._next_stream()
        low = min(values)
        shifted = [v - low for v in values]
        while True:
            i = stream.randbelow(len(shifted))
            if bernoulli_exp(stream, shifted[i].numerator, shifted[i].denominator):
                return i
