"""Per-event stages shared by the continual transforms: validate, clamp, bound.

These run in parallel on every event (DESIGN.md "time model"); only per-user
contribution bounding needs keyed state, and it keeps one counter per user.
"""

import math
import numbers
from typing import Any, Tuple

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

from dp_beam.records import InvalidElement

INVALID = "invalid"
NAMESPACE = "dp_beam"

# Event times are kept strictly inside Beam's representable range; the ends
# are sentinels (an element created without a timestamp sits at MIN_TIMESTAMP).
_MIN_SECONDS = MIN_TIMESTAMP.micros / 1e6
_MAX_SECONDS = MAX_TIMESTAMP.micros / 1e6


def as_real(value):
    """The value as a finite float, or a reason string if it is not one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None, f"not a real number: {type(value).__name__}"
    v = float(value)
    if math.isnan(v):
        return None, "value is NaN"
    if math.isinf(v):
        return None, "value is infinite"
    return v, None


class ValidatingDoFn(beam.DoFn):
    """Shared input validation of the transforms' first stage.

    Subclasses call :meth:`_time_and_key` (and :meth:`_user` where there is a
    privacy unit) and send failures to ``invalid`` with :meth:`_reject`; user
    functions run through
    :meth:`_call`, so an exception in one of them rejects the element instead
    of failing the job. Counts rejections in the ``<transform>.invalid`` metric.
    """

    def __init__(self, transform, key_fn=None, timestamp_fn=None, schedule=None, keys=None):
        self._transform = transform
        self._key_fn = key_fn
        self._timestamp_fn = timestamp_fn
        self._schedule = schedule
        # A frozenset of declared keys (or None: undeclared, or read from the
        # ``declared`` side input). Kept as a dict to the declared instance, so
        # an equal key of another type (numpy.str_ for str) joins its stream.
        self._keys = None if keys is None else {k: k for k in keys}
        self._side_source = None
        self._side_keys = None
        self._invalid = Metrics.counter(NAMESPACE, f"{transform}.invalid")

    def _reject(self, element, reason):
        self._invalid.inc()
        return pvalue.TaggedOutput(INVALID, InvalidElement(self._transform, reason, element))

    @staticmethod
    def _call(name, fn, element):
        try:
            return fn(element), None
        except Exception as e:  # a user function failing on one element must not kill the job
            return None, f"{name} raised {type(e).__name__}: {e}"

    def _event_time(self, element, timestamp):
        """``(seconds, None)``, or ``(None, reason)`` when the event time is unusable."""
        if self._timestamp_fn is not None:
            ts, err = self._call("timestamp_fn", self._timestamp_fn, element)
            if err:
                return None, err
            ts, err = as_real(ts)
            if err:
                return None, f"event time {err}"
        else:
            ts = timestamp.micros / 1e6
        if not _MIN_SECONDS < ts < _MAX_SECONDS:
            return None, ("event time missing or out of range "
                          "(give elements timestamps or pass timestamp_fn)")
        return ts, None

    def _declared(self, side):
        if side is None:
            return self._keys
        if side is not self._side_source:
            # The side input is the same list object for a whole bundle.
            self._side_source = side
            self._side_keys = {k: k for k in side}
        return self._side_keys

    def _key(self, element, side=None):
        """``(key, None)`` (``None`` without ``key_fn``), or ``(None, reason)``.

        With declared keys the key is returned as the declared instance, and a
        key outside the declared set is rejected (a public rule: free).
        """
        if self._key_fn is None:
            return None, None
        key, err = self._call("key_fn", self._key_fn, element)
        if err or key is None:
            return None, err or "key_fn returned None"
        declared = self._declared(side)
        if declared is None:
            try:
                hash(key)
            except TypeError:
                return None, f"key_fn returned an unhashable {type(key).__name__}"
            return key, None
        try:
            found = declared.get(key)
        except TypeError:
            return None, f"key_fn returned an unhashable {type(key).__name__}"
        if found is None:
            return None, f"undeclared key {key!r} (not in keys)"
        return found, None

    def _time_and_key(self, element, timestamp, side=None):
        """``(seconds, key, None)``, or ``(None, None, reason)``: every transform's first checks.

        The event time must fall in a released step of the public schedule.
        """
        ts, err = self._event_time(element, timestamp)
        if err:
            return None, None, err
        if self._schedule is not None:
            err = self._schedule.check(self._schedule.step_of(ts))
            if err:
                return None, None, err
        key, err = self._key(element, side)
        if err:
            return None, None, err
        return ts, key, None

    def _user(self, element, user_fn):
        """``(user, None)``, or ``(None, reason)`` when ``user_fn`` raises or returns None."""
        user, err = self._call("user_fn", user_fn, element)
        if err or user is None:
            return None, err or "user_fn returned None"
        return user, None


@beam.typehints.with_output_types(Tuple[Any, Any])
class PrepareEvents(ValidatingDoFn):
    """Extracts (key, user, value) and the event time; routes bad elements to ``invalid``.

    Outputs ``(key, value)``, or ``(user, (key, value))`` when ``user_fn`` is
    given, at the event time. ``value`` is
    clamped to ``[lower, upper]`` (contribution bounding; counted in the
    ``clamped`` metric). User functions that raise, return ``None`` keys or
    users, non-real or non-finite values, or event times outside Beam's range
    send the element to ``invalid`` with the reason; nothing raises.
    """

    def __init__(self, transform, value_fn=None, lower=None, upper=None, key_fn=None,
                 user_fn=None, timestamp_fn=None, schedule=None, keys=None):
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys)
        self._value_fn = value_fn
        self._lower = lower
        self._upper = upper
        self._user_fn = user_fn
        self._clamped = Metrics.counter(NAMESPACE, f"{transform}.clamped")

    def process(self, element, timestamp=beam.DoFn.TimestampParam, declared=None):
        ts, key, err = self._time_and_key(element, timestamp, declared)
        if err:
            yield self._reject(element, err)
            return
        user = None
        if self._user_fn is not None:
            user, err = self._user(element, self._user_fn)
            if err:
                yield self._reject(element, err)
                return

        if self._value_fn is None:
            value = 1.0
        else:
            raw, err = self._call("value_fn", self._value_fn, element)
            if err:
                yield self._reject(element, err)
                return
            value, err = as_real(raw)
            if err:
                yield self._reject(element, err)
                return
            if value < self._lower or value > self._upper:
                self._clamped.inc()
                value = min(max(value, self._lower), self._upper)
        if self._user_fn is None:
            yield beam.window.TimestampedValue((key, value), ts)
        else:
            yield beam.window.TimestampedValue((user, (key, value)), ts)


@beam.typehints.with_output_types(Tuple[Any, Any])
class BoundContributions(beam.DoFn):
    """Keeps at most ``max_contributions`` events per user, over all keys and all time.

    Input ``(user, (key, value))``; output ``(key, value)`` with the event
    time kept. Bounding across keys (not per key) is what lets the per-key
    trees compose in parallel at the user level: a user's capped events split
    over keys, so the per-key costs add up to at most the whole budget.
    Events beyond the cap go to ``invalid`` ("max_contributions exceeded"), so
    input = used + invalid still holds. Which events are kept depends on
    arrival order; any choice of at most the cap keeps the sensitivity.

    With ``max_keys`` (private key selection) a user also keeps only its first
    ``max_keys`` keys (events under others go to ``invalid``), and the first
    event of a user under a key is signalled on the ``units`` output as
    ``(key, event time)``: the selection counts distinct users per key.
    """

    COUNT = ReadModifyWriteStateSpec("contributions", VarIntCoder())
    KEYS = ReadModifyWriteStateSpec("keys", PickleCoder())

    def __init__(self, transform, max_contributions, max_keys=None):
        self._transform = transform
        self._cap = max_contributions
        self._max_keys = max_keys
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")
        self._over_keys = Metrics.counter(NAMESPACE, f"{transform}.over_keys")

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                count=beam.DoFn.StateParam(COUNT), keys=beam.DoFn.StateParam(KEYS)):
        user, (key, value) = element
        used = count.read() or 0
        if used >= self._cap:
            self._over.inc()
            yield pvalue.TaggedOutput(INVALID, InvalidElement(
                self._transform, f"max_contributions ({self._cap}) exceeded for user",
                {"user": user, "key": key, "value": value}))
            return
        if self._max_keys is not None:
            seen = keys.read() or ()
            if key not in seen:
                if len(seen) >= self._max_keys:
                    self._over_keys.inc()
                    yield pvalue.TaggedOutput(INVALID, InvalidElement(
                        self._transform, f"max_keys_per_unit ({self._max_keys}) exceeded for user",
                        {"user": user, "key": key, "value": value}))
                    return
                keys.write(seen + (key,))
                yield pvalue.TaggedOutput("units", (key, timestamp.micros / 1e6))
        count.write(used + 1)
        yield key, value
