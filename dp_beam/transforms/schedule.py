"""The public release schedule and the public key set of a continual transform.

``docs/design.md`` D2: nothing in the *shape* of the output may depend on the
data. Every stream releases once per step from the declared ``start`` up to
the declared ``end`` (or, streaming without ``end``, with the watermark,
forever), events or not; a stream exists for each declared key (``keys=[...]``)
or for each key a private selection admits (``keys=dpb.PrivateKeys(...)``).
A key seen in the data is not public, so ``key_fn`` without ``keys`` is
refused, and so is a batch run without ``end``: it would end where the data
ends.

This module holds the eager validation of those arguments and the small,
picklable :class:`Schedule` the per-event stages and the release DoFn share.
"""

import datetime
import math
import numbers
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Tuple

import apache_beam as beam

from dp_beam.transforms.stream_keys import normalize_key, shard_of

__all__ = ["Schedule", "DeclaredKeys", "StreamStart", "NotAdmitted", "resolve_schedule",
           "resolve_keys", "to_seconds"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def to_seconds(name: str, value: Any) -> float:
    """A point in event time as epoch seconds: ``datetime``, ISO-8601 string or number.

    Naive datetimes and ISO strings without an offset are taken as UTC.

    >>> to_seconds("start", "2013-01-01T00:00:00Z"), to_seconds("start", 3600)
    (1356998400.0, 3600.0)
    """
    if isinstance(value, str):
        try:
            value = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{name} must be a datetime, an ISO-8601 string or epoch seconds, "
                             f"got {value!r}") from None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return (value - _EPOCH).total_seconds()
    if isinstance(value, datetime.date):
        return to_seconds(name, datetime.datetime(value.year, value.month, value.day))
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a datetime, an ISO-8601 string or epoch seconds, "
                         f"got {value!r}")
    return float(value)


class Schedule(NamedTuple):
    """Steps ``start_step … end_step − 1`` of ``step_micros`` microseconds each (end ``None``: unbounded).

    Step k covers event time ``[k·step, (k+1)·step)``, aligned to the epoch,
    with the microsecond arithmetic Beam's ``FixedWindows`` uses, so an event
    lands in the same step here as in a windowed combine.

    >>> s = resolve_schedule(step_seconds=10, start=25, end=61)
    >>> s.start_step, s.end_step, s.step_of(24.9), s.check(2), s.check(7) is None
    (2, 7, 2, None, False)
    """
    step_micros: int
    start_step: int
    end_step: Optional[int]

    @property
    def step_seconds(self) -> float:
        return self.step_micros / 1e6

    @property
    def steps(self) -> Optional[int]:
        """Number of released steps, or ``None`` for an unbounded stream."""
        return None if self.end_step is None else self.end_step - self.start_step

    def step_of(self, seconds: float) -> int:
        return int(round(seconds * 1e6)) // self.step_micros

    def window(self, step: int) -> Tuple[float, float]:
        return step * self.step_seconds, (step + 1) * self.step_seconds

    def check(self, step: int) -> Optional[str]:
        """``None`` when ``step`` is released, else the reason for ``.invalid``."""
        if step < self.start_step:
            start, _ = self.window(self.start_step)
            return f"event time before start (step {step} < start step {self.start_step} at {start:g} s)"
        if self.end_step is not None and step >= self.end_step:
            end, _ = self.window(self.end_step)
            return f"event time at or after end (step {step} >= end step {self.end_step} at {end:g} s)"
        return None

    def require_end(self, bounded: bool, transform: str = "") -> None:
        """Bounded input must declare where its streams end (``ValueError`` naming ``end``)."""
        if bounded and self.end_step is None:
            raise ValueError(
                f"end is required for bounded input{f' ({transform})' if transform else ''}: "
                "give end= (or horizon=) so that a batch run's streams end at a declared step, "
                "not where the data ends (the last event would otherwise decide how many steps "
                "are released)")


