"""The per-user stages of ``ContinualMean``: validation and the withhold-release schedule.

:class:`PrepareMeanEvents` validates and clamps every event in parallel
(:class:`PrepareMeanEventsBatch`, for bounded input, also gathers a bundle's events
per user); :class:`WithholdRelease` (unbounded input, one Beam state cell per user)
and :class:`WithholdReleaseBatch` (bounded input, a user's events grouped) run each
user's withhold-release schedule (docs/privacy/mean.md M-2) for every key the
user keeps (M-9) and emit the user's per-step :class:`MeanAggregate` s
(:class:`WithholdReleaseTotals`: merged per bundle, key and step, for the sharded
release). The schedule and every projection are the mechanism's
(:func:`dp_beam.mechanisms.continual_mean.contribution`); these stages only
route events to it.
"""

import itertools
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms.continual_mean import MeanParams, UserState, contribution, user_hash
from dp_beam.transforms.contributions import capped, capped_records, event_order
from dp_beam.transforms.events import INVALID, NAMESPACE, TRANSIENT_ERRORS, ValidatingDoFn, as_real
from dp_beam.transforms.keys import UNITS
from dp_beam.transforms.mean_aggregates import PackedSamples, compacted, merge_into
from dp_beam.transforms.steps import BundleUserEvents, by_shard, shard_count, timestamp_of_micros
from dp_beam.transforms.stream_keys import KV, StreamKey

__all__ = ["PrepareMeanEvents", "PrepareMeanEventsBatch", "WithholdRelease", "WithholdReleaseBatch",
           "WithholdReleaseTotals"]


@beam.typehints.with_output_types(KV)
class PrepareMeanEvents(ValidatingDoFn):
    """Event time, key, user and value of each event → ``(user, (key, value, ts))`` at time ``ts``.

    ``value`` is clamped to the bounds (a float for d = 1, a tuple of d floats
    otherwise; clamping counted in the ``clamped`` metric). Failing user
    functions, ``None`` users or keys, non-real or non-finite coordinates,
    values of the wrong length and event times outside Beam's range go to
    ``invalid`` with the reason.
    """

    def __init__(self, transform: str, value_fn: Callable[[Any], Any],
                 user_fn: Callable[[Any], Any], key_fn: Optional[Callable[[Any], Any]],
                 timestamp_fn: Optional[Callable[[Any], Any]], lower: Sequence[float],
                 upper: Sequence[float], schedule: Any = None, keys: Any = None,
                 transient_errors: Any = TRANSIENT_ERRORS) -> None:
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._value_fn = value_fn
        self._user_fn = user_fn
        self._lo = [float(v) for v in lower]
        self._hi = [float(v) for v in upper]
        self._dim = len(self._lo)
        self._clamped = Metrics.counter(NAMESPACE, f"{transform}.clamped")

    def _value(self, raw):
        """The clamped value, or ``(None, reason)``."""
        d = self._dim
        if d == 1 and type(raw) is float and math.isfinite(raw):
            # The common case, without the generic checks below.
            lo, hi = self._lo[0], self._hi[0]
            if raw < lo or raw > hi:
                self._clamped.inc()
                return min(max(raw, lo), hi), None
            return raw, None
        if isinstance(raw, np.ndarray):
            raw = raw.tolist() if raw.ndim == 1 else raw
        if isinstance(raw, (list, tuple)):
            items = raw
        elif d == 1:
            items = (raw,)
        else:
            return None, (f"not a sequence of {d} real numbers: {type(raw).__name__}")
        if len(items) != d:
            return None, f"value has {len(items)} coordinates, expected {d}"
        out = []
        clamped = False
        for j, (item, lo, hi) in enumerate(zip(items, self._lo, self._hi)):
            v, err = as_real(item)
            if err:
                return None, err if d == 1 else f"coordinate {j}: {err}"
            if v < lo or v > hi:
                clamped = True
                v = min(max(v, lo), hi)
            out.append(v)
        if clamped:
            self._clamped.inc()
        return (out[0] if d == 1 else tuple(out)), None

    def _checked(self, element, micros, declared):
        """``(user, (key, value, ts))`` of a valid ``element``, else its dead letter."""
        ts, key, err = self._time_and_key(element, micros, declared)
        if err:
            return self._reject(element, err, micros)
        user, err = self._user(element, self._user_fn)
        if err:
            return self._reject(element, err, micros)
        raw, err = self._call("value_fn", self._value_fn, element)
        if err:
            return self._reject(element, err, micros)
        value, err = self._value(raw)
        if err:
            return self._reject(element, err, micros)
        return user, (key, value, ts)

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        out = self._checked(element, micros, declared)
        if type(out) is tuple:
            return (beam.window.TimestampedValue(out, out[1][2]),)
        return (out,)


