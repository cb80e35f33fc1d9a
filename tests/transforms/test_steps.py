"""Per-step keying (steps.py): every DoFn puts an event or aggregate on the epoch-aligned step
grid of ``FixedWindows(step)``, and ``per_step``'s batch and windowed paths agree."""

import gc

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import GlobalWindow, IntervalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from dp_beam.transforms import steps
from dp_beam.transforms.steps import (EventStepTotals, KeyByStep, PrepareStepTotals, StepEnd,
                                      StepOf, StepTotals, in_global_window, per_step)
from tests.beam_util import batch_options, collect, windowed_at

STEP = 10.0
MICROS = 10_000_000


@pytest.mark.parametrize("seconds, step", [(0.0, 0), (9.999999, 0), (10.0, 1), (25.0, 2),
                                           (-0.000001, -1)])
def test_step_totals_and_key_by_step_use_the_epoch_aligned_grid(seconds, step):
    windowed = WindowedValue(None, Timestamp(micros=round(seconds * 1e6)), (GlobalWindow(),))
    totals = EventStepTotals(beam.combiners.CountCombineFn(), MICROS, shards=1)
    totals.start_bundle()
    assert list(totals.process(("k", 3.0), windowed)) == []
    (out,) = totals.finish_bundle()
    assert out.value == (0, [("k", step, 1)])
    assert out.timestamp == Timestamp(micros=(step + 1) * MICROS - 1)
    assert out.windows == (GlobalWindow(),)
    assert list(KeyByStep(MICROS).process(("k", 3.0), windowed)) == [(("k", step), 3.0)]


def test_step_totals_merge_a_bundle_per_key_and_step_and_flush_when_full(monkeypatch):
    monkeypatch.setattr(steps, "MAX_BUNDLE_TOTALS", 3)
    totals = StepTotals(beam.combiners.CountCombineFn(), MICROS, shards=1)
    assert totals.add("a", 1, "x") == () and totals.add("a", 2, "y") == ()
    assert totals.add("b", 1, "z") == ()
    flushed = list(totals.add("a", MICROS, "w"))  # a third (key, step): the table is emptied
    assert [wv.value[0] for wv in flushed] == [0]
    assert sorted(flushed[0].value[1]) == [("a", 0, 2), ("a", 1, 1), ("b", 0, 1)]
    assert list(totals.flush()) == []


class _Compacting(beam.combiners.CountCombineFn):
    """A count whose accumulators cross a grouping as strings."""

    def compact(self, acc):
        return f"compact {acc}"


def test_step_totals_compact_an_accumulator_as_it_leaves_only_when_the_combine_says_how():
    totals = StepTotals(_Compacting(), MICROS, shards=1)
    totals.add("a", 1, "x"), totals.add("a", 2, "y")
    (wv,) = totals.flush()
    assert wv.value == (0, [("a", 0, "compact 2")])
    # Beam's default compact (the accumulator itself) is not even called.
    calls = []
    totals = StepTotals(beam.combiners.CountCombineFn(), MICROS, shards=1)
    totals._fn.compact = lambda acc: calls.append(acc) or acc
    totals.add("a", 1, "x")
    assert list(totals.flush())[0].value == (0, [("a", 0, 1)]) and calls == []


def test_step_totals_leave_grouped_by_the_shard_of_their_key():
    """One element per shard of the bundle: every (key, step) total goes to its key's shard
    (shard_of), stamped at the earliest step end of that shard's totals."""
    from dp_beam.transforms.stream_keys import shard_of

    totals = StepTotals(beam.combiners.CountCombineFn(), MICROS, shards=4)
    keys = [f"k{i}" for i in range(20)]
    for i, key in enumerate(keys):
        totals.add(key, (i % 3) * MICROS, "x")
        totals.add(key, (i % 3) * MICROS + 5, "y")
    flushed = list(totals.flush())
    shards = [wv.value[0] for wv in flushed]
    assert len(shards) == len(set(shards)) == len({shard_of(k, 4) for k in keys})
    for wv in flushed:
        shard, entries = wv.value
        assert all(shard_of(key, 4) == shard and count == 2 for key, _, count in entries)
        first = min(step for _, step, _ in entries)
        assert wv.timestamp == Timestamp(micros=(first + 1) * MICROS - 1)
    assert sorted(key for wv in flushed for key, _, _ in wv.value[1]) == sorted(keys)
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="shards"):
            StepTotals(beam.combiners.CountCombineFn(), MICROS, shards=bad)


