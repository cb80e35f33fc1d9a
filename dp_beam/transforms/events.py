"""Per-event stages shared by the continual transforms: validate and clamp.

These run in parallel on every event (``docs/design.md`` D2). Per-user
contribution bounding, the one per-event stage with keyed state, is in
:mod:`dp_beam.transforms.contributions`.

Nothing an element holds crashes the job or disappears (``docs/design.md``
D6): unusable elements go to ``invalid`` with the reason, keys and users
are normalised before any grouping (:mod:`dp_beam.transforms.stream_keys`),
and numbers are parsed without raising (:func:`as_real`).

Errors raised by user functions (``key_fn``, ``user_fn``, ``value_fn``,
``timestamp_fn``, ``features_fn``, ``label_fn``, ``id_fn``) are of two kinds:

* **data errors**, the default for every exception: the element cannot be
  used (a missing field, a wrong type, a value that does not parse). A retry
  would fail the same way, so the element goes to ``invalid`` with the
  exception as the reason, and the job goes on.
* **transient errors**, the exception types in ``transient_errors``
  (default :data:`TRANSIENT_ERRORS`: ``OSError``, which covers
  ``ConnectionError``, ``TimeoutError`` and DNS or socket failures, and
  ``MemoryError``): the element is fine but the environment failed (a
  lookup service was down). They are re-raised, so the runner fails the
  bundle and retries it (Dataflow retries batch bundles four times and
  streaming bundles until they succeed); nothing is recorded for the
  failed attempt, and the retried bundle validates the element afresh.

A data error re-raised would make a streaming job retry the same element
forever; a transient error treated as data would drop a good element for
good. Pass ``transient_errors=()`` to treat every exception as data, or add
the exceptions your functions raise on outages (``grpc.RpcError``,
``google.api_core.exceptions.ServiceUnavailable``). ``OSError`` includes
``FileNotFoundError`` and ``PermissionError``: a function that opens a path
taken from the element should catch those itself, or narrow
``transient_errors`` to ``(ConnectionError, TimeoutError)``.
"""

import datetime
import math
import numbers
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Sequence, Tuple, Type

import apache_beam as beam
import numpy as np
from apache_beam import pvalue
from apache_beam.metrics import Metrics
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp

from dp_beam.records import InvalidElement
from dp_beam.transforms.stream_keys import KV, normalize_key

if TYPE_CHECKING:
    from dp_beam.transforms.schedule import Schedule

__all__ = ["as_real", "CAPPED", "check_callable", "check_transient_errors", "event_seconds",
           "INVALID", "NAMESPACE", "PLAUSIBLE_MAX_SECONDS", "PrepareEvents", "TRANSIENT_ERRORS",
           "UNBOUNDED_LATENESS", "ValidatingDoFn"]

INVALID = "invalid"
#: Tag of the per-user stages' events beyond a cap, aggregated by :class:`CountCapped`.
CAPPED = "capped"
NAMESPACE = "dp_beam"

#: Exceptions of user functions re-raised by default (the runner retries the bundle).
TRANSIENT_ERRORS = (OSError, MemoryError)

#: Allowed lateness of the transforms' internal event-time windows: unbounded, so
#: that no runner drops a late element before the release stage sees it (Beam drops
#: elements of expired windows without a record; the release's ``late`` policy and
#: ``allowed_lateness`` decide instead). Beam's end of time, in seconds, which the
#: Java runners' millisecond arithmetic still holds.
UNBOUNDED_LATENESS = Duration(seconds=MAX_TIMESTAMP.seconds())

# Event times are kept strictly inside Beam's representable range; the ends
# are sentinels (an element created without a timestamp sits at MIN_TIMESTAMP).
_MIN_SECONDS = MIN_TIMESTAMP.micros / 1e6
_MAX_SECONDS = MAX_TIMESTAMP.micros / 1e6