#: Valid events a bundle of :class:`PrepareMeanEventsBatch` holds before it sends them on.
MAX_BUNDLE_EVENTS = 1 << 16


@beam.typehints.with_output_types(KV)
class PrepareMeanEventsBatch(BundleUserEvents, PrepareMeanEvents):
    """:class:`PrepareMeanEvents` for bounded input, a bundle's valid events gathered per user:
    ``(user, [(key, value, ts), ...])``, the events in the order they came, so the per-user
    grouping that follows holds each user's events in the same order as one element each
    (for :class:`WithholdReleaseBatch` with ``gathered=True``).

    An element per event cost the runner a dispatch, an encoding and a decoding per
    event on its way through the grouping; here that is paid per user and bundle. A
    bundle sends its users' lists on at its end, or whenever it holds
    :data:`MAX_BUNDLE_EVENTS` events (a bound on its memory), in the global window at
    the earliest Beam timestamp among them. Dead letters leave at once, as before.
    """

    # The events are gathered at their Beam timestamps' microseconds.
    _stamp = staticmethod(timestamp_of_micros)

    def _user_events_bound(self):
        return MAX_BUNDLE_EVENTS

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        out = self._checked(element, micros, declared)
        if type(out) is not tuple:
            return (out,)
        user, event = out
        return self._gather(user, event, micros)


def _micros(ts: Any) -> int:
    """``Timestamp.of(ts).micros``: for an int or a float that is ``int(ts * 10**6)``, computed
    here without the object (once per event)."""
    return int(ts * 1000000) if type(ts) in (float, int) else Timestamp.of(ts).micros