def resolve_schedule(step_seconds: float, start: Any, end: Any = None,
                     horizon: Optional[int] = None) -> Schedule:
    """Validates ``start``/``end``/``horizon`` against the step grid; ``ValueError`` names the parameter.

    ``start`` is required and aligned down to the grid; ``end`` is the first
    step *not* released (an ``end`` inside a step releases that step). With a
    ``horizon`` and no ``end`` the streams end after ``horizon`` steps; with
    both, ``end`` must not lie beyond the horizon.
    """
    step_micros = int(round(step_seconds * 1e6))
    if start is None:
        raise ValueError("start is required: the first step every stream releases (a datetime, "
                         "an ISO-8601 string or epoch seconds). Streams must not start at their "
                         "first event, which would reveal it")
    start_s = to_seconds("start", start)
    start_step = int(round(start_s * 1e6)) // step_micros
    end_step = None
    if end is not None:
        end_s = to_seconds("end", end)
        end_step = -(-int(round(end_s * 1e6)) // step_micros)
        if end_step <= start_step:
            raise ValueError(f"end must be after start, got start={start!r}, end={end!r}")
    if horizon is not None:
        if end_step is None:
            end_step = start_step + horizon
        elif end_step - start_step > horizon:
            raise ValueError(f"end is {end_step - start_step} steps after start, beyond "
                             f"horizon={horizon}: raise horizon or move end")
    return Schedule(step_micros, start_step, end_step)


class _Marker:
    """An aggregate that carries no data, only its kind (equal to every marker of its class)."""

    def __eq__(self, other):
        return type(other) is type(self)

    def __hash__(self):
        return hash(type(self).__name__)

    def __repr__(self):
        return f"{type(self).__name__}()"


class StreamStart(_Marker):
    """Marker aggregate: the stream of this key opens at this element's step (a public event)."""


class NotAdmitted(_Marker):
    """Marker aggregate: private key selection ended without admitting this key (internal only)."""


class DeclaredKeys(NamedTuple):
    """A public key set: a list known at construction (``keys``) or a bounded PCollection (``pcoll``)."""
    keys: Optional[FrozenSet[Any]]
    pcoll: Optional[beam.PCollection]

    def seeds(self, pipeline: beam.Pipeline, start_step: int,
              label: str = "DeclaredKeys") -> beam.PCollection:
        """``(key, (start_step, StreamStart()))`` for every declared key: every stream opens at ``start``."""
        if self.pcoll is not None:
            if not self.pcoll.is_bounded:
                raise ValueError("keys must be a list or a bounded PCollection of public keys; an "
                                 "unbounded one would make the key set grow with the stream")
            # A key listed twice opens its stream once: the release DoFn
            # ignores a second StreamStart (no Distinct: its GroupByKey fails
            # in streaming pipelines on the direct runner). Keys are
            # normalised like event keys; one that cannot be a key (NaN,
            # unhashable) opens no stream (no event can match it).
            return self.pcoll | f"{label}Open" >> beam.FlatMap(_open_stream, start_step)
        # One element whose function holds the keys, rather than a Create of the markers:
        # Create would infer the type of every marker and encode each of them three times
        # at construction (`benchmarks/scale.py --build-keys 100000`: 6.1 s of CPU to build and
        # translate a ContinualCount with 100,000 declared keys, now 0.4 s), and its default
        # reshuffle would shuffle every key before the grouping by stream or shard that
        # follows anyway.
        return (pipeline
                | f"{label}Impulse" >> beam.Impulse()
                | f"{label}Create" >> beam.FlatMap(
                    _declared_seeds, tuple(sorted(self.keys, key=repr)), start_step
                ).with_output_types(Tuple[Any, Tuple[int, Any]]))

    def shard_seeds(self, pipeline: beam.Pipeline, start_step: int, shards: int,
                    label: str = "DeclaredKeys") -> beam.PCollection:
        """The markers of :meth:`seeds` (a list of keys) routed to ``shards`` shards by
        :func:`~dp_beam.transforms.stream_keys.shard_of`: ``(shard, [(key, start_step,
        StreamStart()), ...])``, one element per shard that has keys, in the shape of the
        partial totals the timer-free sharded release groups with them (a 64th of the
        elements of one per key, at the default shard count)."""
        if self.keys is None:
            raise ValueError("shard_seeds needs a list of keys")
        return (pipeline
                | f"{label}Impulse" >> beam.Impulse()
                | f"{label}Create" >> beam.FlatMap(
                    _declared_shard_seeds, tuple(sorted(self.keys, key=repr)), start_step, shards
                ).with_output_types(Tuple[int, Any]))

    def side_input(self) -> Optional[beam.pvalue.AsList]:
        """The side input the validation stage reads (``None`` for a list of keys)."""
        if self.pcoll is None:
            return None
        return beam.pvalue.AsList(self.pcoll)


def _declared_seeds(unused_impulse, keys, start_step):
    marker = (start_step, StreamStart())
    for key in keys:
        yield key, marker


def _declared_shard_seeds(unused_impulse, keys, start_step, shards):
    marker = StreamStart()
    routed: Dict[int, List[Any]] = {}
    for key in keys:
        routed.setdefault(shard_of(key, shards), []).append((key, start_step, marker))
    return routed.items()


def _open_stream(key, start_step):
    key, err = normalize_key(key)
    if err is None and key is not None:
        yield key, (start_step, StreamStart())


def _check_key(key):
    """A declared key, normalised as event keys are (``ValueError`` naming ``keys`` if it
    cannot be one)."""
    if key is None:
        raise ValueError("keys must not contain None (None is the key of an unkeyed stream)")
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"keys must be hashable, got {key!r}") from None
    normal, err = normalize_key(key)
    if err and "NaN" in err:
        raise ValueError(f"keys must not contain NaN (NaN is not equal to itself), got {key!r}")
    if err:
        raise ValueError(f"keys must be strings, numbers, bytes or tuples of these, got {key!r}: "
                         f"{err}")
    return normal


def resolve_keys(key_fn: Optional[Callable[[Any], Any]], keys: Any) -> Any:
    """Validates ``key_fn``/``keys``: ``None`` (one unkeyed stream), :class:`DeclaredKeys`, or ``keys`` itself
    when it is a private selection (a ``dp_beam.PrivateKeys``)."""
    from dp_beam.transforms.keys import PrivateKeys  # keys.py builds on this module
    if key_fn is None:
        if keys is not None:
            raise ValueError("keys needs key_fn (the function that gives an event's key), got "
                             f"keys={keys!r} and key_fn=None")
        return None
    if keys is None:
        raise ValueError(
            "keys is required with key_fn: declare the public key set (keys=[...] or a PCollection "
            "of keys) or select keys privately (keys=dpb.PrivateKeys(...)). A key seen in the data "
            "is not public: one event of a new key would create a stream")
    if isinstance(keys, PrivateKeys):
        return keys
    if isinstance(keys, beam.PCollection):
        return DeclaredKeys(None, keys)
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
        raise ValueError(f"keys must be an iterable of public keys, a PCollection of them or a "
                         f"dp_beam.PrivateKeys, got {keys!r}")
    declared = frozenset(_check_key(k) for k in keys)
    if not declared:
        raise ValueError("keys must not be empty")
    return DeclaredKeys(declared, None)
