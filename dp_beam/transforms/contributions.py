"""Per-user contribution bounding: at most ``max_contributions`` events per user, and the
dead letters of the events beyond a cap.

The one per-event stage with keyed state (one counter per user,
``docs/design.md`` D2): a user's events are capped across all keys and all
time, which is what lets the per-key streams compose in parallel at the
user level. Events beyond a cap are not dropped silently (D6): they leave on
the ``capped`` output and become one ``invalid`` record per (reason, user,
step) (:class:`CountCapped`), so input = used + invalid still holds.
"""

from typing import Any, Dict, Iterable, List, Optional

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import PickleCoder, VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import FixedWindows, GlobalWindows

from dp_beam.records import InvalidElement
from dp_beam.transforms.events import CAPPED, NAMESPACE, UNBOUNDED_LATENESS
from dp_beam.transforms.stream_keys import KV

__all__ = ["BoundContributions", "capped", "capped_records", "CountCapped"]


def capped(reason: str, user: Any, step: int, example: Dict[str, Any], ts: float,
           key: bool = False) -> pvalue.TaggedOutput:
    """An event beyond a per-user cap, on the ``capped`` output: aggregated by :class:`CountCapped`
    into one dead letter per (reason, user, step), and per key when ``key`` is true (a cap on
    the keys a user may touch: the record then says which key was refused)."""
    by_key = (True, example["key"]) if key else (False, None)
    return pvalue.TaggedOutput(CAPPED, beam.window.TimestampedValue(
        ((reason, user, step) + by_key, (ts, example)), ts))


@beam.typehints.with_output_types(KV)
class BoundContributions(beam.DoFn):
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

    def __init__(self, transform: str, max_contributions: int, max_keys: Optional[int] = None,
                 step_micros: int = 1) -> None:
        self._transform = transform
        self._cap = max_contributions
        self._max_keys = max_keys
        self._step_micros = step_micros
        self._over = Metrics.counter(NAMESPACE, f"{transform}.over_contribution")
        self._over_keys = Metrics.counter(NAMESPACE, f"{transform}.over_keys")

    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                count=beam.DoFn.StateParam(COUNT), keys=beam.DoFn.StateParam(KEYS)):
        user, (key, value) = element
        used = count.read() or 0
        if used >= self._cap:
            self._over.inc()
            yield capped(f"max_contributions ({self._cap}) exceeded for user", user,
                         timestamp.micros // self._step_micros, {"key": key, "value": value},
                         timestamp.micros / 1e6)
            return
        if self._max_keys is not None:
            seen = keys.read() or ()
            if key not in seen:
                if len(seen) >= self._max_keys:
                    self._over_keys.inc()
                    yield capped(f"max_keys_per_unit ({self._max_keys}) exceeded for user", user,
                                 timestamp.micros // self._step_micros,
                                 {"key": key, "value": value}, timestamp.micros / 1e6, key=True)
                    return
                keys.write(seen + (key,))
                yield pvalue.TaggedOutput("units", (key, timestamp.micros / 1e6))
        count.write(used + 1)
        yield key, value


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
