"""Keys and privacy units as the pipeline groups them: normalised, validated, deterministically encoded.

Every stateful stage (per-user contribution bounding, the ordered release)
and every grouping is keyed by a stream key or a user id. Two things must
hold for them (issue "nothing lost, nothing crashes"):

* **Equal ids are one stream (one unit).** ``numpy.str_("AA")`` and ``"AA"``
  compare equal in Python but encode differently, so a runner that groups by
  encoded bytes would make two streams published under one key (or two units
  for one user, each with its own contribution cap). Keys and users are
  therefore normalised before any grouping (:func:`normalize_key`): NumPy
  scalars become Python values (``.item()``), ``str``/``bytes`` subclasses
  their plain value, numbers a canonical form (integral numbers become
  ``int``: ``True``, ``1``, ``1.0`` and ``numpy.int64(1)`` are one key,
  released as ``1``; ``Decimal``/``Fraction`` become ``float`` or ``int``),
  and tuples (named tuples included) plain tuples of normalised items.
* **Nothing un-groupable reaches a grouping.** NaN is not equal to itself
  (a NaN key made one stream publish several times), lists, dicts and sets
  are unhashable, and other objects have no deterministic encoding: such ids
  go to ``.invalid`` with the reason instead of crashing or corrupting the
  job.

Normalised ids are ``None`` (the unkeyed stream), ``int``, finite ``float``,
``str``, ``bytes`` and tuples of these. :class:`StreamKeyCoder` encodes
exactly that domain, deterministically, and is the key coder of every keyed
PCollection the transforms build (element type :data:`KV`): runners that
encode state keys (Dataflow, Flink) need a deterministic key coder for
stateful DoFns, which Beam's default ``FastPrimitivesCoder`` is not.
"""

import functools
import hashlib
import math
import numbers
import struct
from typing import Any, Optional, Tuple

import numpy as np
from apache_beam import coders

from dp_beam.mechanisms.noise_key import encode_identity
from dp_beam.transforms.release_spec import key_label

__all__ = ["StreamKey", "StreamKeyCoder", "KV", "normalize_key", "shard_of", "default_shards",
           "KEYS_PER_SHARD"]

#: Deepest tuple nesting accepted in a key or user id.
_MAX_DEPTH = 8


def _number(value):
    """A finite real as ``int`` (when integral) or ``float``; ``(None, reason)`` otherwise."""
    if isinstance(value, numbers.Integral):
        return int(value), None
    try:
        f = float(value)
    except (OverflowError, ValueError, TypeError, ArithmeticError) as e:
        return None, f"a number out of the float range ({type(e).__name__})"
    if f != f:
        return None, "NaN (a missing value, not an id)"
    if math.isinf(f):
        return None, "an infinite number"
    return (int(f) if f.is_integer() else f), None


def normalize_key(value: Any, depth: int = 0) -> Tuple[Any, Optional[str]]:
    """``(id, None)``: ``value`` as a normalised key or user id; or ``(None, reason)``.

    ``reason`` names what the id is (it completes "key_fn returned ...").
    ``None`` is returned as ``(None, None)``: callers
    decide whether it is allowed (it is the key of an unkeyed stream).

    >>> normalize_key(np.str_("AA")), normalize_key(np.int64(3)), normalize_key(2.0)
    (('AA', None), (3, None), (2, None))
    >>> normalize_key(("a", np.float32(0.5)))
    (('a', 0.5), None)
    >>> normalize_key(float("nan"))[1], normalize_key(["a"])[1]
    ('NaN (a missing value, not an id)', 'an unhashable list')
    """
    t = type(value)
    if t is str or t is int or value is None:
        return value, None
    if t is tuple and depth < _MAX_DEPTH:
        # A flat tuple of str, int and None (a composite user id, say) is its own
        # normalised form: returned without the item-by-item rebuild below, which cost
        # about as much as the rest of a user-level event's validation.
        for item in value:
            ti = type(item)
            if ti is not str and ti is not int and item is not None:
                break
        else:
            return value, None
    if isinstance(value, np.generic):
        if isinstance(value, np.datetime64) or isinstance(value, np.timedelta64):
            return None, f"a {t.__name__} (ids must be strings, numbers, bytes or tuples of these)"
        value = value.item()
        t = type(value)
    if t is float or isinstance(value, numbers.Number):
        if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
            return None, "a complex number"
        return _number(value)
    if isinstance(value, str):
        return str.__str__(value), None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), None
    if isinstance(value, tuple):
        if depth >= _MAX_DEPTH:
            return None, f"a tuple nested deeper than {_MAX_DEPTH} levels"
        items = []
        for item in value:
            if item is None:
                items.append(None)
                continue
            k, err = normalize_key(item, depth + 1)
            if err:
                return None, f"a tuple holding {err}"
            items.append(k)
        return tuple(items), None
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return normalize_key(value.item(), depth)
    try:
        hash(value)
    except TypeError:
        return None, f"an unhashable {t.__name__}"
    try:
        missing = value != value
        missing = bool(missing)
    except Exception:  # pandas.NA: its comparisons are NA, whose truth value raises
        missing = True
    if missing:
        return None, f"a missing value ({t.__name__})"
    return None, (f"a {t.__module__}.{t.__qualname__} (ids must be strings, numbers, bytes "
                  "or tuples of these)")