#: Event times from here on (year 5138) are what epoch milliseconds (or finer
#: units) of any date after 1973 look like as seconds. Without a declared
#: ``end``, events at or after it are rejected unless ``start`` is itself that late.
PLAUSIBLE_MAX_SECONDS = 1e11

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def as_real(value: Any) -> Tuple[Optional[float], Optional[str]]:
    """``(float, None)``: the value as a finite float; or ``(None, reason)``. Never raises.

    Accepts real numbers (``bool`` excluded: a flag is not a measurement),
    NumPy scalars and ``decimal.Decimal``. Numbers beyond the float range
    (giant ints, huge ``Fraction``/``Decimal`` values) are rejected with the
    reason instead of raising ``OverflowError``.

    >>> as_real(3), as_real(10 ** 400)[1], as_real(float("nan"))[1]
    ((3.0, None), 'value too large for a float: int', 'value is NaN')
    """
    if type(value) is float:
        if value != value:
            return None, "value is NaN"
        if value in (math.inf, -math.inf):
            return None, "value is infinite"
        return value, None
    # A float subclass (NumPy's float64) is real and no flag: the ABC test (≈ 0.2 µs) is skipped.
    if not isinstance(value, float) and (
            isinstance(value, bool) or isinstance(value, np.bool_)
            or not (isinstance(value, numbers.Real) or _is_decimal(value))):
        return None, f"not a real number: {type(value).__name__}"
    try:
        v = float(value)
    except OverflowError:
        return None, f"value too large for a float: {type(value).__name__}"
    except (ValueError, TypeError, ArithmeticError) as e:  # Decimal("sNaN"), odd Real types
        return None, f"not a real number: {type(value).__name__} ({type(e).__name__})"
    if math.isnan(v):
        return None, "value is NaN"
    if math.isinf(v):
        if _is_decimal(value) and not value.is_infinite():
            return None, f"value too large for a float: {type(value).__name__}"
        return None, "value is infinite"
    return v, None


def _is_decimal(value):
    return type(value).__name__ == "Decimal" and type(value).__module__ in ("decimal", "_decimal")


def event_seconds(value: Any) -> Tuple[Optional[float], Optional[str]]:
    """``(seconds, None)``: an event time as epoch seconds; or ``(None, reason)``. Never raises.

    Accepts epoch seconds (any real number :func:`as_real` accepts), a
    timezone-aware ``datetime`` (pandas ``Timestamp`` included), a NumPy
    ``datetime64`` (defined relative to the Unix epoch, so UTC) and a Beam
    ``Timestamp``. A naive ``datetime`` is rejected: its time zone is
    unknown, and reading it as UTC would shift a local-time feed by hours
    without a trace (``start``/``end``, given once in the code, do take
    naive times as UTC).

    >>> utc = datetime.timezone.utc
    >>> event_seconds(datetime.datetime(2013, 1, 1, tzinfo=utc)), event_seconds(7)
    ((1356998400.0, None), (7.0, None))
    >>> event_seconds(datetime.datetime(2013, 1, 1))[1][:40]
    'event time is a naive datetime (no time '
    """
    if type(value) is float:
        # Plain epoch seconds, the usual case: none of the types below is a float.
        return _real_seconds(value)
    if isinstance(value, datetime.datetime):
        if value != value:  # pandas.NaT
            return None, "event time is missing (NaT)"
        if value.tzinfo is None or value.utcoffset() is None:
            return None, ("event time is a naive datetime (no time zone): return an aware "
                          "datetime (e.g. with tzinfo=datetime.timezone.utc) or epoch seconds")
        try:
            return float(value.timestamp()), None
        except (OverflowError, ValueError, OSError) as e:
            return None, f"event time out of range ({type(e).__name__})"
    if isinstance(value, np.datetime64):
        if np.isnat(value):
            return None, "event time is missing (NaT)"
        unit, _ = np.datetime_data(value.dtype)
        micros = value.astype("datetime64[us]")
        if unit not in ("ns", "ps", "fs", "as") and micros.astype(value.dtype) != value:
            return None, "event time out of range"  # a coarse unit beyond the µs range
        return int(micros.astype(np.int64)) / 1e6, None
    if isinstance(value, Timestamp):
        return value.micros / 1e6, None
    if isinstance(value, datetime.date):
        return None, ("event time is a date, not a point in time: return an aware datetime or "
                      "epoch seconds")
    return _real_seconds(value)


