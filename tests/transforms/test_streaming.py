"""Streaming tests (TestStream on BundleBasedDirectRunner) of the ordered release."""

import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise
from tests.beam_util import collect, streaming_options

STEP = 10
# Every TestStream run declares its end: without one a streaming stream releases with
# the watermark forever, and the watermark jumps to infinity at the end of the stream.
START, END = 0, 80


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
            epsilon=1.0, step=STEP, late=late, start=START, end=END, rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(streaming_options(), build)


def test_streaming_defer_counts_late_events_into_the_next_step():
    out = _run("defer")
    releases = out["releases"]
    # Released in step order, every step, empty ones included.
    assert [r.step for r in releases] == list(range(8))
    # 0:{3,5} 1:{} 2:{25} 3:{late 15} 4:{} 5:{55} 6,7: empty, released up to end=80.
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


def test_streaming_releases_every_step_without_pausing():
    # Formerly the stream paused after max_idle_steps empty steps and resumed with the
    # next event. A pause depends on the data, so it is gone: every step from start to
    # end is released as the watermark passes it, with or without events.
    ev = lambda ts: TimestampedValue({"ts": ts}, ts)
    stream = (_TestStream()
              .add_elements([ev(1.0)])
              .advance_watermark_to(100)       # steps 0..9 pass: all released, 1..9 empty
              .add_elements([ev(101.0)])        # step 10 follows in order
              .advance_watermark_to(120)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "count" >> dpb.ContinualCount(
            epsilon=1.0, step=STEP, start=0, end=140, rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting}
    out = collect(streaming_options(), build)
    releases = out["releases"]
    steps = [r.step for r in releases]
    assert steps == list(range(14))
    assert [r.t for r in releases] == list(range(1, 15))
    assert [r.value for r in releases] == pytest.approx([1.0] * 10 + [2.0] * 4)
    assert len(out["accounting"]) == 1


def test_streaming_declared_keys_release_from_start_without_events():
    # A declared key with no events has its stream from start, and a key that first
    # appears later does not start later: both release steps start..end-1.
    ev = lambda ts, k: TimestampedValue({"ts": ts, "k": k}, ts)
    stream = (_TestStream()
              .add_elements([ev(12.0, "a")])
              .advance_watermark_to(30)
              .add_elements([ev(35.0, "b"), ev(36.0, "c")])   # "c" is not declared
              .advance_watermark_to(50)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "count" >> dpb.ContinualCount(
            epsilon=1.0, step=STEP, start=10, end=50, key_fn=lambda e: e["k"],
            keys=["a", "b", "idle"], rng=ZeroNoise())
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    out = collect(streaming_options(), build)
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append((r.step, r.t, r.value))
    assert by_key == {
        "a": [(1, 1, 1.0), (2, 2, 1.0), (3, 3, 1.0), (4, 4, 1.0)],
        "b": [(1, 1, 0.0), (2, 2, 0.0), (3, 3, 1.0), (4, 4, 1.0)],
        "idle": [(1, 1, 0.0), (2, 2, 0.0), (3, 3, 0.0), (4, 4, 0.0)],
    }
    assert sorted(e.key for e in out["accounting"]) == ["a", "b", "idle"]
    (undeclared,) = out["invalid"]
    assert "undeclared key 'c'" in undeclared.reason


# -- events beyond the allowed lateness: used or in .invalid, never lost --------------------------

def _late_transforms():
    """Every transform family, set so that its releases show how many events it used."""
    common = dict(step=STEP, start=0, end=60, allowed_lateness=5, rng=ZeroNoise())
    erm = dict(features_fn=lambda e: [0.1, 0.2], label_fn=lambda e: e["ts"] % 2 < 1,
               classes=(False, True), n_features=2, feature_bound=1.0, lam=0.1, epsilon=1.0,
               block_size=1, **common)
    return {
        "count": lambda late: dpb.ContinualCount(epsilon=1.0, late=late, **common),
        # Beam's with_hot_key_fanout re-windows without the allowed lateness: it lost
        # the late events of hot keys. The transform fans out on its own instead.
        "count with fanout": lambda late: dpb.ContinualCount(epsilon=1.0, late=late,
                                                             hot_key_fanout=3, **common),
        # lower == upper: every used event adds exactly 1.
        "sum": lambda late: dpb.ContinualSum(value_fn=lambda e: e["ts"], lower=1, upper=1,
                                             epsilon=1.0, late=late, **common),
        # One sample per user (m = 1): the denominator counts the samples used.
        "mean": lambda late: dpb.ContinualMean(
            user_fn=lambda e: e["ts"], value_fn=lambda e: 0.5, lower=0, upper=1,
            max_samples_per_user=1, epsilon=1.0, neighbours="values", late=late, **common),
        # One point per block: the last model's t counts the points used.
        "erm": lambda late: dpb.ContinualERM(base_size=1, late=late, **erm),
    }


def _used(name, releases):
    if not releases:
        return 0
    last = max(releases, key=lambda r: (r.step, r.t))
    if name == "mean":
        return last.denominator
    return last.t if name == "erm" else last.value


@pytest.mark.parametrize("late", ["defer", "drop"])
@pytest.mark.parametrize("name", ["count", "count with fanout", "sum", "mean", "erm"])
def test_regression_events_beyond_allowed_lateness_go_to_invalid(name, late):
    # Formerly Beam's trigger driver dropped the late events of expired windows (here
    # ts 4 and 15: the watermark at 30 is past their window ends + 5 s) with no record
    # and no counter: Count and Sum lost 2 of 15 events under either policy.
    ev = lambda ts: TimestampedValue({"ts": ts}, ts)
    stream = (_TestStream()
              .add_elements([ev(1.0), ev(2.0), ev(11.0)])
              .advance_watermark_to(30)                        # steps 0, 1, 2 released
              .add_elements([ev(25.0), ev(4.0), ev(15.0)])     # late by 0, 20 and 10 s
              .add_elements([ev(39.0)])                        # on time
              .advance_watermark_to(40)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | name >> _late_transforms()[name](late)
        return {"releases": res.releases, "invalid": res.invalid}
    out = collect(streaming_options(), build)
    invalid = out["invalid"]
    used = _used(name, out["releases"])
    assert used + sum(i.count for i in invalid) == 7
    steps = sorted(i.element["step"] for i in invalid)
    if late == "defer":
        # Step 2's event arrived within the lateness: counted into step 3.
        assert used == 5 and steps == [0, 1]
        assert all(i.reason.startswith("late beyond allowed_lateness (5 s)") for i in invalid)
    else:
        assert used == 4 and steps == [0, 1, 2]
        assert all(i.reason.startswith("late: step") for i in invalid)
    assert all(i.id for i in invalid)
