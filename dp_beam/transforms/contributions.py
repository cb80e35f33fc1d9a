"""Per-user contribution bounding: at most ``max_contributions`` events per user, and the
dead letters of the events beyond a cap.

The one per-event stage with keyed state (one counter per user,
``docs/design.md`` D2): a user's events are capped across all keys and all
time, which is what lets the per-key streams compose in parallel at the
user level. Events beyond a cap are not dropped silently (D6): they leave on
the ``capped`` output and become one ``invalid`` record per (reason, user,
step) (:class:`CountCapped`), so input = used + invalid still holds.
"""

import itertools
from typing import Any, Dict, Iterable, List, Optional

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import FixedWindows, GlobalWindows

from dp_beam.records import InvalidElement
from dp_beam.transforms.events import (CAPPED, INVALID, NAMESPACE, UNBOUNDED_LATENESS,
                                       PrepareEvents)
from dp_beam.transforms.steps import (BundleTotals, BundleUserEvents, global_element,
                                     timestamp_of_micros)
from dp_beam.transforms.stream_keys import KV

__all__ = ["BoundContributions", "BoundContributionsBatch", "capped", "capped_records",
           "CountCapped", "event_order", "PrepareUserEventsBatch"]


def capped(reason: str, user: Any, step: int, example: Dict[str, Any], ts: float,
           key: bool = False) -> pvalue.TaggedOutput:
    """An event beyond a per-user cap, on the ``capped`` output: aggregated by :class:`CountCapped`
    into one dead letter per (reason, user, step), and per key when ``key`` is true (a cap on
    the keys a user may touch: the record then says which key was refused)."""
    by_key = (True, example["key"]) if key else (False, None)
    return pvalue.TaggedOutput(CAPPED, beam.window.TimestampedValue(
        ((reason, user, step) + by_key, (ts, example)), ts))


