"""Streaming tests (TestStream on BundleBasedDirectRunner) of the ordered release."""

import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from tests.beam_util import collect, streaming_options

STEP = 10


def _stream():
    ev = lambda ts: TimestampedValue({"ts": ts}, ts)
    return (_TestStream()
            # Out of order: step 2 before step 0; step 1 stays empty.
            .add_elements([ev(25.0), ev(3.0)])
            .add_elements([ev(5.0)])
            .advance_watermark_to(30)
            # Late: step 1 was released when the watermark passed 20.
            .add_elements([ev(15.0)])
            .advance_watermark_to(50)
            .add_elements([ev(55.0)])
            .advance_watermark_to(60)
            .advance_watermark_to_infinity())


def _run(late):
    def build(p):
        res = p | _stream() | "count" >> dpb.ContinualCount(
            epsilon=1.0, step=STEP, late=late, max_idle_steps=2, rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(streaming_options(), build)


def test_streaming_defer_counts_late_events_into_the_next_step():
    out = _run("defer")
    releases = out["releases"]
    # Released in step order, every step, empty ones included.
    assert [r.step for r in releases] == list(range(8))
    # 0:{3,5} 1:{} 2:{25} 3:{late 15} 4:{} 5:{55} 6,7: empty until the idle cap.
    assert [r.value for r in releases] == pytest.approx([2, 2, 3, 4, 4, 5, 5, 5])
    assert out["invalid"] == []
    assert len(out["accounting"]) == 1


def test_streaming_drop_sends_late_events_to_invalid():
    out = _run("drop")
    releases = out["releases"]
    assert [r.step for r in releases] == list(range(8))
    assert [r.value for r in releases] == pytest.approx([2, 2, 3, 3, 3, 4, 4, 4])
    (late,) = out["invalid"]
    assert "late" in late.reason and late.count == 1
    # input = used + invalid: 5 events, 4 counted in the final release.
    assert releases[-1].value + late.count == 5


def test_streaming_pause_resumes_without_skipping_steps():
    ev = lambda ts: TimestampedValue({"ts": ts}, ts)
    stream = (_TestStream()
              .add_elements([ev(1.0)])
              .advance_watermark_to(100)       # steps 0..9 pass; the cap pauses after 2 empty
              .add_elements([ev(101.0)])        # resumes: steps 3..10 follow in order
              .advance_watermark_to(120)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "count" >> dpb.ContinualCount(
            epsilon=1.0, step=STEP, max_idle_steps=2, rng=ZeroNoise())
        return {"releases": res.releases}
    releases = collect(streaming_options(), build)["releases"]
    steps = [r.step for r in releases]
    assert steps == list(range(len(steps)))
    assert steps[-1] >= 11
    assert [r.value for r in releases if r.step >= 10] == pytest.approx([2.0] * (steps[-1] - 9))