class _UserStage(beam.DoFn):
    """Per-user schedule (M-2) of one event: the part both per-user stages share.

    A user's streams map each key it keeps to ``[UserState, latest event
    time]``: the schedule's count, segment sum (d numbers), first step and
    hash. A key beyond the user's first ``max_keys``, or a sample beyond
    ``max_samples_per_user`` in a key, goes to ``capped`` (one ``invalid``
    record per user, reason and step, :class:`CountCapped`). A sample's
    aggregate belongs to the step of the latest event time the user has shown
    in that key, so a released element never lands in a step before one of
    its own samples.
    """

    def __init__(self, transform: str, params: MeanParams, lower: Sequence[float],
                 upper: Sequence[float], step_micros: int, max_keys: int,
                 selecting: bool = False) -> None:
        self._transform = transform
        # Private key selection: signal each user's first event under a key.
        self._selecting = selecting
        self._params = params
        self._lower = np.asarray(lower, dtype=np.float64)
        self._range = np.asarray(upper, dtype=np.float64) - self._lower
        self._step_micros = step_micros
        self._max_keys = max_keys
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")
        self._over_keys = Metrics.counter(NAMESPACE, f"{transform}.over_keys")

    def setup(self):
        # Scalars skip NumPy broadcasting on the per-event path.
        self._lo0, self._r0 = float(self._lower[0]), float(self._range[0])
        self._scalar = self._params.dim == 1

    def _reject(self, counter, reason, user, key, value, ts, by_key=False):
        counter.inc()
        return capped(reason, user, _micros(ts) // self._step_micros,
                      {"key": key, "value": list(value) if isinstance(value, tuple) else value}, ts,
                      key=by_key)

    def _consume(self, streams, user, key, value, ts):
        """``(aggregate, latest, step)`` of one event, updating ``streams``; or a rejection."""
        entry = streams.get(key)
        if entry is None:
            if len(streams) >= self._max_keys:
                return self._reject(self._over_keys,
                                    f"max_keys_per_user ({self._max_keys}) exceeded for user",
                                    user, key, value, ts, by_key=True)
            entry = streams[key] = [UserState(uhash=user_hash(user)), None]
        ustate = entry[0]
        m = self._params.m
        if ustate.count >= m:
            return self._reject(self._over, f"max_samples_per_user ({m}) exceeded for user",
                                user, key, value, ts)
        latest = ts if entry[1] is None else max(entry[1], ts)
        entry[1] = latest
        # The step of the event-time window Beam would assign (same microsecond rounding).
        step = _micros(latest) // self._step_micros
        if self._scalar:
            # A float: the mechanism's scalar schedule (the same arithmetic as on arrays).
            x = float((value - self._lo0) / self._r0)
        else:
            x = (np.asarray(value, dtype=np.float64) - self._lower) / self._range
        return contribution(self._params, ustate, x, step=step), latest, step


@beam.typehints.with_output_types(KV)
class WithholdRelease(_UserStage):
    """Streaming per-user stage: ``(user, (key, value, ts))`` → ``(key, MeanAggregate)``.

    All of a user's schedules live in one Beam state cell (O(k·d) numbers);
    events are taken in arrival order, so a user keeps the first keys it is
    seen with. The aggregate is stamped with the latest event time, and the
    step windows downstream place it.
    """

    STATE = ReadModifyWriteStateSpec("user", PickleCoder())

    def process(self, element, state=beam.DoFn.StateParam(STATE)):
        user, (key, value, ts) = element
        stored = state.read() or {}
        streams = {k: [UserState.from_tuple(t), latest] for k, (t, latest) in stored.items()}
        new = key not in streams
        out = self._consume(streams, user, key, value, ts)
        if isinstance(out, pvalue.TaggedOutput):
            yield out
            return
        if new and self._selecting:
            yield pvalue.TaggedOutput(UNITS, (key, ts))
        agg, latest, _ = out
        stored[key] = (streams[key][0].to_tuple(), latest)
        state.write(stored)
        yield beam.window.TimestampedValue((key, agg), latest)


