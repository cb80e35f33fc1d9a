"""Per-step keying of events and aggregates, shared by the continual transforms.

A step is ``timestamp.micros // step_micros``: the epoch-aligned grid of
``FixedWindows(step)``, so the windowed (streaming) and global-window
(bounded) paths of :func:`per_step` agree on every event's step.
"""

from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

import apache_beam as beam
from apache_beam.transforms.window import FixedWindows, GlobalWindow, GlobalWindows
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from dp_beam.transforms.events import UNBOUNDED_LATENESS, PrepareEvents
from dp_beam.transforms.stream_keys import KV, StreamKey, shard_of

__all__ = ["BundleTotals", "BundleUserEvents", "by_shard", "EventStepTotals", "global_element",
           "in_global_window", "KeyByStep", "MAX_BUNDLE_TOTALS", "PrepareStepTotals", "shard_count",
           "StepEnd", "StepOf", "StepTotals", "per_step", "timestamp_of_micros", "UserEvents"]


@beam.typehints.with_output_types(Tuple[StreamKey, Any])
class KeyByStep(beam.DoFn):
    """``(key, value)`` → ``((key, step), value)``: the step of the element's timestamp on the
    epoch-aligned grid, as ``FixedWindows`` would assign it."""

    def __init__(self, step_micros: int) -> None:
        self._step_micros = step_micros

    def process(self, element, windowed=beam.DoFn.WindowedValueParam):
        key, value = element
        yield (key, windowed.timestamp_micros // self._step_micros), value


#: Partial totals one bundle holds before it emits them: bounds a bundle's memory, while
#: every event of a (key, step) seen before the bound still enters one accumulator.
MAX_BUNDLE_TOTALS = 1 << 16
_GLOBAL_WINDOWS = (GlobalWindow(),)


def global_element(value: Any, timestamp: Timestamp) -> WindowedValue:
    """``value`` at ``timestamp`` in the global window, for a DoFn whose input is there.

    What ``TimestampedValue(value, timestamp)`` becomes once the global
    window's ``WindowFn`` has assigned it, without that assignment per element
    (a measurable share of a per-event or per-release DoFn).
    """
    return WindowedValue(value, timestamp, _GLOBAL_WINDOWS)


def _same_time(when):
    return when


def timestamp_of_micros(micros: int) -> Timestamp:
    """The Beam timestamp of ``micros`` microseconds: the stamp of events gathered at the
    ``timestamp_micros`` of their windowed values (:class:`BundleUserEvents` ``_stamp``)."""
    return Timestamp(micros=micros)


class UserEvents:
    """A bundle's valid events gathered per user, for the grouping by user that follows:
    ``(user, [event, ...])`` elements, each user's events in the order they came, the users
    in the order of their first event.

    An element per event would cost the runner a dispatch, an encoding and a decoding
    per event on its way through the grouping; gathered, that is paid per user and
    bundle. The owner sends the table on at the bundle's end, or once :meth:`add` says it
    holds ``limit`` events (a bound on the bundle's memory), as global-window elements
    stamped at the earliest of their times (:meth:`elements`).

    The table holds the events in one list in arrival order, each with the position of
    its user's previous event, and no container per user; a user's list is made as its
    element is sent on, and the elements are made one at a time as the runner takes them.
    A list per user kept until the table was sent on, and the table's elements all made
    at once, outlived the garbage collector's young generations; every few tens of
    thousands of such survivors set off a full pass over everything the process holds
    (README, *Releases with many keys*).

    >>> table = UserEvents(limit=4)
    >>> table.add("u", "a", 3), table.add("v", "b", 1), table.add("u", "c", 2)
    (False, False, False)
    >>> [wv.value for wv in table.elements()], table.elements().__class__.__name__
    ([('u', ['a', 'c']), ('v', ['b'])], 'generator')
    """

    __slots__ = ("_limit", "_rows", "_previous", "_last", "_earliest")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._rows: list = []
        self._previous: List[int] = []
        self._last: dict = {}
        self._earliest = None

    def add(self, user: Any, event: Any, when: Any) -> bool:
        """Adds ``user``'s ``event`` at ``when`` (comparable with the other times); True once
        the table holds ``limit`` events."""
        rows, last = self._rows, self._last
        self._previous.append(last.get(user, -1))
        last[user] = len(rows)
        rows.append(event)
        if self._earliest is None or when < self._earliest:
            self._earliest = when
        return len(rows) >= self._limit

    def elements(self, stamp: Callable[[Any], Timestamp] = _same_time) -> Iterator[WindowedValue]:
        """The gathered ``(user, events)``, each in the global window at ``stamp`` of the
        earliest time (the identity for times that are Beam timestamps), made as they are
        taken."""
        if not self._rows:
            return iter(())
        return self._elements(stamp(self._earliest))

    def _elements(self, earliest: Timestamp) -> Iterator[WindowedValue]:
        rows, previous = self._rows, self._previous
        for user, i in self._last.items():
            events = []
            while i >= 0:
                events.append(rows[i])
                i = previous[i]
            events.reverse()
            yield global_element((user, events), earliest)


class BundleUserEvents:
    """The bundle lifecycle of a validating DoFn that gathers :class:`UserEvents`: a fresh
    table at construction and per bundle, sent on when full (:meth:`_gather`) and at the
    bundle's end. Subclasses give the table's bound (:meth:`_user_events_bound`, read for
    every new table) and, for times that are not Beam timestamps, ``_stamp``."""

    _stamp = staticmethod(_same_time)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gathered = UserEvents(self._user_events_bound())

    def _user_events_bound(self) -> int:
        raise NotImplementedError

    def start_bundle(self):
        self._gathered = UserEvents(self._user_events_bound())

    def _gather(self, user: Any, event: Any, when: Any) -> Iterable[WindowedValue]:
        """Adds ``user``'s ``event`` at ``when``; the table's elements once it is full."""
        if self._gathered.add(user, event, when):
            return self.finish_bundle()
        return ()

    def finish_bundle(self):
        gathered, self._gathered = self._gathered, UserEvents(self._user_events_bound())
        return gathered.elements(self._stamp)


class StepTotals:
    """Partial accumulators of ``combine_fn`` per (key, step), gathered over one bundle and
    sent on grouped by shard.

    Beam lifts a ``CombinePerKey`` the same way: each bundle pre-combines what
    it holds, and the grouping carries one accumulator per (key, step) and
    bundle instead of one element per event. Here the bundle also groups its
    accumulators by the shard of their key (:func:`~dp_beam.transforms.
    stream_keys.shard_of`), the grouping of the release that merges them
    (:class:`~dp_beam.transforms.shards.BatchShardReleaseDoFn`): one element
    per shard and bundle, ``(shard, [(key, step, accumulator), ...])``, in the
    global window, stamped at the earliest of its steps' last microseconds.
    A (key, step) element each would cost the runner an element's dispatch,
    encoding and grouping per release (design D1.4). Exact only for a
    combine whose merge does not depend on the order (the counts and the
    exact sums of the continual totals; the ERM's lists of points, which the
    release sorts by a key that never depends on their order).
    ``max_inputs``: also emit once the table holds that many inputs (for
    accumulators that grow with their inputs, such as lists of points). A
    combine that overrides ``compact`` has it applied to each accumulator as it
    leaves, as Beam does before a lifted combine's grouping (the ERM's
    :class:`~dp_beam.transforms.erm_points.PackPoints` sends its buffers so).

    >>> totals = StepTotals(beam.combiners.CountCombineFn(), step_micros=10, shards=1)
    >>> totals.add("k", 3, 1.0), totals.add("k", 7, 1.0), totals.add("k", 12, 1.0)
    ((), (), ())
    >>> [wv.value for wv in totals.flush()]
    [(0, [('k', 0, 2), ('k', 1, 1)])]
    """

    def __init__(self, combine_fn: beam.CombineFn, step_micros: int, shards: int,
                 max_inputs: Optional[int] = None) -> None:
        self._fn = combine_fn
        self._step_micros = step_micros
        self._shards = shard_count(shards)
        self._accumulators = {}
        self._max_inputs = max_inputs
        self._inputs = 0
        # Beam's default compact returns its argument: a call per entry for nothing.
        overridden = type(combine_fn).compact is not beam.CombineFn.compact
        self._compact = combine_fn.compact if overridden else None

    def add(self, key: Any, micros: int, value: Any) -> Iterable[WindowedValue]:
        """Adds an event at ``micros``; returns what to emit now (nothing, or the whole table
        once it holds :data:`MAX_BUNDLE_TOTALS` entries or ``max_inputs`` inputs)."""
        slot = (key, micros // self._step_micros)
        accumulators = self._accumulators
        acc = accumulators.get(slot)
        if acc is None:
            acc = self._fn.create_accumulator()
        accumulators[slot] = self._fn.add_input(acc, value)
        if len(accumulators) >= MAX_BUNDLE_TOTALS:
            return self.flush()
        if self._max_inputs is not None:
            self._inputs += 1
            if self._inputs >= self._max_inputs:
                return self.flush()
        return ()

    def flush(self) -> Iterator[WindowedValue]:
        """The gathered accumulators, one global-window element per shard; the table starts
        empty again."""
        accumulators, self._accumulators = self._accumulators, {}
        self._inputs = 0
        return by_shard(accumulators, self._shards, self._step_micros, self._compact)


def shard_count(shards: Any) -> int:
    """``shards`` checked as the number of shards :func:`by_shard` routes to."""
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    return shards


def by_shard(table: Mapping[Tuple[Any, int], Any], shards: int, step_micros: int,
             compact: Optional[Callable[[Any], Any]] = None) -> Iterator[WindowedValue]:
    """The entries of ``table``, ``{(key, step): accumulator}``, as one global-window element
    per shard, ``(shard, [(key, step, accumulator), ...])``, the shards in the order of their
    first entry and each shard's entries in the table's order, stamped at the end of its
    earliest step: what a bundle sends to the batch release. ``compact``: applied to each
    accumulator first (the combine's ``compact``).

    The entries are routed to their shards at once, but each shard's list (and its
    compacted accumulators) is made as its element is taken. Made all at once, the lists of
    a table of 100,000 aggregates of the mean outlived the garbage collector's young
    generations (a tuple holding a dict is never untracked) and set off a full collection
    every few tens of thousands of them. Entries added to or taken from ``table`` later do
    not change the elements; an accumulator is read (and compacted) when its shard's element
    is taken, so the callers hand over accumulators that nothing changes any more.

    >>> [wv.value for wv in by_shard({("a", 0): 1, ("b", 0): 2, ("a", 1): 3}, 1, 10)]
    [(0, [('a', 0, 1), ('b', 0, 2), ('a', 1, 3)])]
    """
    slots, accumulators = list(table), list(table.values())
    positions: Dict[int, List[int]] = {}
    for i, (key, _) in enumerate(slots):
        shard = shard_of(key, shards)
        got = positions.get(shard)
        if got is None:
            positions[shard] = [i]
        else:
            got.append(i)
    return _shard_elements(slots, accumulators, positions, step_micros, compact)


def _shard_elements(slots, accumulators, positions, step_micros, compact):
    for shard, got in positions.items():
        entries = []
        for i in got:
            key, step = slots[i]
            acc = accumulators[i]
            entries.append((key, step, acc if compact is None else compact(acc)))
        earliest = min(slots[i][1] for i in got)
        yield global_element((shard, entries), Timestamp(micros=(earliest + 1) * step_micros - 1))


class BundleTotals:
    """The bundle lifecycle of a DoFn that gathers :class:`StepTotals`: a fresh table per
    bundle, flushed at its end. The arguments are validated once, at construction."""

    def _init_totals(self, combine_fn: beam.CombineFn, step_micros: int, shards: int,
                     max_inputs: Optional[int] = None) -> None:
        self._totals_args = (combine_fn, step_micros, shards, max_inputs)
        self._totals = StepTotals(*self._totals_args)

    def start_bundle(self):
        self._totals = StepTotals(*self._totals_args)

    def finish_bundle(self):
        yield from self._totals.flush()


@beam.typehints.with_output_types(Tuple[int, List[Tuple[StreamKey, int, Any]]])
class EventStepTotals(BundleTotals, beam.DoFn):
    """``(key, value)`` events in the global window → ``(shard, [(key, step, accumulator),
    ...])``: the bundle's partial totals per (key, step) grouped by shard
    (:class:`StepTotals`), for a release that merges them itself."""

    def __init__(self, combine_fn: beam.CombineFn, step_micros: int, shards: int) -> None:
        self._init_totals(combine_fn, step_micros, shards)

    def process(self, element, windowed=beam.DoFn.WindowedValueParam):
        key, value = element
        return self._totals.add(key, windowed.timestamp_micros, value)


@beam.typehints.with_output_types(Tuple[int, List[Tuple[StreamKey, int, Any]]])
class PrepareStepTotals(BundleTotals, PrepareEvents):
    """:class:`~dp_beam.transforms.events.PrepareEvents` and :class:`EventStepTotals` in one
    pass, for events in the global window without ``user_fn``: the same checks and dead
    letters, then the bundle's partial totals per (key, step) instead of one timestamped
    element per event (which costs a window assignment, and a second DoFn to find its step).

    The step is that of the event time as :class:`~apache_beam.utils.timestamp.Timestamp`
    holds it (whole microseconds, truncated), as if the event had been re-stamped.
    """

    def __init__(self, transform: str, combine_fn: beam.CombineFn, step_micros: int,
                 shards: int, **prepare: Any) -> None:
        super().__init__(transform, **prepare)
        if self._user_fn is not None:
            raise ValueError("PrepareStepTotals takes no user_fn (user contributions are "
                             "bounded between validation and the totals)")
        self._init_totals(combine_fn, step_micros, shards)

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        # Returns its outputs (a generator per event would cost more than the addition).
        ts, key, _, value, err = self._prepare(element, micros, declared)
        if err:
            return (self._reject(element, err, micros),)
        # Timestamp(seconds) keeps int(seconds · 10^6) microseconds.
        return self._totals.add(key, int(ts * 1_000_000), value)


@beam.typehints.with_output_types(Tuple[StreamKey, Tuple[int, Any]])
class StepEnd(beam.DoFn):
    """``((key, step), aggregate)`` → ``(key, (step, aggregate))`` stamped at the step's last
    microsecond, where a windowed combine of the step would have put it."""

    def __init__(self, step_micros: int) -> None:
        self._step_micros = step_micros

    def process(self, element):
        (key, step), agg = element
        yield beam.window.TimestampedValue(
            (key, (step, agg)), Timestamp(micros=(step + 1) * self._step_micros - 1))


@beam.typehints.with_output_types(Tuple[StreamKey, Tuple[int, Any]])
class StepOf(beam.DoFn):
    """Attaches the epoch-aligned step index of the fixed window."""

    def __init__(self, step_micros: int) -> None:
        self._step_micros = step_micros

    def process(self, element, window=beam.DoFn.WindowParam):
        key, aggregate = element
        yield key, (window.start.micros // self._step_micros, aggregate)


class _Partial(beam.CombineFn):
    """First stage of a fanned-out combine: ``fn`` whose output is its accumulator."""

    def __init__(self, fn):
        self._fn = fn

    def create_accumulator(self):
        return self._fn.create_accumulator()

    def add_input(self, acc, value):
        return self._fn.add_input(acc, value)

    def merge_accumulators(self, accs):
        return self._fn.merge_accumulators(accs)

    def extract_output(self, acc):
        return acc


class _MergePartials(_Partial):
    """Second stage of a fanned-out combine: merges the first stage's accumulators."""

    def add_input(self, acc, partial):
        return self._fn.merge_accumulators([acc, partial])

    def extract_output(self, acc):
        return self._fn.extract_output(acc)


def _nonce(kv, fanout):
    import random
    return (kv[0], random.randrange(fanout)), kv[1]


class _FanoutCombinePerKey(beam.PTransform):
    """``CombinePerKey(fn)`` spread over ``fanout`` sub-keys per key, then merged per key.

    Used instead of Beam's ``with_hot_key_fanout`` on windowed input: Beam
    re-windows the hot path with ``WindowInto(windowing)``, which drops the
    windowing's allowed lateness (Beam 2.77), so late events of a hot key
    were silently lost. Both stages here keep the input's windowing.
    """

    def __init__(self, fn, fanout, label=None):
        super().__init__(label)
        self._fn = fn
        self._fanout = fanout

    def expand(self, pcoll):
        return (pcoll
                | "Spread" >> beam.Map(_nonce, self._fanout).with_output_types(KV)
                | "PreCombine" >> beam.CombinePerKey(_Partial(self._fn))
                | "Gather" >> beam.Map(lambda kv: (kv[0][0], kv[1])).with_output_types(KV)
                | "PostCombine" >> beam.CombinePerKey(_MergePartials(self._fn)))


def in_global_window(pcoll: beam.PCollection, label: str) -> beam.PCollection:
    """``pcoll`` in the global window: itself when it is there already (no step added),
    else re-windowed under ``label``. A continual transform's schedule decides its steps,
    so it takes its input there; the partial totals of :class:`StepTotals`, for one, are
    emitted there, and every output must share one windowing to be flattened."""
    if isinstance(pcoll.windowing.windowfn, GlobalWindows):
        return pcoll
    return pcoll | label >> beam.WindowInto(GlobalWindows())


def per_step(valid: beam.PCollection, combine_fn: beam.CombineFn, step_seconds: float,
             step_micros: int, bounded: bool, fanout: Optional[int] = None,
             stepped: bool = False) -> beam.PCollection:
    """``(key, value)`` events → ``(key, (step, aggregate))`` in the global window.

    Streaming: ``combine_fn`` per key in event-time fixed windows of one
    step, with unbounded allowed lateness (Beam would drop the late events of
    expired windows without a record; the release applies ``late`` and
    ``allowed_lateness`` instead). Bounded input has no late data: the
    combine is keyed by (key, step) in the global window, because the batch
    runners' windowed grouping scans every window a key has seen for each
    new one (measured: a plain hourly count of 100,000 events over a year of
    steps ran at ~400 events/s). ``fanout``: hot-key fan-out of the combine.
    ``stepped`` (bounded only): ``valid`` is already ``((key, step), value)``
    in the global window (the validating DoFn computed the step).
    """
    if stepped and not bounded:
        raise ValueError("stepped input is for bounded input only (streaming steps by window)")
    if bounded:
        combine = beam.CombinePerKey(combine_fn)
        if fanout is not None:
            combine = combine.with_hot_key_fanout(fanout)
        keyed = valid if stepped else (in_global_window(valid, "StepGlobal")
                                       | "StepKey" >> beam.ParDo(KeyByStep(step_micros)))
        return (keyed
                | "PerStep" >> combine
                | "StepIndex" >> beam.ParDo(StepEnd(step_micros)))
    combine = (beam.CombinePerKey(combine_fn) if fanout is None
               else _FanoutCombinePerKey(combine_fn, fanout))
    return (valid
            | "StepWindows" >> beam.WindowInto(
                FixedWindows(step_seconds), allowed_lateness=UNBOUNDED_LATENESS)
            | "PerStep" >> combine
            | "StepIndex" >> beam.ParDo(StepOf(step_micros))
            | "Rewindow" >> beam.WindowInto(GlobalWindows()))