def test_by_shard_routes_at_once_and_makes_each_shards_list_as_it_is_taken():
    from dp_beam.transforms.stream_keys import shard_of
    table = {(f"k{i}", i % 3): i for i in range(40)}
    want = {}
    for (key, step), acc in table.items():     # shards by first entry, entries in table order
        want.setdefault(shard_of(key, 4), []).append((key, step, acc * 10))
    calls = []
    out = steps.by_shard(table, 4, MICROS, compact=lambda acc: calls.append(acc) or acc * 10)
    table.clear()                               # later changes do not change the elements
    assert calls == []
    first = next(out)
    assert calls == [acc // 10 for _, _, acc in first.value[1]]  # only the shard taken
    got = [first] + list(out)
    assert [wv.value for wv in got] == list(want.items())
    assert [wv.timestamp.micros for wv in got] == [
        (min(step for _, step, _ in entries) + 1) * MICROS - 1 for entries in want.values()]
    assert all(wv.windows == (GlobalWindow(),) for wv in got)
    assert list(steps.by_shard({}, 4, MICROS)) == []


def _tracked_reachable(root):
    """The garbage-collected containers reachable from ``root`` (itself included)."""
    seen, todo = {id(root): root}, [root]
    while todo:
        for ref in gc.get_referents(todo.pop()):
            if gc.is_tracked(ref) and id(ref) not in seen and not isinstance(ref, type):
                seen[id(ref)] = ref
                todo.append(ref)
    return len(seen)


def test_user_events_keep_each_users_order_and_no_container_per_user():
    table = steps.UserEvents(limit=10_000)
    events = [(f"u{i % 7}", ("k", float(i), i), 100 - i) for i in range(50)]
    full = [table.add(user, event, when) for user, event, when in events]
    assert not any(full) and table.add("u0", ("k", 0.0, 0), 99) is False
    out = table.elements(lambda when: Timestamp(micros=when))
    assert not isinstance(out, (list, tuple))  # made as the runner takes them
    got = [(wv.value, wv.timestamp.micros, wv.windows) for wv in out]
    # Users in the order of their first event, each user's events in the order they came.
    want = {}
    for user, event, _ in events + [("u0", ("k", 0.0, 0), 99)]:
        want.setdefault(user, []).append(event)
    assert [value for value, _, _ in got] == list(want.items())
    assert {(micros, windows) for _, micros, windows in got} == {(51, (GlobalWindow(),))}
    assert list(steps.UserEvents(limit=3).elements()) == []

    # What the table holds does not grow a container per user: with the tuples the collector
    # untracks (atomic contents) untracked, as a collection leaves them, the same number of
    # tracked containers for 10 users as for 1,000 (a list per user made it 1,000 more).
    def tracked(users):
        t = steps.UserEvents(limit=10 ** 6)
        for i in range(3 * users):
            t.add(("user", i % users), ("k", 1.0, i), i)
        gc.collect()
        return _tracked_reachable(t)

    assert tracked(1_000) == tracked(10)


def test_prepare_step_totals_validates_like_prepare_events():
    """The fused DoFn rejects what PrepareEvents rejects, with the same reasons, and steps an
    event by its time in whole microseconds as a re-stamped element would."""
    from dp_beam.transforms.events import PrepareEvents
    from dp_beam.transforms.schedule import resolve_schedule

    schedule = resolve_schedule(STEP, 0, 10 * STEP, None)
    args = dict(value_fn=lambda e: e[2], lower=0.0, upper=5.0, key_fn=lambda e: e[0],
                timestamp_fn=lambda e: e[1], schedule=schedule, keys=["a", "b"])
    fused = PrepareStepTotals("t", beam.combiners.CountCombineFn(), MICROS, 1, **args)
    plain = PrepareEvents("t", **args)
    fused.start_bundle()
    events = [("a", 3e-06, 1.0), ("a", 9.999999, 9.0), ("c", 1.0, 1.0), ("b", 120.0, 1.0),
              ("b", 1.0, "x"), ("b", 10.0, 2.0)]
    at = windowed_at(0)
    for e in events:
        got, want = list(fused.process(e, at)), list(plain.process(e, at))
        if want and hasattr(want[0], "tag"):
            assert [g.value.reason for g in got] == [w.value.reason for w in want]
        else:
            assert got == []
    (out,) = [wv.value for wv in fused.finish_bundle()]
    # 3e-06 s is 2.9999999999999996 µs as a float: Timestamp keeps 2 µs, step 0.
    assert out[0] == 0 and sorted(out[1]) == [("a", 0, 2), ("b", 1, 1)]
    with pytest.raises(ValueError, match="user_fn"):
        PrepareStepTotals("t", beam.combiners.CountCombineFn(), MICROS, 1, user_fn=lambda e: e)


def test_in_global_window_adds_a_step_only_when_needed():
    with beam.Pipeline(options=batch_options()) as p:
        events = p | beam.Create([1, 2])
        assert in_global_window(events, "G") is events
        windowed = events | beam.WindowInto(beam.window.FixedWindows(10))
        assert isinstance(in_global_window(windowed, "G").windowing.windowfn,
                          beam.window.GlobalWindows)


def test_step_end_stamps_the_aggregate_at_the_last_microsecond_of_its_step():
    (out,) = StepEnd(MICROS).process((("k", 4), (7.0, 2)))
    assert out.value == ("k", (4, (7.0, 2)))
    assert out.timestamp == Timestamp(micros=5 * MICROS - 1)


def test_step_of_is_the_step_of_the_window_start():
    window = IntervalWindow(Timestamp(micros=3 * MICROS), Timestamp(micros=4 * MICROS))
    assert list(StepOf(MICROS).process(("k", 5), window)) == [("k", (3, 5))]


EVENTS = [("a", 1.0, 0.5), ("a", 2.0, 9.0), ("a", 4.0, 31.0), ("b", 8.0, 12.0), ("b", 16.0, 19.9)]


@pytest.mark.parametrize("bounded", [True, False])
@pytest.mark.parametrize("fanout", [None, 3])
def test_per_step_sums_each_key_and_step_in_the_global_window(bounded, fanout):
    def build(p):
        events = (p | beam.Create(EVENTS)
                  | beam.Map(lambda e: TimestampedValue((e[0], e[1]), e[2])))
        out = per_step(events, _Sum(), STEP, MICROS,
                       bounded, fanout)
        return {"out": out | beam.ParDo(_WithTimestamp())}

    out = collect(batch_options(), build)["out"]
    assert sorted(e[:2] for e in out) == [("a", (0, 3.0)), ("a", (3, 4.0)), ("b", (1, 24.0))]
    for _key, (step, _total), ts in out:
        # At the end of its step: the last microsecond (bounded) or the window's
        # maximal timestamp, which Beam puts one millisecond before its end.
        assert (step + 1) * MICROS - 1000 <= ts.micros < (step + 1) * MICROS
        if bounded:
            assert ts.micros == (step + 1) * MICROS - 1


class _Sum(beam.CombineFn):
    def create_accumulator(self):
        return 0.0

    def add_input(self, acc, value):
        return acc + value

    def merge_accumulators(self, accs):
        return sum(accs)

    def extract_output(self, acc):
        return acc


class _WithTimestamp(beam.DoFn):
    def process(self, element, timestamp=beam.DoFn.TimestampParam,
                window=beam.DoFn.WindowParam):
        assert window == beam.transforms.window.GlobalWindow()
        yield element + (timestamp,)


def test_per_step_takes_stepped_input_only_when_bounded():
    with beam.Pipeline(options=batch_options()) as p:
        stepped = p | beam.Create([(("a", 0), 1.0), (("a", 0), 2.0), (("b", 3), 4.0)])
        with pytest.raises(ValueError, match="stepped"):
            per_step(stepped, beam.combiners.CountCombineFn(), STEP, MICROS, False, stepped=True)
        out = per_step(stepped, beam.combiners.CountCombineFn(), STEP, MICROS, True, stepped=True)
        assert_that(out, equal_to([("a", (0, 2)), ("b", (3, 1))]))
