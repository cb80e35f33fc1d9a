"""The per-user stages of ``ContinualMean``: validation and the withhold-release schedule.

:class:`PrepareMeanEvents` validates and clamps every event in parallel;
:class:`WithholdRelease` (unbounded input, one Beam state cell per user) and
:class:`WithholdReleaseBatch` (bounded input, a user's events grouped) run each
user's withhold-release schedule (docs/privacy/mean.md M-2) for every key the
user keeps (M-9) and emit the user's per-step :class:`MeanAggregate` s. The
schedule and every projection are the mechanism's
(:func:`dp_beam.mechanisms.continual_mean.contribution`); these stages only
route events to it.
"""

import math
from typing import Any, Callable, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.coders import PickleCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms.continual_mean import MeanParams, UserState, contribution, user_hash
from dp_beam.transforms.contributions import capped
from dp_beam.transforms.events import NAMESPACE, TRANSIENT_ERRORS, ValidatingDoFn, as_real
from dp_beam.transforms.keys import UNITS
from dp_beam.transforms.mean_aggregates import merge_into
from dp_beam.transforms.stream_keys import KV

__all__ = ["PrepareMeanEvents", "WithholdRelease", "WithholdReleaseBatch"]


@beam.typehints.with_output_types(KV)
class PrepareMeanEvents(ValidatingDoFn):
    """Event time, key, user and value of each event → ``(user, (key, value, ts))`` at time ``ts``.

    ``value`` is clamped to the bounds (a float for d = 1, a tuple of d floats
    otherwise; clamping counted in the ``clamped`` metric). Failing user
    functions, ``None`` users or keys, non-real or non-finite coordinates,
    values of the wrong length and event times outside Beam's range go to
    ``invalid`` with the reason.

    ``stamp=False`` (bounded input) leaves the valid outputs' timestamps as they were:
    the per-user grouping that follows places its output at the end of the global
    window whatever they are, and everything after it reads ``ts`` from the value.
    """

    def __init__(self, transform: str, value_fn: Callable[[Any], Any],
                 user_fn: Callable[[Any], Any], key_fn: Optional[Callable[[Any], Any]],
                 timestamp_fn: Optional[Callable[[Any], Any]], lower: Sequence[float],
                 upper: Sequence[float], schedule: Any = None, keys: Any = None,
                 transient_errors: Any = TRANSIENT_ERRORS, stamp: bool = True) -> None:
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._stamp = stamp
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

    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        ts, key, err = self._time_and_key(element, timestamp, declared)
        if err:
            yield self._reject(element, err, timestamp)
            return
        user, err = self._user(element, self._user_fn)
        if err:
            yield self._reject(element, err, timestamp)
            return
        raw, err = self._call("value_fn", self._value_fn, element)
        if err:
            yield self._reject(element, err, timestamp)
            return
        value, err = self._value(raw)
        if err:
            yield self._reject(element, err, timestamp)
            return
        if self._stamp:
            yield beam.window.TimestampedValue((user, (key, value, ts)), ts)
        else:
            yield user, (key, value, ts)



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
    taken in event-time order (ties in arbitrary order): the schedule and the
    keys a user keeps are those of a stream that arrived in time order. A
    user's aggregates of one key and step are merged before they leave, and
    the step is part of the output key, so the combine downstream needs no
    event-time windows (bounded input has no late data). No Beam state is
    involved: on the batch runners, loading and measuring a state cell per
    user cost more than the schedule itself.
    """

    def process(self, element):
        user, events = element
        streams, pending = {}, {}
        for key, value, ts in sorted(events, key=lambda e: e[2]):
            new = key not in streams
            out = self._consume(streams, user, key, value, ts)
            if isinstance(out, pvalue.TaggedOutput):
                yield out
                continue
            if new and self._selecting:
                yield pvalue.TaggedOutput(UNITS, (key, ts))
            agg, _, step = out
            cur = pending.get(key)
            if cur is not None and cur[0] == step:
                merge_into(cur[1], agg)
                continue
            if cur is not None:
                yield (key, cur[0]), cur[1]
            pending[key] = [step, agg]
        for key, (step, agg) in pending.items():
            yield (key, step), agg