class _UserBound(beam.DoFn):
    """The caps both per-user stages apply, and the ``capped`` output of an event beyond
    one (counted in the ``over_contribution`` or ``over_keys`` metric)."""

    def __init__(self, transform: str, max_contributions: int, max_keys: Optional[int] = None,
                 step_micros: int = 1) -> None:
        self._transform = transform
        self._cap = max_contributions
        self._max_keys = max_keys
        self._step_micros = step_micros
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")
        self._over_keys = Metrics.counter(NAMESPACE, f"{transform}.over_keys")

    def _past_cap(self, user, key, value, micros):
        """An event of a user who has used ``max_contributions`` already."""
        self._over.inc()
        return capped(f"max_contributions ({self._cap}) exceeded for user", user,
                      micros // self._step_micros, {"key": key, "value": value}, micros / 1e6)

    def _past_keys(self, user, key, value, micros):
        """An event under a new key of a user who has ``max_keys`` keys already."""
        self._over_keys.inc()
        return capped(f"max_keys_per_unit ({self._max_keys}) exceeded for user", user,
                      micros // self._step_micros, {"key": key, "value": value}, micros / 1e6,
                      key=True)


@beam.typehints.with_output_types(KV)
class BoundContributions(_UserBound):
    """Keeps at most ``max_contributions`` events per user, over all keys and all time.

    Input ``(user, (key, value))``; output ``(key, value)`` with the event
    time kept. Bounding across keys (not per key) is what lets the per-key
    trees compose in parallel at the user level: a user's capped events split
    over keys, so the per-key costs add up to at most the whole budget.
    Events beyond the cap go to the ``capped`` output ("max_contributions
    exceeded"), which :class:`CountCapped` turns into one ``invalid`` record
    per user and step, so input = used + invalid still holds. Which events
    are kept depends on arrival order; any choice of at most the cap keeps
    the sensitivity.

    With ``max_keys`` (private key selection) a user also keeps only its first
    ``max_keys`` keys (events under others go to ``capped``), and the first
    event of a user under a key is signalled on the ``units`` output as
    ``(key, event time)``: the selection counts distinct users per key.
    """

    COUNT = ReadModifyWriteStateSpec("contributions", VarIntCoder())
    KEYS = ReadModifyWriteStateSpec("keys", PickleCoder())

    def process(self, element, windowed=beam.DoFn.WindowedValueParam,
                count=beam.DoFn.StateParam(COUNT), keys=beam.DoFn.StateParam(KEYS)):
        user, (key, value) = element
        micros = windowed.timestamp_micros
        used = count.read() or 0
        if used >= self._cap:
            yield self._past_cap(user, key, value, micros)
            return
        if self._max_keys is not None:
            seen = keys.read() or ()
            if key not in seen:
                if len(seen) >= self._max_keys:
                    yield self._past_keys(user, key, value, micros)
                    return
                keys.write(seen + (key,))
                yield pvalue.TaggedOutput("units", (key, micros / 1e6))
        count.write(used + 1)
        yield key, value


#: Valid events a bundle of :class:`PrepareUserEventsBatch` holds before it sends them on.
MAX_BUNDLE_EVENTS = 1 << 16


@beam.typehints.with_output_types(KV)
class PrepareUserEventsBatch(BundleUserEvents, PrepareEvents):
    """:class:`~dp_beam.transforms.events.PrepareEvents` with ``user_fn`` for bounded input: the
    same checks and dead letters, a bundle's valid events gathered per user,
    ``(user, [(key, value, micros), ...])`` (``micros``: the event time as a Beam timestamp
    holds it), for :class:`BoundContributionsBatch` after a grouping by user.

    An element per event cost the runner a dispatch, an encoding and a decoding per
    event on its way through the grouping; here that is paid per user and bundle. A
    bundle sends its users' lists on at its end, or whenever it holds
    :data:`MAX_BUNDLE_EVENTS` events, in the global window at the earliest of their times.
    """

    _stamp = staticmethod(timestamp_of_micros)

    def _user_events_bound(self):
        return MAX_BUNDLE_EVENTS

    def process(self, element, windowed=beam.DoFn.WindowedValueParam, declared=None):
        micros = windowed.timestamp_micros
        ts, key, user, value, err = self._prepare(element, micros, declared)
        if err:
            return (self._reject(element, err, micros),)
        # Timestamp(seconds) keeps int(seconds · 10^6) microseconds.
        micros = int(ts * 1_000_000)
        return self._gather(user, (key, value, micros), micros)


def event_order(event):
    """The sort key of a user's ``(key, value, time)`` event in the batch per-user stages:
    event-time order, ties by key and value, so that the events a cap keeps do not depend
    on the order the grouping gives them.

    With keyed noise a rerun draws the same noise, so a rerun that kept other events of a
    user would release a value differing from the first run's by exactly the change in the
    data. An order by the events' content keeps the sensitivity: the choice is a function
    of the user's own events, so neighbouring inputs (a user added or removed, or with
    other values) differ only in that user's kept events, within the caps. Ties go by key
    before value, so the keys and times a user keeps depend on no value (the mean's
    ``neighbours="values"`` takes them as public).

    >>> sorted([("b", 1.0, 5), ("a", 2.0, 5), ("a", 1.0, 5), ("z", 0.0, 4)], key=event_order)
    [('z', 0.0, 4), ('a', 1.0, 5), ('a', 2.0, 5), ('b', 1.0, 5)]
    """
    key, value, time = event
    return time, repr(key), value


class BoundContributionsBatch(BundleTotals, _UserBound):
    """:class:`BoundContributions` for bounded input, without state: a user's events, grouped
    (``(user, [[(key, value, micros), ...], ...])``, :class:`PrepareUserEventsBatch`), are
    taken in event-time order (ties by key and value), and the first ``max_contributions``
    are kept (with ``max_keys``, only under the user's first ``max_keys`` keys).

    Kept events leave as ``(key, value)`` at their event time in the global window, or,
    with ``combine_fn``, gathered per (key, step) over the bundle and sent on grouped by
    shard (:class:`~dp_beam.transforms.steps.StepTotals`) for the sharded release.
    First events of a user under a key go to ``units`` as ``(key, event time)``; events
    beyond a cap leave as finished dead letters on ``invalid`` (:func:`capped_records`:
    the records of :class:`CountCapped`), since every event of the user is in this element.

    Which events are kept differs from the streaming stage's arrival order; any choice of
    at most the cap per user keeps the sensitivity, and this one does not depend on the
    runner's order (a rerun keeps the same events). On the batch runners a state cell per
    user, read and written per event, cost more than the rest of the pipeline.
    """

    def __init__(self, transform: str, max_contributions: int, max_keys: Optional[int] = None,
                 step_micros: int = 1, combine_fn: Optional[beam.CombineFn] = None,
                 shards: Optional[int] = None) -> None:
        super().__init__(transform, max_contributions, max_keys, step_micros)
        self._lifted = combine_fn is not None
        if self._lifted:
            self._init_totals(combine_fn, step_micros, shards)

    def start_bundle(self):
        if self._lifted:
            super().start_bundle()

    def finish_bundle(self):
        if self._lifted:
            yield from super().finish_bundle()

    def process(self, element):
        user, lists = element
        events = list(itertools.chain.from_iterable(lists))
        if self._max_keys is None and len(events) <= self._cap:
            # Within the cap every event is kept, in any order: the order only decides which
            # events a cap refuses, and what the kept ones add up to is exact in any order
            # (counts; exact sums). Sorting by event_order took a user's share of the
            # stage's time for nothing then.
            kept = events
        else:
            kept = yield from self._within_caps(user, events)
        if self._lifted:
            add = self._totals.add
            for key, value, micros in kept:
                yield from add(key, micros, value)
        else:
            for key, value, micros in kept:
                yield global_element((key, value), timestamp_of_micros(micros))

    def _within_caps(self, user, events):
        """Yields the ``units`` of ``user``'s first events under a key (with ``max_keys``) and
        the dead letters of the events beyond a cap; returns the kept events, the first in
        :func:`event_order` within the caps."""
        cap, max_keys = self._cap, self._max_keys
        kept, seen, over = [], [], []
        for key, value, micros in sorted(events, key=event_order):
            if len(kept) >= cap:
                over.append(self._past_cap(user, key, value, micros))
                continue
            if max_keys is not None and key not in seen:
                if len(seen) >= max_keys:
                    over.append(self._past_keys(user, key, value, micros))
                    continue
                seen.append(key)
                yield pvalue.TaggedOutput("units", (key, micros / 1e6))
            kept.append((key, value, micros))
        for record in capped_records(self._transform, over):
            yield pvalue.TaggedOutput(INVALID, record)
        return kept


class _CountAndExample(beam.CombineFn):
    """``(events, example)`` of one (reason, user, step): the example is the earliest event
    (ties: the smallest ``repr``), so a retried bundle picks the same one."""

    def create_accumulator(self):
        return (0, None)

    def add_input(self, acc, item):
        n, best = acc
        ts, example = item
        cand = (ts, repr(example), example)
        if best is None or cand[:2] < best[:2]:
            best = cand
        return (n + 1, best)

    def merge_accumulators(self, accs):
        n, best = 0, None
        for m, b in accs:
            n += m
            if b is not None and (best is None or b[:2] < best[:2]):
                best = b
        return (n, best)

    def extract_output(self, acc):
        return acc


def _capped_record(transform, element):
    """The ``invalid`` record of one (reason, user, step[, key]) and its ``(events, example)``."""
    (reason, user, step, by_key, key), (n, (ts, _, example)) = element
    record = {"user": user, "step": step}
    if by_key:
        record["key"] = key
    record["example"] = example
    return InvalidElement.of(transform, reason, record, ts, count=n)


class _CappedRecord(beam.DoFn):
    def __init__(self, transform):
        self._transform = transform

    def process(self, element):
        yield _capped_record(self._transform, element)


def capped_records(transform: str, outputs: Iterable[pvalue.TaggedOutput]) -> List[InvalidElement]:
    """:class:`CountCapped`'s records of :func:`capped` outputs that hold every capped event of
    their users: what a bounded per-user stage, which sees all of a user's events in one
    element, makes of them without the grouping (one element and one stage fewer per
    record). Ordered by first appearance; the records are those of :class:`CountCapped`
    (same count, example and id), since a (reason, user, step) never spans two elements."""
    fn = _CountAndExample()
    accumulators: Dict[Any, Any] = {}
    for output in outputs:
        slot, item = output.value.value
        acc = accumulators.get(slot)
        accumulators[slot] = fn.add_input(fn.create_accumulator() if acc is None else acc, item)
    return [_capped_record(transform, kv) for kv in accumulators.items()]


class CountCapped(beam.PTransform):
    """The ``capped`` output of a per-user stage → one ``InvalidElement`` per (reason, user, step).

    (Per (reason, user, step, key) for the caps on keys per user: ``element``
    then names the refused ``key``.)

    A user far over a cap would otherwise write one dead letter per event
    (18,345 rows from 20,000 events in one run). Each record's ``count`` is
    the number of events it stands for and ``element`` holds the user, the
    step and the earliest of them as an example, so input = used + Σ count
    still holds exactly. Streaming input is combined in the steps' event-time
    windows (late events make further records of their step, never a lost
    one); bounded input in the global window (the step is part of the key).
    """

    def __init__(self, transform: str, step_seconds: float, label: Optional[str] = None) -> None:
        super().__init__(label)
        self._transform = transform
        self._step = step_seconds

    def expand(self, capped_events):
        if not capped_events.is_bounded:
            capped_events = capped_events | "CappedWindows" >> beam.WindowInto(
                FixedWindows(self._step), allowed_lateness=UNBOUNDED_LATENESS)
        records = (capped_events
                   | "CountPerUserStep" >> beam.CombinePerKey(_CountAndExample())
                   | "CappedRecords" >> beam.ParDo(_CappedRecord(self._transform)))
        if not capped_events.is_bounded:
            # Beside the other dead letters, in the global window.
            records = records | "CappedRewindow" >> beam.WindowInto(GlobalWindows())
        return records
