"""Per-step keying (steps.py): every DoFn puts an event or aggregate on the epoch-aligned step
grid of ``FixedWindows(step)``, and ``per_step``'s batch and windowed paths agree."""

import apache_beam as beam
import pytest
from apache_beam.transforms.window import IntervalWindow, TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from dp_beam.transforms.steps import EventStep, KeyByStep, StepEnd, StepOf, per_step
from tests.beam_util import batch_options, collect

STEP = 10.0
MICROS = 10_000_000


@pytest.mark.parametrize("seconds, step", [(0.0, 0), (9.999999, 0), (10.0, 1), (25.0, 2),
                                           (-0.000001, -1)])
def test_event_step_and_key_by_step_use_the_epoch_aligned_grid(seconds, step):
    ts = Timestamp(micros=round(seconds * 1e6))
    assert list(EventStep(MICROS).process(("k", 3.0), ts)) == [("k", (step, 3.0))]
    assert list(KeyByStep(MICROS).process(("k", 3.0), ts)) == [(("k", step), 3.0)]


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
