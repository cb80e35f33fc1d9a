"""The per-event stage of the ERM transforms: validated, clipped, keyed points per step.

Every event becomes ``(key, (ts, (id, tiebreak), features, label))`` in
parallel (:class:`PreparePoints`; bad events go to ``invalid``), and the
points of one step of one stream are collected into a list, packed into a
:class:`PointBatch` once it is wide (:class:`PackPoints`). Their release order,
and why it never depends on a point's content, is the business of
:mod:`dp_beam.transforms.erm`.
"""

import functools
import hashlib
import math
import struct
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from dp_beam.transforms.event_ids import id_key
from dp_beam.transforms.events import NAMESPACE, TRANSIENT_ERRORS, ValidatingDoFn
from dp_beam.transforms.steps import BundleTotals
from dp_beam.transforms.stream_keys import KV, StreamKey

__all__ = ["CollectPoints", "MAX_BUNDLE_POINTS", "PACK_MIN_VALUES", "PackPoints", "PointBatch",
           "PreparePointTotals", "PreparePoints", "reproducible_tiebreak"]


def reproducible_tiebreak(seed, ts, features, class_index):
    """Test modes only (``rng`` an int seed or a ``NoiseSource``): a reproducible 64-bit
    tie-breaker, a hash of (seed, point). It depends on the point's content; production
    (``rng=None``) draws it at random instead (see :class:`PreparePoints`)."""
    text = repr(("dp_beam.erm.tiebreak", seed, ts, features, class_index)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


@beam.typehints.with_output_types(KV)
class PreparePoints(ValidatingDoFn):
    """Extracts ``(key, (ts, (id, tiebreak), features, label))``; clips features; routes bad
    elements to ``invalid``.

    Features must be a sequence of ``n_features`` finite reals and the label
    one of the declared classes (it is replaced by the declared instance).
    Feature vectors longer than ``feature_bound`` are scaled down to it
    (contribution bounding, erm.md E-2) and counted in the ``clipped`` metric.
    With ``id_fn`` the event's id must be valid for
    :func:`~dp_beam.transforms.event_ids.id_key`; without it the id part is
    ``()``. Nothing raises.

    The tie-breaker fixes the position of the point among the points of its
    step with the same event time (the release sorts by ``(ts, id,
    tiebreak)``). In production (``seed`` is None) it is left ``None`` here
    and set by the release from the secret noise key
    (:meth:`dp_beam.transforms.erm.ERMReleaseSpec.ordered`). In test modes (``reproducible``) it is
    :func:`reproducible_tiebreak`.
    """

    def __init__(self, transform, features_fn, label_fn, n_features, classes, feature_bound,
                 key_fn=None, timestamp_fn=None, schedule=None, keys=None, id_fn=None,
                 reproducible=False, seed=None, transient_errors=TRANSIENT_ERRORS):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._features_fn, self._label_fn = features_fn, label_fn
        self._id_fn = id_fn
        self._d = n_features
        self._classes = tuple(classes)
        self._class_index = {c: i for i, c in enumerate(self._classes)}
        self._bound = feature_bound
        self._reproducible = reproducible
        self._seed = seed
        self._clipped = Metrics.counter(NAMESPACE, f"{transform}.clipped")

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        out = self._point(element, micros, declared)
        if type(out) is tuple:
            key, point = out
            return (beam.window.TimestampedValue((key, point), point[0]),)
        return (out,)

    def _point(self, element, micros, declared):
        """``(key, (ts, (id, tiebreak), features, label))`` of a valid ``element``, else its
        dead letter."""
        ts, key, err = self._time_and_key(element, micros, declared)
        if err:
            return self._reject(element, err, micros)
        event_id = ()
        if self._id_fn is not None:
            raw_id, err = self._call("id_fn", self._id_fn, element)
            if not err:
                event_id, err = id_key(raw_id)
            if err:
                return self._reject(element, err, micros)
        features, err = self._features(self._features_fn, self._d, element)
        if err:
            return self._reject(element, err, micros)
        label, err = self._call("label_fn", self._label_fn, element)
        if err:
            return self._reject(element, err, micros)
        try:
            index = self._class_index.get(label)
        except TypeError:
            # Unhashable: the release could not look it up (an array label equal to a class).
            index = None
        if index is None:
            return self._reject(
                element, f"label {label!r:.80} is not one of classes {self._classes!r}", micros)
        label = self._classes[index]
        # hypot does not overflow where the sum of squares would (a huge vector
        # would otherwise be scaled to zero instead of to the bound).
        norm = math.hypot(*features)
        if norm > self._bound:
            self._clipped.inc()
            if math.isinf(norm):
                top = max(abs(x) for x in features)
                features = [x / top for x in features]
                norm = math.hypot(*features)
            features = [x * (self._bound / norm) for x in features]
        features = tuple(features)
        tiebreak = reproducible_tiebreak(self._seed, ts, features, index) if self._reproducible else None
        return key, (ts, (event_id, tiebreak), features, label)


class CollectPoints(beam.CombineFn):
    """The list of points of one step (order is restored at release)."""

    def create_accumulator(self):
        return []

    def add_input(self, acc, point):
        acc.append(point)
        return acc

    def merge_accumulators(self, accs):
        # A new list: the release merges the partial lists it was given as input, and a
        # retried bundle must find them as they came.
        out = []
        for a in accs:
            out.extend(a)
        return out

    def extract_output(self, acc):
        return acc


#: The order key of a point without ``id_fn`` in production: no id, tie-breaker drawn later.
_PLAIN_ORDER = ((), None)


class PointBatch:
    """The points of one step of one stream as flat buffers, in the order they were added.

    A point is ``(ts, (id, tiebreak), features, label)`` with ``features`` a
    tuple of d floats (:class:`PreparePoints`); a batch keeps the event times
    and the features as little-endian float64 buffers and the order keys and labels as
    lists (``None`` for the order keys while every one is ``((), None)``, the
    production form without ``id_fn``). Iterating gives the points back,
    the same values in the same order (float64 holds a Python float exactly).

    Between a bundle and the release it travels as its :meth:`wire` form, two
    byte strings and two lists, which Beam's default coder copies as they are:
    a list of points costs a coded float per feature instead (measured with
    ``FastPrimitivesCoder``, 64 points of d = 100: 261 µs to encode and 425 µs
    to decode as a list, 7 and 4 µs as the wire form; packing the points costs
    184 µs and reading them back 207 µs, once each).

    >>> batch = PointBatch()
    >>> batch.add((60.0, ((), None), (0.5, -0.25), "yes"))
    >>> batch.extend(PointBatch.from_wire(batch.wire()))
    >>> list(batch) == [(60.0, ((), None), (0.5, -0.25), "yes")] * 2
    True
    """

    __slots__ = ("_times", "_orders", "_features", "_labels")

    def __init__(self) -> None:
        self._times = bytearray()
        self._orders: Optional[List[Any]] = None
        self._features = bytearray()
        self._labels: List[Any] = []

    def add(self, point: Tuple[float, Any, Sequence[float], Any]) -> None:
        """Appends one point."""
        ts, order, features, label = point
        if type(self._features) is bytes:
            self._writable()
        if self._orders is not None:
            self._orders.append(order)
        elif order != _PLAIN_ORDER:
            self._orders = [_PLAIN_ORDER] * len(self._labels) + [order]
        self._times += _TIME.pack(ts)
        # Packing a row at once costs a few ns a value; extending an array.array, ≈ 60.
        self._features += _row_layout(len(features)).pack(*features)
        self._labels.append(label)

    def extend(self, other: "PointBatch") -> None:
        """Appends the points of ``other`` (left as it is), in their order."""
        if self._orders is not None or other._orders is not None:
            self._orders = self.orders() + other.orders()
        if type(self._features) is bytes:
            self._writable()
        self._times += other._times
        self._features += other._features
        self._labels.extend(other._labels)

    def _writable(self) -> None:
        """Own buffers to append to, in place of a wire form's byte strings (copied once)."""
        self._times = bytearray(self._times)
        self._features = bytearray(self._features)

    def wire(self) -> Tuple[bytes, Optional[List[Any]], bytes, List[Any]]:
        """``(times, order keys or None, features, labels)``, the buffers as bytes."""
        return bytes(self._times), self._orders, bytes(self._features), self._labels

    @classmethod
    def of(cls, points: Iterable[Tuple[float, Any, Sequence[float], Any]]) -> "PointBatch":
        """The batch of ``points``, in their order."""
        batch = cls()
        for point in points:
            batch.add(point)
        return batch

    @classmethod
    def from_wire(cls, wire: Tuple[bytes, Optional[List[Any]], bytes, List[Any]]) -> "PointBatch":
        """The batch of a :meth:`wire` form.

        It reads the wire form's byte strings as they are (they cannot change) and copies them
        only when points are added: a release reads a step's batch once, and a copy of every
        step's features was one more copy of all the points of a shard in memory."""
        times, orders, features, labels = wire
        batch = cls()
        batch._times = bytes(times)
        batch._orders = None if orders is None else list(orders)
        batch._features = bytes(features)
        batch._labels = list(labels)
        return batch

    def __len__(self) -> int:
        return len(self._labels)

    def times(self) -> List[float]:
        """The event times, in order."""
        return [ts for ts, in _TIME.iter_unpack(self._times)]

    def orders(self) -> List[Any]:
        """The ``(id, tiebreak)`` order keys, in order."""
        return list(self._orders) if self._orders is not None else [_PLAIN_ORDER] * len(self)

    def matrix(self) -> np.ndarray:
        """The features as an ``(n, d)`` float64 array (read-only, over an immutable copy of the
        buffer, so the batch can still grow; a wire form's bytes are that copy already)."""
        n = len(self)
        if not n:
            return np.zeros((0, 0))
        return np.frombuffer(bytes(self._features), dtype="<f8").reshape(n, -1)

    def labels(self) -> List[Any]:
        """The labels, in order."""
        return self._labels

    def __iter__(self) -> Iterator[Tuple[float, Any, Tuple[float, ...], Any]]:
        n = len(self)
        rows = _row_layout(len(self._features) // (8 * n)).iter_unpack(self._features) if n else ()
        return zip(self.times(), self.orders(), rows, self._labels)


@functools.lru_cache(maxsize=64)
def _row_layout(d: int) -> struct.Struct:
    """A row of d float64s, little-endian (the wire form's byte order on every worker)."""
    return struct.Struct(f"<{d}d")


_TIME = _row_layout(1)


#: A step's points leave a bundle as a :class:`PointBatch` from this many feature values on
#: (points × d); below it a list costs less. Gathering, one encoding and decoding, and reading
#: the points back, measured with ``FastPrimitivesCoder``: 16 points of d = 8 (128 values)
#: 33 µs as a list and 29 µs packed; 2 points of d = 10, 6 µs and 16 µs.
PACK_MIN_VALUES = 128


class PackPoints(CollectPoints):
    """:class:`CollectPoints` whose wide accumulators leave a bundle packed: an accumulator
    becomes a :class:`PointBatch` once it holds :data:`PACK_MIN_VALUES` feature values, and
    ``compact`` sends it (or a list that wide) in the batch's wire form. The combine of every
    ERM transform: the per-key path's ``CombinePerKey``, whose lifted partial combine
    compacts each bundle's accumulators before the grouping, and the sharded release, which
    merges the partial lists of :class:`PreparePointTotals`.

    ``merge_accumulators`` and ``extract_output`` take every form (a list, a batch, a wire
    form) and leave their inputs as they are; lists alone merge into a list, anything else
    into a batch, in the order of the inputs (the release's order of a step's points never
    depends on it: :meth:`~dp_beam.transforms.erm.ERMReleaseSpec.ordered`).

    >>> fn = PackPoints()
    >>> point = (1.0, ((), None), (0.5,) * 64, 1)
    >>> a = fn.add_input(fn.create_accumulator(), point)
    >>> type(a).__name__
    'list'
    >>> a = fn.add_input(a, point)      # 128 feature values: packed from here on
    >>> type(a).__name__
    'PointBatch'
    >>> wire = fn.compact(a)
    >>> type(wire).__name__, type(fn.extract_output(fn.merge_accumulators([wire, a]))).__name__
    ('tuple', 'PointBatch')
    >>> list(fn.extract_output(wire)) == list(a) == [point, point]
    True
    """

    def add_input(self, acc, point):
        # A list that reaches the packing size is packed as it grows: the points' feature
        # tuples are then freed as they come instead of living until the accumulator
        # leaves (a bundle's table held up to MAX_BUNDLE_POINTS of them, about 3 KB each
        # at d = 100).
        if type(acc) is list:
            acc.append(point)
            if len(acc) * len(point[2]) >= PACK_MIN_VALUES:
                return PointBatch.of(acc)
            return acc
        acc = _batch(acc)
        acc.add(point)
        return acc

    def merge_accumulators(self, accs):
        accs = list(accs)
        if all(type(acc) is list for acc in accs):
            return super().merge_accumulators(accs)
        out = PointBatch()
        for acc in accs:
            out.extend(_batch(acc))
        return out

    def compact(self, acc):
        if type(acc) is PointBatch:
            return acc.wire()
        if type(acc) is list and acc and len(acc) * len(acc[0][2]) >= PACK_MIN_VALUES:
            return _batch(acc).wire()
        return acc

    def extract_output(self, acc):
        return acc if type(acc) is list else _batch(acc)


def _batch(acc):
    """The :class:`PointBatch` of a :class:`PackPoints` accumulator in any form."""
    if type(acc) is PointBatch:
        return acc
    if type(acc) is list:
        return PointBatch.of(acc)
    return PointBatch.from_wire(acc)


#: Points a bundle of :class:`PreparePointTotals` holds before it sends them on (its memory).
MAX_BUNDLE_POINTS = 1 << 16


@beam.typehints.with_output_types(Tuple[int, List[Tuple[StreamKey, int, Any]]])
class PreparePointTotals(BundleTotals, PreparePoints):
    """:class:`PreparePoints` for the sharded release of bounded input: the same checks, dead
    letters and points, gathered per (key, step) over the bundle into lists, packed when
    wide (:class:`PackPoints`), and sent on grouped by shard (:class:`~dp_beam.transforms.steps.
    StepTotals`), at most :data:`MAX_BUNDLE_POINTS` points at a time, for the release to
    merge (``release_streams(..., combine_fn=PackPoints())``).

    An element per point cost a window assignment, a step-keying DoFn and a combine's
    grouping before the shard's. The release sorts a step's points by a key that never
    depends on their order (:meth:`~dp_beam.transforms.erm.ERMReleaseSpec.ordered`), so
    the lists' order changes nothing and the records are those of the per-key path.
    The step is that of the event time as a Beam timestamp holds it (whole microseconds,
    truncated), as the per-point element's timestamp would give it.
    """

    def __init__(self, *args: Any, step_micros: int, shards: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_totals(PackPoints(), step_micros, shards, MAX_BUNDLE_POINTS)

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        out = self._point(element, micros, declared)
        if type(out) is tuple:
            key, point = out
            # Timestamp(seconds) keeps int(seconds · 10^6) microseconds.
            return self._totals.add(key, int(point[0] * 1_000_000), point)
        return (out,)