def _real_seconds(value):
    """:func:`event_seconds` of a number: ``as_real``'s float, or its reason."""
    ts, err = as_real(value)
    if err:
        return None, f"event time {err}"
    return ts, None


def _first_time_of(schedule, step):
    """The least float time (seconds) that ``schedule.step_of`` puts at ``step`` or after.

    ``step_of`` rounds to whole microseconds, so the step starts half a
    microsecond before its first second; the search steps float by float from
    there (a few floats at most; after 64 it returns where it is, which the
    caller's check of the bounds then rejects or accepts).
    """
    t = (step * schedule.step_micros - 0.5) / 1e6
    for _ in range(64):
        if schedule.step_of(t) < step:
            t = math.nextafter(t, math.inf)
        elif schedule.step_of(math.nextafter(t, -math.inf)) >= step:
            t = math.nextafter(t, -math.inf)
        else:
            break
    return t


def check_callable(name: str, fn: Optional[Callable[..., Any]],
                   required: bool = False) -> Optional[Callable[..., Any]]:
    """``fn`` if callable (or ``None`` when optional); else ``ValueError`` naming ``name``."""
    if fn is None and not required:
        return None
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {fn!r}")
    return fn


def check_transient_errors(value: Any) -> Tuple[Type[BaseException], ...]:
    """``transient_errors`` validated: a tuple of exception classes (``ValueError`` naming it)."""
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in value):
        raise ValueError("transient_errors must be a tuple of exception classes (re-raised so that "
                         f"the runner retries the bundle), got {value!r}")
    return tuple(value)


