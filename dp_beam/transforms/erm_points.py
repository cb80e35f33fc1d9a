"""The per-event stage of the ERM transforms: validated, clipped, keyed points per step.

Every event becomes ``(key, (ts, (id, tiebreak), features, label))`` in
parallel (:class:`PreparePoints`; bad events go to ``invalid``), and the
points of one step of one stream are collected into a list
(:class:`CollectPoints`). Their release order, and why it never depends on
a point's content, is the business of :mod:`dp_beam.transforms.erm`.
"""

import hashlib
import math
from typing import Any, List, Tuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from dp_beam.transforms.event_ids import id_key
from dp_beam.transforms.events import NAMESPACE, TRANSIENT_ERRORS, ValidatingDoFn
from dp_beam.transforms.steps import BundleTotals
from dp_beam.transforms.stream_keys import KV, StreamKey

__all__ = ["CollectPoints", "MAX_BUNDLE_POINTS", "PreparePointTotals", "PreparePoints",
           "reproducible_tiebreak"]


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

    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        out = self._point(element, timestamp, declared)
        if type(out) is tuple:
            key, point = out
            return (beam.window.TimestampedValue((key, point), point[0]),)
        return (out,)

    def _point(self, element, timestamp, declared):
        """``(key, (ts, (id, tiebreak), features, label))`` of a valid ``element``, else its
        dead letter."""
        ts, key, err = self._time_and_key(element, timestamp, declared)
        if err:
            return self._reject(element, err, timestamp)
        event_id = ()
        if self._id_fn is not None:
            raw_id, err = self._call("id_fn", self._id_fn, element)
            if not err:
                event_id, err = id_key(raw_id)
            if err:
                return self._reject(element, err, timestamp)
        features, err = self._features(self._features_fn, self._d, element)
        if err:
            return self._reject(element, err, timestamp)
        label, err = self._call("label_fn", self._label_fn, element)
        if err:
            return self._reject(element, err, timestamp)
        try:
            index = self._class_index.get(label)
        except TypeError:
            # Unhashable: the release could not look it up (an array label equal to a class).
            index = None
        if index is None:
            return self._reject(
                element, f"label {label!r:.80} is not one of classes {self._classes!r}", timestamp)
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


#: Points a bundle of :class:`PreparePointTotals` holds before it sends them on (its memory).
MAX_BUNDLE_POINTS = 1 << 16


@beam.typehints.with_output_types(Tuple[int, List[Tuple[StreamKey, int, Any]]])
class PreparePointTotals(BundleTotals, PreparePoints):
    """:class:`PreparePoints` for the sharded release of bounded input: the same checks, dead
    letters and points, gathered per (key, step) over the bundle into lists
    (:class:`CollectPoints`) and sent on grouped by shard (:class:`~dp_beam.transforms.steps.
    StepTotals`), at most :data:`MAX_BUNDLE_POINTS` points at a time, for the release to
    merge (``release_streams(..., combine_fn=CollectPoints())``).

    An element per point cost a window assignment, a step-keying DoFn and a combine's
    grouping before the shard's. The release sorts a step's points by a key that never
    depends on their order (:meth:`~dp_beam.transforms.erm.ERMReleaseSpec.ordered`), so
    the lists' order changes nothing and the records are those of the per-key path.
    The step is that of the event time as a Beam timestamp holds it (whole microseconds,
    truncated), as the per-point element's timestamp would give it.
    """

    def __init__(self, *args: Any, step_micros: int, shards: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_totals(CollectPoints(), step_micros, shards, MAX_BUNDLE_POINTS)

    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        out = self._point(element, timestamp, declared)
        if type(out) is tuple:
            key, point = out
            # Timestamp(seconds) keeps int(seconds · 10^6) microseconds.
            return self._totals.add(key, int(point[0] * 1_000_000), point)
        return (out,)
