"""``ContinualCount`` and ``ContinualSum``: running totals released every step.

Shape (``docs/design.md`` D1.2, D2): validate and clamp every event in parallel →
(user level) cap each user's contributions in keyed state → per-step
``CombinePerKey`` in event-time fixed windows → one ordered release DoFn per
stream feeding the tree mechanism (``docs/privacy/counting.md`` C-3 to
C-7) one aggregate per step, empty steps included.

Privacy cost, stated at construction (``.plan``) and on ``.accounting``:
each stream's tree is ε-DP (or (ε, δ) / ρ-zCDP with Gaussian noise) for its
privacy unit, with per-step sensitivity = per-event bound × contributions per
unit; streams of different keys compose in parallel.
"""

import datetime
import math
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

import apache_beam as beam

from dp_beam.mechanisms import CounterConfig, NoiseSource, ZeroNoise
from dp_beam.mechanisms.counting.lockstep import lockstep_of
from dp_beam.mechanisms.counting.postprocess import MonotoneRelease
from dp_beam.mechanisms.counting.registry import default_mechanism, get_mechanism
from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import LedgerEntry, Release
from dp_beam.transforms.contributions import (BoundContributions, BoundContributionsBatch,
                                              CountCapped, PrepareUserEventsBatch)
from dp_beam.transforms.events import (CAPPED, INVALID, TRANSIENT_ERRORS, PrepareEvents,
                                       check_callable, check_transient_errors)
from dp_beam.transforms.keys import UNITS, EventUnits
from dp_beam.transforms.release_spec import ReleaseSpec
from dp_beam.transforms.steps import (EventStepTotals, PrepareStepTotals, in_global_window,
                                     per_step)
from dp_beam.transforms.streams import (private_keys, raw_steps, release_shards, release_streams,
                                        set_release_options, validation)

__all__ = ["ContinualCount", "ContinualSum", "CounterReleaseSpec", "MAX_STEP_TOTAL", "round_total",
           "TOTAL_GRID_BITS", "total_grid_exponent"]