@beam.typehints.with_output_types(KV)
class WithholdReleaseBatch(_UserStage):
    """Bounded per-user stage: ``(user, [(key, value, ts), ...])`` → ``((key, step), MeanAggregate)``.

    All of a user's events arrive together (a ``GroupByKey``), so they are
    taken in event-time order, ties by key and value
    (:func:`~dp_beam.transforms.contributions.event_order`): the schedule and the
    keys and samples a user keeps are those of a stream that arrived in that order,
    whatever order the grouping gave them, so a rerun keeps the same ones. A
    user's aggregates of one key and step are merged before they leave, and
    the step is part of the output key, so the combine downstream needs no
    event-time windows (bounded input has no late data). No Beam state is
    involved: on the batch runners, loading and measuring a state cell per
    user cost more than the schedule itself.

    ``gathered=True``: the grouped values are lists of a user's events
    (:class:`PrepareMeanEventsBatch`), taken in the same order as their concatenation.

    Events beyond a cap leave as finished dead letters on the ``invalid`` output: one
    record per (reason, user, step[, key]), those :class:`.CountCapped` makes of the
    streaming stage's ``capped`` events (:func:`.capped_records`). Every event of the
    user is in this element, so no further grouping is needed.
    """

    def __init__(self, *args: Any, gathered: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gathered = gathered

    def process(self, element):
        user, events = element
        if self._gathered:
            events = itertools.chain.from_iterable(events)
        streams, pending, over = {}, {}, []
        for key, value, ts in sorted(events, key=event_order):
            new = key not in streams
            out = self._consume(streams, user, key, value, ts)
            if isinstance(out, pvalue.TaggedOutput):
                over.append(out)
                continue
            if new and self._selecting:
                yield pvalue.TaggedOutput(UNITS, (key, ts))
            agg, _, step = out
            cur = pending.get(key)
            if cur is not None and cur[0] == step:
                merge_into(cur[1], agg)
                continue
            if cur is not None:
                yield from self._emit(key, cur[0], cur[1])
            pending[key] = [step, agg]
        for key, (step, agg) in pending.items():
            yield from self._emit(key, step, agg)
        for record in capped_records(self._transform, over):
            yield pvalue.TaggedOutput(INVALID, record)

    def _emit(self, key, step, agg):
        """The outputs for a user's aggregate of (key, step), in the order they are made."""
        return (((key, step), agg),)


#: The (key, step) entries a bundle's table of partial aggregates holds before it sends on
#: its oldest tenth: the bound of the partial combine that Beam 2.77 lifts out of a
#: ``CombinePerKey`` (``PGBKCVOperation``) for any combine fn but its built-in counts and
#: means. The same bound and eviction order form the same partial sums, merged in the same
#: order, so the float sums of an aggregate are those of the ``CombinePerKey`` path.
MAX_BUNDLE_STEPS = 100 * 1000


@beam.typehints.with_output_types(Tuple[int, List[Tuple[StreamKey, int, Any]]])
class WithholdReleaseTotals(WithholdReleaseBatch):
    """:class:`WithholdReleaseBatch` for the sharded release of bounded input: its aggregates
    merged per (key, step) over the bundle, sent on as ``(shard, [(key, step, accumulator),
    ...])`` for the release to merge (``release_streams(..., combine_fn=MergeAggregates())``).

    An element per user, key and step cost the runner a dispatch, an encoding and two
    groupings (the combine's, then the shard's) per aggregate, most of the bounded mean's
    time at thousands of keys. The table is the one Beam's lifted combine would keep
    (:data:`MAX_BUNDLE_STEPS`): each (key, step) takes its users' aggregates in the order
    :class:`WithholdReleaseBatch` emits them, and the release merges a (key, step)'s
    partials in the order they left, as the combine's merge of its partials does; so the
    released float sums are the same bit for bit (tests/transforms/test_mean_users.py
    checks the partials, tests/transforms/test_shards.py the releases). The partials
    leave compacted, as the lifted combine's do (:meth:`.MergeAggregates.compact`).
    Each element is stamped at the earliest of its steps' last microseconds, in the
    global window.
    """

    def __init__(self, *args: Any, shards: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shards = shard_count(shards)
        self._table: Dict[Any, Any] = {}

    def start_bundle(self):
        self._table = {}

    def _emit(self, key, step, agg):
        table = self._table
        acc = table.get((key, step))
        if acc is not None:
            merge_into(acc, agg)
            return ()
        out = ()
        if len(table) >= MAX_BUNDLE_STEPS:
            # Beam's eviction: the oldest entries until a tenth of the table has left.
            n = len(table)
            out = by_shard({slot: table.pop(slot)
                            for slot in list(itertools.islice(table, n - n * 9 // 10))},
                           self._shards, self._step_micros, compacted)
        # The first aggregate of a (key, step) becomes its accumulator: the stage made it and
        # holds it nowhere else, and its fields are what merging it into an empty one gives.
        if type(agg.samples) is list:
            agg.samples = PackedSamples(agg.samples)
        table[key, step] = agg
        return out

    def finish_bundle(self):
        table, self._table = self._table, {}
        return by_shard(table, self._shards, self._step_micros, compacted)