class StreamKey:
    """Type hint of a normalised key or user id (see :func:`normalize_key`); coded by
    :class:`StreamKeyCoder`. Never instantiated: it only selects the coder."""


#: Element type of the keyed PCollections the transforms build.
KV = Tuple[StreamKey, Any]

_NONE, _INT, _FLOAT, _STR, _BYTES, _TUPLE, _BOOL = b"N", b"I", b"D", b"S", b"B", b"T", b"O"
_LEN = struct.Struct(">I")
_DOUBLE = struct.Struct(">d")


def _encode(value, out):
    t = type(value)
    if value is None:
        out.append(_NONE)
    elif t is str:
        raw = value.encode("utf-8", "surrogatepass")
        out += (_STR, _LEN.pack(len(raw)), raw)
    elif t is int:
        raw = value.to_bytes((value.bit_length() + 8) // 8, "big", signed=True)
        out += (_INT, _LEN.pack(len(raw)), raw)
    elif t is float:
        out += (_FLOAT, _DOUBLE.pack(value))
    elif t is bool:
        out += (_BOOL, b"\x01" if value else b"\x00")
    elif t is bytes:
        out += (_BYTES, _LEN.pack(len(value)), value)
    elif t is tuple:
        out += (_TUPLE, _LEN.pack(len(value)))
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"StreamKeyCoder cannot encode {t.__name__} {value!r:.80}: keys and users "
                        "are normalised by dp_beam.transforms.stream_keys.normalize_key first")


def _decode(data, pos):
    tag = data[pos:pos + 1]
    pos += 1
    if tag == _NONE:
        return None, pos
    if tag == _FLOAT:
        return _DOUBLE.unpack_from(data, pos)[0], pos + 8
    if tag == _BOOL:
        return data[pos] == 1, pos + 1
    (n,) = _LEN.unpack_from(data, pos)
    pos += 4
    if tag == _TUPLE:
        items = []
        for _ in range(n):
            item, pos = _decode(data, pos)
            items.append(item)
        return tuple(items), pos
    raw = data[pos:pos + n]
    pos += n
    if tag == _STR:
        return raw.decode("utf-8", "surrogatepass"), pos
    if tag == _INT:
        return int.from_bytes(raw, "big", signed=True), pos
    if tag == _BYTES:
        return bytes(raw), pos
    raise ValueError(f"StreamKeyCoder: unknown tag {tag!r}")


class StreamKeyCoder(coders.Coder):
    """A deterministic coder of normalised keys and user ids (tag, length, value; tuples nested).

    >>> c = StreamKeyCoder()
    >>> c.decode(c.encode(("AA", 7, 0.5, None, b"x")))
    ('AA', 7, 0.5, None, b'x')
    >>> c.encode("AA") == c.encode(str(np.str_("AA"))), c.is_deterministic()
    (True, True)
    """

    def encode(self, value: Any) -> bytes:
        out = []
        _encode(value, out)
        return b"".join(out)

    def decode(self, encoded: bytes) -> Any:
        value, _ = _decode(encoded, 0)
        return value

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self) -> Any:
        return StreamKey

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


coders.registry.register_coder(StreamKey, StreamKeyCoder)


#: Declared keys per shard of the default (``shards=None``): large enough that
#: a shard's firing amortises the runner's per-timer cost, small enough that
#: the shard's state cell (all its streams) stays well below a megabyte.
KEYS_PER_SHARD = 64


@functools.lru_cache(maxsize=1 << 16)
def shard_of(key: Any, shards: int) -> int:
    """The shard of a stream key: SHA-256 of its canonical encoding, modulo ``shards``.

    Stable across processes, workers and runs (Python's ``hash`` is salted),
    and a function of the key alone, which is public (declared or privately
    selected): routing by it reveals nothing (``dp_beam.transforms.shards``).

    >>> shard_of("JFK", 8) == shard_of("JFK", 8), 0 <= shard_of(("a", 1), 3) < 3
    (True, True)
    """
    digest = hashlib.sha256(encode_identity((key_label(key),))).digest()
    return int.from_bytes(digest[:8], "big") % shards


def default_shards(declared_keys: Optional[int], bounded: bool = False) -> int:
    """Shards for a release over ``declared_keys`` streams (``None``: not known up front).

    ``declared_keys // KEYS_PER_SHARD`` from :data:`KEYS_PER_SHARD` keys on. Below that,
    unbounded input keeps one stateful key per stream (0), and bounded input takes one
    shard: its release then runs without state or timers, which costs less than a timer
    firing per stream and step even for a single stream. A key set not known up front (a
    ``PCollection`` of keys, privately selected keys) keeps the per-key path (0), which
    spreads the streams over the workers however many they turn out to be.

    >>> default_shards(None), default_shards(10), default_shards(1000)
    (0, 0, 15)
    >>> default_shards(None, bounded=True), default_shards(1, bounded=True)
    (0, 1)
    """
    if declared_keys is None:
        return 0
    if declared_keys < KEYS_PER_SHARD:
        return 1 if bounded else 0
    return declared_keys // KEYS_PER_SHARD