def _real(name, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _forwarded(arguments, *positional):
    """A public transform's keyword arguments, forwarded to the common constructor.

    The public classes spell out their signatures (so that a misspelled
    keyword is reported against them, and ``help()`` shows every option)."""
    skip = {"self", "__class__", "epsilon", "step", "kwargs", *positional}
    return {k: v for k, v in arguments.items() if k not in skip}


# Float addition is not associative, so a float running sum depends on the
# order the runner delivers a step's values and merges its partial sums, and
# a retried bundle could release a different total with the same noise. The
# values are summed exactly instead: every finite float is n·2^e for integers
# n and e (e >= -1074), so a sum is held as (n, e), aligned to the smaller
# exponent at each addition: the represented number is the exact sum in any
# order, and its correctly rounded float is the same bits. The integers stay
# as small as the values' own binary digits need (a fixed unit of 2^-1074
# would make every accumulator a 1,100-bit integer to add, encode and group).


def _dyadic(value: float) -> Tuple[int, int]:
    """``(n, e)`` with ``value == n·2^e`` exactly (``e <= 0``)."""
    numerator, denominator = float(value).as_integer_ratio()
    return numerator, 1 - denominator.bit_length()


def _add_dyadic(n1: int, e1: int, n2: int, e2: int) -> Tuple[int, int]:
    """``n1·2^e1 + n2·2^e2`` exactly, as ``(n, min(e1, e2))``."""
    if e1 <= e2:
        return n1 + (n2 << (e2 - e1)), e1
    return (n1 << (e1 - e2)) + n2, e2


def _dyadic_float(n: int, e: int) -> float:
    """The float nearest to ``n·2^e`` (int division rounds correctly); ±inf beyond range."""
    try:
        return n / (1 << -e)
    except OverflowError:
        return math.inf if n > 0 else -math.inf


class _SumCount(beam.CombineFn):
    """(sum of values, number of events) of one step; the sum is exact, so it does not
    depend on the order of the values or of the merges (the accumulator is ``(n, e,
    count)`` for the sum n·2^e, the output the correctly rounded float)."""

    def create_accumulator(self):
        return (0, 0, 0)

    def add_input(self, acc, value):
        n, e = _add_dyadic(acc[0], acc[1], *_dyadic(value))
        return (n, e, acc[2] + 1)

    def add_inputs(self, acc, values):
        n, e, count = acc
        for value in values:
            n, e = _add_dyadic(n, e, *_dyadic(value))
            count += 1
        return (n, e, count)

    def merge_accumulators(self, accs):
        n, e, count = 0, 0, 0
        for an, ae, c in accs:
            n, e = _add_dyadic(n, e, an, ae)
            count += c
        return (n, e, count)

    def extract_output(self, acc):
        return (_dyadic_float(acc[0], acc[1]), acc[2])


class _CountSteps(beam.CombineFn):
    """(number of events as a float, number of events) of one count step: every value of a
    count is 1, so the total is the number of events, exact in any order."""

    def create_accumulator(self):
        return 0

    def add_input(self, acc, value):
        return acc + 1

    def add_inputs(self, acc, values):
        for _ in values:
            acc += 1
        return acc

    def merge_accumulators(self, accs):
        return sum(accs)

    def extract_output(self, acc):
        return (float(acc), acc)


#: A sum's step totals are rounded to multiples of 2^e, e = ⌊log2(per-event bound)⌋ − this.
#: With the production noise (multiples of a power of two, ``dp_beam.mechanisms.noise_key``),
#: every node of the tree and smooth binary mechanisms, and hence every release, is then an
#: exact float sum: its low-order bits carry nothing of the data finer than the grid
#: (Mironov 2012). Counts are integers and need no rounding. Exact while the running total
#: stays below 2^(53 + e) in magnitude (about 2^33 per-event bounds) and the noise grid
#: is not finer than that.
TOTAL_GRID_BITS = 20


def total_grid_exponent(per_event: float) -> Optional[int]:
    """e of the grid a sum's step totals are rounded to (``None`` for a zero bound)."""
    if per_event <= 0:
        return None
    return math.frexp(per_event)[1] - 1 - TOTAL_GRID_BITS


def round_total(total: float, exponent: int) -> float:
    """``total`` rounded to the nearest multiple of 2^exponent (ties to even), exactly.

    >>> round_total(0.1, -4), round_total(1e-9, -4), round_total(3.0, -4)
    (0.125, 0.0, 3.0)
    """
    return math.ldexp(float(round(math.ldexp(total, -exponent))), exponent)


#: Step totals are clamped to ±this before they enter a mechanism.
MAX_STEP_TOTAL = 1e308


def _finite_total(total: float) -> float:
    """A step total the mechanism can take: huge bounds can overflow a float sum to ±inf
    (or inf − inf to NaN), which would crash the release. Clamping is 1-Lipschitz, so it
    keeps the sensitivity; NaN, only reachable through such an overflow, counts as 0."""
    if total != total:
        return 0.0
    return min(max(total, -MAX_STEP_TOTAL), MAX_STEP_TOTAL)


class CounterReleaseSpec(ReleaseSpec):
    """Feeds step totals to one continual-counting mechanism per stream."""

    def __init__(self, transform: str, step_seconds: float, mechanism: str,
                 config: CounterConfig, ledger_template: LedgerEntry,
                 monotone: bool = False, grid_exponent: Optional[int] = None) -> None:
        self.transform = transform
        self.step_seconds = step_seconds
        self.horizon = config.horizon
        self._mechanism = mechanism
        self._config = config
        self._ledger = ledger_template
        self._monotone = monotone
        self._grid_exponent = grid_exponent
        # t -> (noise_std, ci95, mechanism name): public functions of t and of the
        # parameters, equal for every stream of the spec, so each t is computed once
        # per DoFn instead of once per stream and step.
        self._public = {}

    def __getstate__(self):
        # The cache is rebuilt where the spec runs; it need not travel with the pipeline.
        return {**self.__dict__, "_public": {}}

    def new_mechanism(self, rng: Any, first: Optional[int] = None) -> Any:
        mechanism = get_mechanism(self._mechanism).from_config(self._config, rng=rng)
        return MonotoneRelease(mechanism) if self._monotone else mechanism

    def restore(self, state: Dict[str, Any], rng: Any) -> Any:
        if self._monotone:
            inner = get_mechanism(state["inner"]["mechanism"])
            return MonotoneRelease.from_state(state, inner, rng=rng)
        return get_mechanism(state["mechanism"]).from_state(state, rng=rng)

    def reseed(self, mechanism: Any, rng: Any) -> Any:
        if self._monotone or not hasattr(mechanism, "set_noise_source"):
            return super().reseed(mechanism, rng)
        mechanism.set_noise_source(rng)
        return mechanism

    def _total(self, aggregate):
        """A step's total as the mechanism takes it."""
        total = _finite_total(aggregate[0])
        if self._grid_exponent is not None:
            total = round_total(total, self._grid_exponent)
        return total

    def _public_of(self, mechanism, t):
        public = self._public.get(t)
        if public is None:
            public = self._public[t] = (float(mechanism.noise_std(t)),
                                        float(mechanism.ci_halfwidth(t)), mechanism.name)
        return public

    def release(self, mechanism: Any, key: Any, step: int, aggregate: Any) -> Tuple[Release]:
        value = mechanism.step(self._total(aggregate))
        t = mechanism.t
        public = self._public_of(mechanism, t)
        # One record: a tuple, not a generator (this runs once per stream and step).
        return (Release(key, step, step * self.step_seconds, (step + 1) * self.step_seconds,
                        float(value), public[0], public[1], public[2], self.transform, t),)

    def lockstep(self, mechanisms: List[Any]) -> Optional[Any]:
        # Tree streams (the count's and the sum's default) step as one array, BLT streams
        # with their float part as one array, other scalar counters each by its own
        # mechanism; a monotone release wraps its mechanism and steps on its own.
        return None if self._monotone else lockstep_of(mechanisms)

    def release_lockstep(self, streams: Any, keys: List[Any], step: int,
                         aggregates: List[Any], sources: List[Any]) -> List[Release]:
        values = streams.step([self._total(a) for a in aggregates], sources)
        t = streams.t
        noise_std, ci, name = self._public_of(streams.template, t)
        start, end = step * self.step_seconds, (step + 1) * self.step_seconds
        transform = self.transform
        return [Release(key, step, start, end, value, noise_std, ci, name, transform, t)
                for key, value in zip(keys, values)]

    @property
    def ledger_template(self) -> LedgerEntry:
        """The ledger entry every stream charges (``key`` set per stream by :meth:`ledger`)."""
        return self._ledger

    def ledger(self, key: Any) -> List[LedgerEntry]:
        return [self._ledger._replace(key=key)]


class _ContinualTotal(beam.PTransform):
    """Common construction of ContinualCount and ContinualSum."""

    def __init__(self, epsilon, step, value_fn=None, lower=None, upper=None, *, start=None,
                 end=None, key_fn=None, keys=None,
                 timestamp_fn=None, privacy_unit="event", user_fn=None, max_contributions=None,
                 mechanism=None, noise="laplace", delta=None, calibration="zcdp",
                 horizon=None, allowed_lateness=datetime.timedelta(days=1), late="defer",
                 hot_key_fanout=None, monotone=False, rng=None, noise_key=None,
                 transient_errors=TRANSIENT_ERRORS, shards=None, label=None):
        super().__init__(label)
        set_release_options(self, step, allowed_lateness, late, rng, start=start, end=end,
                            horizon=horizon, key_fn=key_fn, keys=keys,
                            noise_key=noise_key, shards=shards)
        self._transient = check_transient_errors(transient_errors)
        self._value_fn = check_callable("value_fn", value_fn)
        self._lower, self._upper = lower, upper
        self._key_fn = key_fn
        self._timestamp_fn = check_callable("timestamp_fn", timestamp_fn)
        self._set_unit(privacy_unit, user_fn, max_contributions)
        if mechanism is None:
            mechanism = default_mechanism(noise, horizon)
        mechanism_cls = get_mechanism(mechanism)  # raises ValueError naming `mechanism`
        self._mechanism = mechanism
        self._set_fanout_and_monotone(hot_key_fanout, monotone, lower)
        self._plan_mechanism(mechanism_cls, epsilon, horizon, noise, delta, calibration)

    def _set_unit(self, privacy_unit, user_fn, max_contributions):
        """Checks the privacy unit and, for ``"user"``, its ``user_fn`` and ``max_contributions``."""
        if privacy_unit not in ("event", "user"):
            raise ValueError(f"privacy_unit must be 'event' or 'user', got {privacy_unit!r}")
        self._unit = privacy_unit
        if privacy_unit == "user":
            self._user_fn = check_callable("user_fn", user_fn, required=True)
            if (isinstance(max_contributions, bool) or not isinstance(max_contributions, int)
                    or max_contributions < 1):
                raise ValueError("max_contributions must be an integer >= 1 with "
                                 f"privacy_unit='user', got {max_contributions!r}")
        else:
            if user_fn is not None or max_contributions is not None:
                raise ValueError("user_fn and max_contributions apply only with "
                                 "privacy_unit='user'")
            self._user_fn = None
        self._max_contributions = max_contributions

    def _set_fanout_and_monotone(self, hot_key_fanout, monotone, lower):
        """Checks ``hot_key_fanout`` and ``monotone`` (which needs ``lower >= 0``)."""
        if hot_key_fanout is not None and (
                isinstance(hot_key_fanout, bool) or not isinstance(hot_key_fanout, int)
                or hot_key_fanout < 1):
            raise ValueError(f"hot_key_fanout must be an integer >= 1, got {hot_key_fanout!r}")
        self._fanout = hot_key_fanout
        if not isinstance(monotone, bool):
            raise ValueError(f"monotone must be True or False, got {monotone!r}")
        if monotone and lower is not None and lower < 0:
            raise ValueError("monotone=True needs a non-decreasing running total: "
                             f"lower must be >= 0, got lower={lower!r}")
        self._monotone = monotone

    def _plan_mechanism(self, mechanism_cls, epsilon, horizon, noise, delta, calibration):
        """The sensitivity per unit, the mechanism's arguments and its privacy cost."""
        per_event = self._per_event_bound()
        contributions = self._max_contributions if self._unit == "user" else 1
        # Sums are rounded to a power-of-two grid per step (see TOTAL_GRID_BITS);
        # each step a unit touches may then move by one more grid step.
        self._grid_exponent = (total_grid_exponent(per_event) if self._value_fn is not None
                               else None)
        if self._grid_exponent is not None:
            per_event += math.ldexp(1.0, self._grid_exponent)
        self._sensitivity = per_event * contributions
        # Validated here, at construction (ValueError naming the parameter); the probe
        # adds the mechanism's own checks (offered noise, longest horizon).
        self._config = CounterConfig(epsilon=epsilon, sensitivity=self._sensitivity,
                                     horizon=horizon, noise=noise, delta=delta,
                                     calibration=calibration)
        self._cost = mechanism_cls.from_config(self._config, rng=ZeroNoise()).privacy_cost()
        self._noise, self._calibration = noise, calibration if noise == "gaussian" else ""

    def _per_event_bound(self) -> float:
        return 1.0

    def _neighbours(self):
        if self._unit == "user":
            return (f"add/remove one user's events (at most {self._max_contributions} "
                    "per user, across all keys)")
        return "add/remove one event"

    def plan_entry(self, label) -> LedgerEntry:
        """The ledger entry every stream of this transform charges."""
        return LedgerEntry(
            transform=label, unit=self._unit, neighbours=self._neighbours(),
            epsilon=float(self._cost["epsilon"]), delta=float(self._cost["delta"] or 0.0),
            rho=float(self._cost["rho"]), mechanism=self._mechanism,
            scope="key" if self._key_fn is not None else "stream", key=None,
            sensitivity=self._sensitivity, noise=self._noise, calibration=self._calibration,
            max_contributions=self._max_contributions if self._unit == "user" else None,
            relation="add/remove")

    def expand(self, events):
        label = self.label
        # The schedule decides the steps, not the input's windows (design D2.1).
        events = in_global_window(events, "EventWindow")
        schedule, declared, side = validation(self)
        step_total = _SumCount() if self._value_fn is not None else _CountSteps()
        selecting = private_keys(self)
        prepare = dict(value_fn=self._value_fn, lower=self._lower, upper=self._upper,
                       key_fn=self._key_fn, user_fn=self._user_fn,
                       timestamp_fn=self._timestamp_fn, schedule=schedule, keys=declared,
                       transient_errors=self._transient)
        # The sharded batch release groups per shard anyway: it merges the bundles'
        # partial totals per (key, step) there, which saves a combine's own grouping.
        lifted = raw_steps(self, events) and self._fanout is None
        shards = release_shards(self, events)
        if lifted and self._unit == "event" and selecting is None:
            prepared = (events
                        | "Validate" >> beam.ParDo(PrepareStepTotals(
                            label, step_total, self._step_micros, shards, **prepare),
                                                 **side)
                        .with_outputs(INVALID, main="valid"))
            return self._release(events, prepared.valid, [prepared[INVALID]], None, step_total)

        if self._unit == "user" and events.is_bounded:
            return self._bounded_per_user(events, label, prepare, side, selecting, step_total,
                                          shards if lifted else None)
        prepared = events | "Validate" >> beam.ParDo(PrepareEvents(label, **prepare),
                                                     **side).with_outputs(INVALID, main="valid")
        invalids = [prepared[INVALID]]
        valid = prepared.valid
        units = None
        if self._unit == "user":
            max_keys = selecting.max_keys_per_unit if selecting is not None else None
            bounded = (valid
                       | "BoundContributions" >> beam.ParDo(BoundContributions(
                           label, self._max_contributions, max_keys, self._step_micros))
                       .with_outputs(CAPPED, UNITS, main="kept"))
            invalids.append(bounded[CAPPED] | "CountCapped" >> CountCapped(label, self._step))
            valid = bounded.kept
            units = bounded[UNITS]
        elif selecting is not None:
            units = valid | "EventUnits" >> beam.ParDo(EventUnits())
        if lifted:
            aggregates = valid | "StepTotals" >> beam.ParDo(EventStepTotals(
                step_total, self._step_micros, shards))
            return self._release(events, aggregates, invalids, units, step_total)
        aggregates = per_step(valid, step_total, self._step, self._step_micros,
                              events.is_bounded, self._fanout)
        return self._release(events, aggregates, invalids, units, None)

    def _bounded_per_user(self, events, label, prepare, side, selecting, step_total, shards):
        """Bounded input, user level: each user's events grouped and capped in event-time order
        (:class:`~dp_beam.transforms.contributions.BoundContributionsBatch`, no state), then
        the release; ``shards`` (the sharded release) gathers the kept events per bundle."""
        prepared = (events
                    | "Validate" >> beam.ParDo(PrepareUserEventsBatch(label, **prepare), **side)
                    .with_outputs(INVALID, main="valid"))
        max_keys = selecting.max_keys_per_unit if selecting is not None else None
        lifted = shards is not None
        bounded = (prepared.valid
                   | "PerUser" >> beam.GroupByKey()
                   | "BoundContributions" >> beam.ParDo(BoundContributionsBatch(
                       label, self._max_contributions, max_keys, self._step_micros,
                       step_total if lifted else None, shards))
                   .with_outputs(INVALID, UNITS, main="kept"))
        invalids = [prepared[INVALID], bounded[INVALID]]
        if lifted:
            return self._release(events, bounded.kept, invalids, bounded[UNITS], step_total)
        aggregates = per_step(bounded.kept, step_total, self._step, self._step_micros, True,
                              self._fanout)
        return self._release(events, aggregates, invalids, bounded[UNITS], None)

    def _release(self, events, aggregates, invalids, units, combine_fn):
        """The ordered release of the per-step ``aggregates`` (partial totals of
        ``combine_fn`` when it is given)."""
        spec = self.release_spec(self.label)
        return release_streams(self, events, aggregates, spec, spec.ledger_template, invalids,
                               units=units, unit=self._unit, combine_fn=combine_fn)

    def release_spec(self, label: str) -> "CounterReleaseSpec":
        """What the ordered release of this transform (named ``label``) feeds each stream's
        mechanism with, and what it releases and charges."""
        return CounterReleaseSpec(label, self._step, self._mechanism, self._config,
                                  self.plan_entry(label), self._monotone, self._grid_exponent)


class ContinualCount(_ContinualTotal):
    """The running count of events, released every step (counting.md C-1, C-3 to C-7; design D2).

    Privacy: ε-DP per privacy unit (``noise="laplace"``), or (ε, δ)-DP and the
    matching ρ-zCDP with ``noise="gaussian"``; per-step sensitivity 1 for
    ``privacy_unit="event"`` and ``max_contributions`` for ``"user"``.

    Example (batch, with a test seed; production leaves ``rng=None``):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> test_seed = 0   # tests only; production leaves rng=None
    >>> count = dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=40,
    ...                            timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create([{"ts": 5.0}, {"ts": 7.0}, {"ts": 25.0}]) | count
    ...     _ = out.releases | beam.Map(
    ...         lambda r: print(r.step, r.t, r.mechanism, round(r.noise_std, 2)))
    0 1 tree 1.41
    1 2 tree 3.16
    2 3 tree 3.16
    3 4 tree 5.29

    One stream per declared key, every step from ``start`` to ``end``, with
    or without events (the key set and the schedule are public):

    >>> count = dpb.ContinualCount(epsilon=1.0, step=10, start=0, end=30,
    ...                            key_fn=lambda e: e["k"], keys=["a", "b"],
    ...                            timestamp_fn=lambda e: e["ts"], rng=test_seed)
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create([{"ts": 5.0, "k": "a"}, {"ts": 7.0, "k": "z"}]) | count
    ...     _ = (out.releases | beam.Map(lambda r: (r.key, r.step)) | beam.combiners.ToList()
    ...          | beam.Map(lambda pairs: print(sorted(pairs))))
    ...     _ = out.invalid | beam.Map(lambda bad: print(bad.reason))
    undeclared key 'z' (not in keys)
    [('a', 0), ('a', 1), ('a', 2), ('b', 0), ('b', 1), ('b', 2)]

    Args:
      epsilon: privacy parameter of every stream (> 0).
      step: step length (seconds or ``timedelta``); step k covers [k·step, (k+1)·step).
      start: required: the first step released (a ``datetime``, an ISO-8601
        string or epoch seconds; aligned down to the step grid; naive times are
        UTC). Every stream releases every step from the step holding ``start``,
        with events or without; events of earlier steps go to ``.invalid``.
      end: the step holding ``end`` is the last released (an aligned ``end``
        releases nothing of the step it begins); same forms. Required for
        bounded input unless ``horizon`` is given (then ``start + horizon``
        steps); streaming without ``end`` releases with the watermark, forever.
        Events of later steps go to ``.invalid``.
      key_fn: optional element → key; one stream per key. Needs ``keys``.
      keys: the public key set: an iterable of keys, or a bounded PCollection
        of them (read as a side input); each has its stream from ``start`` and
        events of other keys go to ``.invalid`` ("undeclared key"). Or
        ``dpb.PrivateKeys(epsilon, delta, ...)``: keys are admitted by a
        private, continual selection (its cost is charged separately;
        admissions are :class:`~dp_beam.records.KeyAdmitted` records on
        ``.releases``).
      timestamp_fn: optional element → event time: epoch seconds, a
        timezone-aware ``datetime`` or pandas ``Timestamp``, or a NumPy
        ``datetime64``; by default the element's Beam timestamp. Naive
        datetimes are rejected (their zone is unknown); a time that looks
        like epoch milliseconds is rejected with a reason that says so.
      privacy_unit: ``"event"`` or ``"user"`` (needs ``user_fn`` and
        ``max_contributions``: each user's first ``max_contributions`` events
        are used, across all keys; the rest go to ``.invalid``).
      mechanism: the continual-counting mechanism (``dp_beam.mechanisms.counting.registry``):
        ``"tree"``, ``"honaker"``, ``"smooth_binary"``, ``"blt"`` or
        ``"sqrt_toeplitz"``; ``None`` picks ``default_mechanism(noise, horizon)``:
        BLT for Gaussian noise, smooth binary for Laplace noise and a known
        horizon, the tree for Laplace noise and no horizon (Honaker is more
        accurate there but its exact intervals cost ~21 ms per release).
      noise: ``"laplace"`` (pure ε) or ``"gaussian"`` (needs ``delta``).
      calibration: Gaussian only: ``"zcdp"`` or ``"analytic"``.
      horizon: number of steps per stream, or ``None`` for unbounded; with no
        ``end``, the streams end after ``horizon`` steps.
      allowed_lateness: how late an event may arrive and still be used
        (seconds or ``timedelta``, default one day), measured as how far the
        stream had released past the end of the event's step when it
        arrived. Nothing is dropped silently: every event is used or goes
        to ``.invalid`` with the reason. (Internally Beam keeps each step's
        window open for late events for the life of the stream, so that no
        runner drops one before this policy sees it.)
      late: an event whose step was already released (*late*) is counted
        into the next unreleased step (``"defer"``, while within
        ``allowed_lateness``; later ones go to ``.invalid``) or sent to
        ``.invalid`` (``"drop"``); metrics count all three.
      hot_key_fanout: optional fan-out for the per-step combine of hot keys.
      monotone: release ``max(previous release, estimate)`` so that the running
        total never decreases (free post-processing; needs ``lower >= 0`` for
        sums). The release's ``noise_std``/``ci95`` describe the unadjusted
        estimate.
      rng: ``None`` (production noise, see ``noise_key``); for tests only, an
        int seed (each key and step derives its own generator) or a
        ``NoiseSource`` such as ``dp_beam.mechanisms.ZeroNoise()`` (no noise:
        not private).
      noise_key: the secret :class:`dp_beam.NoiseKey` every noise draw is
        derived from, with the draw's identity (transform label, key, step):
        a retried or replayed step releases the same value, never a second
        draw. ``None`` (default) draws a fresh key from the OS at
        construction, so each run of a pipeline is a new release. To keep a
        key in a secret store use ``NoiseKey.from_env``/``from_file``. Never
        reuse a key on different data: two releases with the same noise give
        away the exact difference of their statistics. The key travels inside
        the pipeline's serialized graph: treat staging locations as secret,
        or load it with ``from_env`` on the workers.
      shards: how the streams are released. ``None`` (default): one shard per
        64 declared keys; below 64 declared keys (or without ``key_fn``), one
        shard for bounded input and 0 for unbounded input; 0 when the key set
        is not known at construction (a ``PCollection`` of keys, private
        selection). 0: one stateful key (and timer) per
        stream. n > 0: streams go to n shards by a public hash of the key,
        each shard released by one stateful DoFn with one timer per step
        (streaming) or, for bounded input, by one pass over the shard's
        grouped events without state or timers; the records are the same
        (``dp_beam.transforms.shards``).
      transient_errors: exception types of the user functions (``key_fn``,
        ``timestamp_fn``, ``user_fn``, ``value_fn``) that are re-raised so
        that the runner retries the bundle (an outage, not bad data);
        default ``(OSError, MemoryError)``. Every other exception sends the
        element to ``.invalid``. ``()`` treats every exception as bad data.
        See :mod:`dp_beam.transforms.events`.
      label: the transform's label (or use ``"label" >> transform``).

    Keys (``key_fn``) and users (``user_fn``) are normalised before any
    grouping: NumPy scalars become Python values and equal numbers one key
    (``numpy.str_("AA")`` and ``"AA"`` are one stream; ``1``, ``1.0`` and
    ``numpy.int64(1)`` are one key, released as ``1``). A key or user that
    is NaN (a missing value from pandas), unhashable (a list, dict or set)
    or not a string, number, bytes or tuple of these sends its event to
    ``.invalid``; so do event times that are naive datetimes, and numbers
    out of the float range. See :mod:`dp_beam.transforms.stream_keys`.
    """

    def __init__(self, epsilon: float, step: Union[float, datetime.timedelta], *,
                 start: Any = None, end: Any = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None, privacy_unit: str = "event",
                 user_fn: Optional[Callable[[Any], Any]] = None,
                 max_contributions: Optional[int] = None, mechanism: Optional[str] = None,
                 noise: str = "laplace", delta: Optional[float] = None, calibration: str = "zcdp",
                 horizon: Optional[int] = None,
                 allowed_lateness: Union[float, datetime.timedelta] = datetime.timedelta(days=1),
                 late: str = "defer", hot_key_fanout: Optional[int] = None, monotone: bool = False,
                 rng: Union[None, int, NoiseSource] = None, noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 shards: Optional[int] = None, label: Optional[str] = None) -> None:
        super().__init__(epsilon, step, **_forwarded(locals()))


class ContinualSum(_ContinualTotal):
    """The running sum of ``value_fn`` clamped to ``[lower, upper]``, released every step.

    The per-event sensitivity under add/remove of an event is
    ``max(|lower|, |upper|)``; times ``max_contributions`` at the user level.
    Values are clamped (counted in the ``clamped`` metric); non-numeric, NaN or
    infinite values go to ``.invalid``. Other arguments as
    :class:`ContinualCount`.

    Example (noise switched off to show the clamped running sums):

    >>> import apache_beam as beam
    >>> from apache_beam.options.pipeline_options import PipelineOptions
    >>> import dp_beam as dpb
    >>> from dp_beam.mechanisms import ZeroNoise   # noise off: for the example only
    >>> events = [{"ts": float(t), "delay": float(t % 5)} for t in range(30)]
    >>> total = dpb.ContinualSum(value_fn=lambda e: e["delay"], lower=0, upper=3, epsilon=1.0,
    ...                          step=10, start=0, end=30, timestamp_fn=lambda e: e["ts"],
    ...                          rng=ZeroNoise())
    >>> with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
    ...     out = p | beam.Create(events) | total
    ...     _ = out.releases | beam.Map(lambda r: print(r.step, r.value))
    0 18.0
    1 36.0
    2 54.0
    """

    def __init__(self, value_fn: Callable[[Any], Any], lower: float, upper: float, epsilon: float,
                 step: Union[float, datetime.timedelta], *, start: Any = None, end: Any = None,
                 key_fn: Optional[Callable[[Any], Any]] = None, keys: Any = None,
                 timestamp_fn: Optional[Callable[[Any], Any]] = None, privacy_unit: str = "event",
                 user_fn: Optional[Callable[[Any], Any]] = None,
                 max_contributions: Optional[int] = None, mechanism: Optional[str] = None,
                 noise: str = "laplace", delta: Optional[float] = None, calibration: str = "zcdp",
                 horizon: Optional[int] = None,
                 allowed_lateness: Union[float, datetime.timedelta] = datetime.timedelta(days=1),
                 late: str = "defer", hot_key_fanout: Optional[int] = None, monotone: bool = False,
                 rng: Union[None, int, NoiseSource] = None, noise_key: Optional[NoiseKey] = None,
                 transient_errors: Sequence[Type[BaseException]] = TRANSIENT_ERRORS,
                 shards: Optional[int] = None, label: Optional[str] = None) -> None:
        value_fn = check_callable("value_fn", value_fn, required=True)
        lower, upper = _real("lower", lower), _real("upper", upper)
        if lower > upper:
            raise ValueError(f"lower must be <= upper, got lower={lower!r}, upper={upper!r}")
        kwargs = _forwarded(locals(), "value_fn", "lower", "upper")
        super().__init__(epsilon, step, value_fn=value_fn, lower=lower, upper=upper, **kwargs)

    def _per_event_bound(self) -> float:
        return max(abs(self._lower), abs(self._upper))