class ValidatingDoFn(beam.DoFn):
    """Shared input validation of the transforms' first stage.

    Subclasses call :meth:`_time_and_key` (and :meth:`_user` where there is a
    privacy unit) and send failures to ``invalid`` with :meth:`_reject`; user
    functions run through :meth:`_call`, so a data error in one of them
    rejects the element instead of failing the job, while a transient error
    (``transient_errors``, see the module docstring) is re-raised for the
    runner to retry the bundle. Keys and users are normalised
    (:func:`~dp_beam.transforms.stream_keys.normalize_key`) before they leave.
    Counts rejections in the ``<transform>.invalid`` metric.

    The helpers take the element's Beam timestamp as an int of microseconds: a
    subclass's ``process`` reads it as ``timestamp_micros`` of a
    ``DoFn.WindowedValueParam``, because a ``DoFn.TimestampParam`` makes Beam build a
    ``Timestamp`` object per event (``benchmarks/dofn_params.py``).
    """

    def __init__(self, transform: str, key_fn: Optional[Callable[[Any], Any]] = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 schedule: Optional["Schedule"] = None, keys: Optional[Iterable[Any]] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS) -> None:
        self._transform = transform
        self._key_fn = key_fn
        self._timestamp_fn = timestamp_fn
        self._schedule = schedule
        self._transient = tuple(transient_errors)
        # A frozenset of declared keys, normalised at construction (or None:
        # undeclared, or read from the ``declared`` side input). A normalised
        # event key is looked up in it, so an equal key of another type
        # (numpy.str_ for str, 1.0 for 1) joins its stream.
        self._keys = None if keys is None else {k: k for k in keys}
        self._side_source = None
        self._side_keys = None
        self._invalid = Metrics.counter(NAMESPACE, f"{transform}.invalid")
        self._transient_count = Metrics.counter(NAMESPACE, f"{transform}.transient_errors")
        self._time_lo, self._time_hi = self._accepted_times()

    def _reject(self, element, reason, micros=None):
        """The dead letter of ``element`` (``micros``: its Beam timestamp in microseconds, part
        of its id)."""
        self._invalid.inc()
        ts = None if micros is None else micros / 1e6
        return pvalue.TaggedOutput(INVALID, InvalidElement.of(self._transform, reason, element, ts))

    def _call(self, name, fn, element):
        """``(fn(element), None)``, or ``(None, reason)`` for a data error; re-raises transient ones."""
        try:
            return fn(element), None
        except BaseException as e:
            return None, self._data_error(name, e)

    def _data_error(self, name, error):
        """The reason of ``error``, raised by user function ``name``, when it is a data error.

        A transient error (counted) and anything that is no ``Exception``
        (``KeyboardInterrupt``) are re-raised instead, by a bare ``raise``: call
        it from the ``except`` clause that caught ``error``. The one rule of
        :meth:`_call` and of the per-event stages that call a user function inline.
        """
        if isinstance(error, self._transient):
            self._transient_count.inc()
            raise
        if not isinstance(error, Exception):
            raise
        # A data error in a user function must not kill the job.
        return f"{name} raised {type(error).__name__}: {error}"

    def _features(self, fn, dim, element):
        """``(list of dim floats, None)`` from ``fn(element)``, or ``(None, reason)``.

        A result that is not a sequence of ``dim`` real numbers is a data
        error; a transient error of ``fn``, or of iterating its result, is
        re-raised (as :meth:`_call`)."""
        raw, err = self._call("features_fn", fn, element)
        if err:
            return None, err
        try:
            # A 1-D NumPy array of reals gives its values as Python numbers in one C call,
            # the floats as_real would make of its scalars (d = 100: ≈ 8 µs instead of
            # ≈ 95 µs through a NumPy scalar each; longdouble values stay scalars and take
            # the check per value). Other kinds keep their scalars' names in the reasons.
            if type(raw) is np.ndarray and raw.ndim == 1 and raw.dtype.kind in "fiu":
                values = raw.tolist()
            else:
                values = list(raw)
        except self._transient:
            raise
        except Exception:  # not iterable, or its iteration fails: bad data
            return None, f"features_fn returned {type(raw).__name__}, not a sequence"
        if len(values) != dim:
            return None, f"features_fn returned {len(values)} values, expected {dim}"
        # Plain finite floats are what as_real would return as they are: checked in two
        # passes instead of a call per value (≈ 0.7 µs each, most of a wide point's
        # validation). 0·Σ is 0 exactly when every value and the sum are finite; a sum
        # that overflows takes the checks per value, which accept it. The types are
        # counted in C (d = 100: 2.4 µs, against 3.9 µs to collect them in a set and
        # 5.5 µs for a generator's test per value).
        if operator.countOf(map(type, values), float) == dim and 0.0 * sum(values) == 0.0:
            return values, None
        features = []
        for v in values:
            x, err = as_real(v)
            if err:
                return None, f"feature {err}"
            features.append(x)
        return features, None

    def _event_time(self, element, micros):
        """``(seconds, None)``, or ``(None, reason)`` when the event time is unusable (not yet
        checked against Beam's range and the schedule: :meth:`_time_error`)."""
        if self._timestamp_fn is None:
            return micros / 1e6, None
        raw, err = self._call("timestamp_fn", self._timestamp_fn, element)
        if err:
            return None, err
        return event_seconds(raw)

    def _time_error(self, ts):
        """The reason an event time of ``ts`` seconds is rejected (out of Beam's range, or of a
        released step of the schedule), or ``None``."""
        if not _MIN_SECONDS < ts < _MAX_SECONDS:
            return self._unit_hint(ts, "event time missing or out of range "
                                       "(give elements timestamps or pass timestamp_fn)")
        return None if self._schedule is None else self._schedule_error(ts)

    def _accepted_times(self):
        """``(lo, hi)``: every time ``lo <= ts < hi`` (seconds) passes :meth:`_time_error`.

        Its checks accept an interval of times (``Schedule.step_of`` is monotone
        in the time): from the first second of the start step to the first of
        the end step (or the plausibility bound), within Beam's range. The
        per-event stages accept a time in it with two comparisons and ask
        :meth:`_time_error` only outside, for the reason. Both ends are
        confirmed by :meth:`_time_error` itself; ``(inf, -inf)`` (no time
        accepted without it) if they are not.
        """
        lo, hi = math.nextafter(_MIN_SECONDS, math.inf), _MAX_SECONDS
        schedule = self._schedule
        if schedule is not None:
            lo = max(lo, _first_time_of(schedule, schedule.start_step))
            if schedule.end_step is not None:
                hi = min(hi, _first_time_of(schedule, schedule.end_step))
            elif PLAUSIBLE_MAX_SECONDS > schedule.start_step * schedule.step_seconds:
                hi = min(hi, PLAUSIBLE_MAX_SECONDS)
        last = math.nextafter(hi, -math.inf)
        if not lo <= last or self._time_error(lo) is not None or (
                self._time_error(last) is not None):
            return math.inf, -math.inf
        return lo, hi

    def _declared(self, side):
        if side is None:
            return self._keys
        if side is not self._side_source:
            # The side input is the same list object for a whole bundle. Its
            # keys are normalised like event keys; one that cannot be a key
            # (NaN, unhashable) matches no event and opens no stream.
            self._side_source = side
            self._side_keys = {}
            for k in side:
                k, err = normalize_key(k)
                if err is None and k is not None:
                    self._side_keys[k] = k
        return self._side_keys

    def _key(self, element, side=None):
        """``(key, None)`` (``None`` without ``key_fn``), or ``(None, reason)``.

        The key is normalised; with declared keys it is returned as the
        declared instance, and a key outside the declared set is rejected (a
        public rule: free).
        """
        key_fn = self._key_fn
        if key_fn is None:
            return None, None
        try:
            raw = key_fn(element)
        except BaseException as e:
            return None, self._data_error("key_fn", e)
        declared = self._keys if side is None else self._declared(side)
        # A str or int is its own normalised key (normalize_key): a declared one is found
        # directly; any other key, and an undeclared one, goes through _key_of for the reason.
        if declared is not None and (type(raw) is str or type(raw) is int):
            found = declared.get(raw)
            if found is not None:
                return found, None
        return self._key_of(raw, declared)

    def _key_of(self, raw, declared):
        """``(key, None)``: ``raw``, a ``key_fn`` result, normalised (and as its instance in
        ``declared``, the declared keys or ``None``); or ``(None, reason)``."""
        if raw is None:
            return None, "key_fn returned None"
        key, err = normalize_key(raw)
        if err:
            return None, f"key_fn returned {err}"
        if declared is None:
            return key, None
        found = declared.get(key)
        if found is None:
            return None, f"undeclared key {key!r} (not in keys)"
        return found, None

    def _schedule_error(self, ts):
        """The reason an event time outside the public schedule is rejected, or ``None``.

        A time from the year 5138 on (:data:`PLAUSIBLE_MAX_SECONDS`) is most
        likely in the wrong unit: the reason then says so when the time
        divided by 10^3, 10^6 or 10^9 falls in the schedule.
        """
        schedule = self._schedule
        err = schedule.check(schedule.step_of(ts))
        if err is None and schedule.end_step is None and ts >= PLAUSIBLE_MAX_SECONDS > (
                schedule.start_step * schedule.step_seconds):
            err = (f"event time {ts:g} s is after the year 5000 (no end is declared, and "
                   f"times from {PLAUSIBLE_MAX_SECONDS:g} s on are not plausible epoch seconds)")
        return None if err is None else self._unit_hint(ts, err)

    def _unit_hint(self, ts, err):
        """``err``, completed by the unit ``ts`` looks like when it is no plausible epoch second
        and falls in the schedule divided by 10^3, 10^6 or 10^9."""
        schedule = self._schedule
        if schedule is None or abs(ts) < PLAUSIBLE_MAX_SECONDS or abs(ts) >= _MAX_SECONDS * 1e9:
            return err
        for factor, unit in ((1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds")):
            if schedule.check(schedule.step_of(ts / factor)) is None:
                return (f"{err}; the time looks like epoch {unit} (it falls in the schedule "
                        f"divided by {factor:g}): timestamp_fn must return seconds")
        return err

    def _time_and_key(self, element, micros, side=None):
        """``(seconds, key, None)``, or ``(None, None, reason)``: every transform's first checks.

        The event time must fall in a released step of the public schedule.
        """
        ts, err = self._event_time(element, micros)
        if err is None and not self._time_lo <= ts < self._time_hi:
            # The common case in two comparisons (_accepted_times); outside, the reason.
            err = self._time_error(ts)
        if err:
            return None, None, err
        key, err = self._key(element, side)
        if err:
            return None, None, err
        return ts, key, None

    def _user(self, element, user_fn):
        """``(user, None)``: the normalised user; or ``(None, reason)`` when ``user_fn`` raises or
        returns ``None``, NaN or an id that cannot be grouped (unhashable, no exact encoding)."""
        raw, err = self._call("user_fn", user_fn, element)
        if err:
            return None, err
        if raw is None:
            return None, "user_fn returned None"
        user, err = normalize_key(raw)
        if err:
            return None, f"user_fn returned {err}"
        return user, None


@beam.typehints.with_output_types(KV)
class PrepareEvents(ValidatingDoFn):
    """Extracts (key, user, value) and the event time; routes bad elements to ``invalid``.

    Outputs ``(key, value)``, or ``(user, (key, value))`` when ``user_fn`` is
    given, at the event time, keys and users normalised. ``value`` is
    clamped to ``[lower, upper]`` (contribution bounding; counted in the
    ``clamped`` metric). User functions that raise a data error, return
    ``None``, NaN or ungroupable keys or users, non-real, non-finite or
    out-of-float-range values, or event times outside the schedule send the
    element to ``invalid`` with the reason; nothing raises but the
    ``transient_errors`` of user functions.
    """

    def __init__(self, transform: str, value_fn: Optional[Callable[[Any], Any]] = None,
                 lower: Optional[float] = None, upper: Optional[float] = None,
                 key_fn: Optional[Callable[[Any], Any]] = None,
                 user_fn: Optional[Callable[[Any], Any]] = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None,
                 schedule: Optional["Schedule"] = None, keys: Optional[Iterable[Any]] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS) -> None:
        super().__init__(transform, key_fn, timestamp_fn, schedule, keys, transient_errors)
        self._value_fn = value_fn
        self._lower = lower
        self._upper = upper
        self._user_fn = user_fn
        self._clamped = Metrics.counter(NAMESPACE, f"{transform}.clamped")
        # The values _prepare takes without as_real: [lower, upper] when both bounds are
        # finite ints or floats, else none (inf, -inf), so that as_real and the clamping
        # decide. (Compared with inf, not math.isfinite: that raises for giant ints.)
        finite = all(type(b) in (int, float) and -math.inf < b < math.inf for b in (lower, upper))
        self._fast_lower, self._fast_upper = (lower, upper) if finite else (math.inf, -math.inf)

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        ts, key, user, value, err = self._prepare(element, micros, declared)
        if err:
            yield self._reject(element, err, micros)
        elif self._user_fn is None:
            yield beam.window.TimestampedValue((key, value), ts)
        else:
            yield beam.window.TimestampedValue((user, (key, value)), ts)

    def _prepare(self, element, micros, declared):
        """``(seconds, key, user, value, None)`` of a valid element (``user`` None without
        ``user_fn``), or ``(None, None, None, None, reason)``."""
        ts, key, err = self._time_and_key(element, micros, declared)
        if err:
            return None, None, None, None, err
        user = None
        if self._user_fn is not None:
            user, err = self._user(element, self._user_fn)
            if err:
                return None, None, None, None, err
        if self._value_fn is None:
            return ts, key, user, 1.0, None
        try:
            raw = self._value_fn(element)
        except BaseException as e:
            return None, None, None, None, self._data_error("value_fn", e)
        # A float within finite bounds is finite and needs no clamping: as_real would return
        # it as it is. NaN fails the comparison; other values take as_real for the reason.
        if type(raw) is float and self._fast_lower <= raw <= self._fast_upper:
            return ts, key, user, raw, None
        value, err = as_real(raw)
        if err:
            return None, None, None, None, err
        if value < self._lower or value > self._upper:
            self._clamped.inc()
            value = min(max(value, self._lower), self._upper)
        return ts, key, user, value, None
