"""The ordered release (release.py) driven directly, on in-memory stand-ins for its state cells:
the release of every step on the public schedule, late aggregates, closing at the horizon,
noise identities of stream keys."""

import math

import pytest
from apache_beam import pvalue
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import InvalidElement
from dp_beam.transforms.events import INVALID
from dp_beam.transforms.release import OrderedReleaseDoFn
from dp_beam.transforms.release_spec import ACCOUNTING, CLOSED, NOT_ADMITTED, ReleaseSpec
from dp_beam.transforms.schedule import NotAdmitted, StreamStart
from tests.fake_state import Bag, Cell, Timer


# --------------------------------------------------------------------------- OrderedReleaseDoFn

class Running:
    """A noise-free running total: enough to see which aggregate went to which step."""

    def __init__(self, total=0.0, rng=None):
        self.total = total
        self.rng = rng

    def to_state(self):
        return self.total


class RunningSpec(ReleaseSpec):
    transform = "running"
    step_seconds = 10.0

    def __init__(self, horizon=None):
        self.horizon = horizon
        self.rngs = []

    def new_mechanism(self, rng, first=None):
        self.rngs.append(("open", first, rng))
        return Running(rng=rng)

    def restore(self, state, rng):
        self.rngs.append(("step", None, rng))
        return Running(state, rng)

    def release(self, mechanism, key, step, aggregate):
        mechanism.total += aggregate[0]
        yield (key, step, mechanism.total, aggregate[1])

    def ledger(self, key):
        return [f"ledger {key}"]


class Stream:
    """The state cells of one key, and the DoFn's entry points on them."""

    def __init__(self, dofn, key="k"):
        self.dofn, self.key = dofn, key
        self.buffer, self.mech = Bag(), Cell()
        self.next, self.first, self.earliest = Cell(), Cell(), Cell()
        self.timer = Timer()

    def send(self, step, aggregate):
        return list(self.dofn._process((self.key, (step, aggregate)), self.buffer, self.next,
                                       self.first, self.earliest, self.timer))

    def fire(self, at_seconds):
        return list(self.dofn._fire(self.key, Timestamp.of(at_seconds), self.buffer, self.mech,
                                    self.next, self.first, self.earliest, self.timer))


def _payload(tagged):
    value = tagged.value
    return getattr(value, "value", value)  # unwraps a TimestampedValue


def _split(outputs):
    releases, tagged = [], {ACCOUNTING: [], INVALID: []}
    for out in outputs:
        if isinstance(out, pvalue.TaggedOutput):
            tagged[out.tag].append(_payload(out))
        else:
            releases.append(out.value)
    return releases, tagged[ACCOUNTING], tagged[INVALID]


def test_bounded_release_covers_every_step_empty_ones_included():
    spec = RunningSpec()
    dofn = OrderedReleaseDoFn(spec, bounded=True, end_step=6, seed=0)
    s = Stream(dofn)
    assert s.send(2, StreamStart()) == []
    # The one firing of bounded input is at the end of the last step.
    assert s.timer.set_at == [60.0]
    for step, agg in ((0, (1.0, 1)), (3, (2.0, 2)), (5, (4.0, 1)), (3, (0.5, 1))):
        s.send(step, agg)
    releases, ledger, invalid = _split(s.fire(60))
    # Step 0 came before the stream opened at 2: its events join the first release.
    assert releases == [("k", 2, 1.0, 1), ("k", 3, 3.5, 3), ("k", 4, 3.5, 0), ("k", 5, 7.5, 1)]
    assert ledger == ["ledger k"] and invalid == []
    assert s.next.value == 6 and s.mech.value == 7.5
    assert s.buffer.items == []


def test_releases_are_stamped_at_their_step_end():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=True, end_step=2, seed=0)
    s = Stream(dofn)
    s.send(0, StreamStart())
    stamps = [out.timestamp for out in s.fire(20) if not isinstance(out, pvalue.TaggedOutput)]
    assert stamps == [Timestamp(micros=10_000_000), Timestamp(micros=20_000_000)]


def test_unbounded_release_follows_the_watermark_and_defers_late_aggregates():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0)
    s = Stream(dofn)
    s.send(0, StreamStart())
    s.send(0, (1.0, 1))
    s.send(1, (2.0, 1))
    releases, ledger, _ = _split(s.fire(20))  # the watermark passed the end of steps 0 and 1
    assert releases == [("k", 0, 1.0, 1), ("k", 1, 3.0, 1)]
    assert ledger == ["ledger k"]
    assert s.timer.set_at[-1] == 30.0
    # Step 0 is already released: its late aggregate is added to step 2.
    assert s.send(0, (5.0, 3)) == []
    assert s.buffer.items == [(2, (5.0, 3))]
    releases, ledger, invalid = _split(s.fire(30))
    assert releases == [("k", 2, 8.0, 3)] and ledger == [] and invalid == []


def test_late_aggregates_beyond_allowed_lateness_go_to_invalid():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, allowed_lateness=15)
    s = Stream(dofn)
    s.send(0, StreamStart())
    s.fire(40)  # steps 0..3 released
    # Step 2 ended 10 s before the end of step 3: within 15 s, deferred to step 4.
    assert s.send(2, (1.0, 1)) == []
    # Step 0 ended 30 s before: beyond the lateness, one dead letter for its 2 events.
    (out,) = s.send(0, (4.0, 2))
    assert out.tag == INVALID
    dead = _payload(out)
    assert isinstance(dead, InvalidElement)
    assert dead.count == 2 and dead.transform == "running"
    assert dead.reason == ("late beyond allowed_lateness (15 s): step 0 ended 30 s before "
                           "the end of the last released step 3")
    assert s.buffer.items == [(4, (1.0, 1))]


def test_late_drop_sends_every_late_aggregate_to_invalid_and_skips_empty_ones():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, late="drop")
    s = Stream(dofn)
    s.send(0, StreamStart())
    s.fire(20)
    (out,) = s.send(1, (1.0, 1))
    assert _payload(out).reason == "late: step 1 was already released"
    assert _payload(out).count == 1
    # An aggregate of no events is no dead letter.
    assert s.send(0, (0.0, 0)) == []
    assert s.buffer.items == []


def test_the_stream_closes_at_its_horizon_and_later_aggregates_are_invalid():
    spec = RunningSpec(horizon=3)
    dofn = OrderedReleaseDoFn(spec, bounded=False, seed=0)
    s = Stream(dofn)
    s.send(1, StreamStart())
    s.send(2, (1.0, 1))
    s.send(5, (2.0, 2))  # beyond steps 1..3
    releases, _, invalid = _split(s.fire(100))
    assert [r[1] for r in releases] == [1, 2, 3]
    assert s.next.value == CLOSED
    assert [(d.reason, d.count) for d in invalid] == [
        ("step 5 is beyond the horizon of 3 steps", 2)]
    (out,) = s.send(4, (1.0, 1))
    assert _payload(out).reason == "the stream is closed"
    assert _split(s.fire(200)) == ([], [], [])


def test_bounded_aggregates_after_the_last_step_are_invalid():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=True, end_step=2, seed=0)
    s = Stream(dofn)
    s.send(0, StreamStart())
    s.fire(20)
    (out,) = s.send(5, (1.0, 1))
    assert _payload(out).reason == "late: the stream ended at step 1"


def test_not_admitted_closes_a_stream_that_never_opened():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0)
    s = Stream(dofn)
    s.send(0, (1.0, 1))
    s.send(1, (2.0, 3))
    dead = [_payload(out) for out in s.send(1, NotAdmitted())]
    assert [(d.reason, d.count) for d in dead] == [(NOT_ADMITTED, 1), (NOT_ADMITTED, 3)]
    assert s.next.value == CLOSED and s.buffer.items == []
    (out,) = s.send(2, (1.0, 1))
    assert _payload(out).reason == NOT_ADMITTED


def test_argument_checks():
    with pytest.raises(ValueError, match="late must be"):
        OrderedReleaseDoFn(RunningSpec(), bounded=False, late="keep")
    with pytest.raises(ValueError, match="opens must be"):
        OrderedReleaseDoFn(RunningSpec(), bounded=False, opens="first")
    with pytest.raises(ValueError, match="end_step is required"):
        OrderedReleaseDoFn(RunningSpec(), bounded=True)


def test_int_seed_noise_depends_on_key_and_step_only():
    def draws(key, seed):
        dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=seed)
        return [dofn._rng(key, step).laplace(1.0, 1)[0] for step in (0, 1)]

    a = draws("k", 7)
    assert a == draws("k", 7)  # a fresh DoFn (another worker, a retry) draws the same
    assert a[0] != a[1]
    assert a != draws("other", 7) and a != draws("k", 8)


def test_keyed_noise_replays_per_step_and_separates_opening_draws():
    key = NoiseKey.from_bytes(bytes(range(32)))
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, noise_key=key)
    again = OrderedReleaseDoFn(RunningSpec(), bounded=False, noise_key=key)
    step = dofn._rng("k", 3).laplace(1.0, 2).tolist()
    assert step == again._rng("k", 3).laplace(1.0, 2).tolist()
    assert step != dofn._rng("k", 3, "open").laplace(1.0, 2).tolist()
    assert step != dofn._rng("k", 4).laplace(1.0, 2).tolist()
    assert all(math.isfinite(x) for x in step)


# --------------------------------------------------------------------------- the firing's steps

def _drain(generator):
    """The outputs of a step generator and the value it returns."""
    outputs = []
    while True:
        try:
            outputs.append(next(generator))
        except StopIteration as stop:
            return outputs, stop.value


def test_until_is_the_last_step_the_watermark_passed_capped_by_end_and_horizon():
    unbounded = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0)
    assert unbounded._until(Timestamp.of(39.999), first=0) == 2
    assert unbounded._until(Timestamp.of(40), first=0) == 3
    ending = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, end_step=2)
    assert ending._until(Timestamp.of(100), first=0) == 1
    bounded = OrderedReleaseDoFn(RunningSpec(), bounded=True, seed=0, end_step=9)
    assert bounded._until(Timestamp.of(0), first=0) == 8
    capped = OrderedReleaseDoFn(RunningSpec(horizon=3), bounded=True, seed=0, end_step=9)
    assert capped._until(Timestamp.of(0), first=4) == 6


def test_late_step_defers_into_the_next_step_or_yields_the_dead_letter():
    defer = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, allowed_lateness=15)
    assert _drain(defer._late_step("k", 2, (1.0, 1), 4)) == ([], 4)
    (out,), step = _drain(defer._late_step("k", 0, (1.0, 2), 4))
    assert step is None and _payload(out).count == 2
    drop = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, late="drop")
    (out,), step = _drain(drop._late_step("k", 3, (1.0, 1), 4))
    assert step is None
    assert _payload(out).element["released_through"] == 3
    assert _drain(drop._late_step("k", 3, (0.0, 0), 4)) == ([], None)


def test_closed_reason_tells_unadmitted_ended_and_closed_streams_apart():
    endless = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0)
    assert endless._closed_reason(Cell()) == NOT_ADMITTED
    assert endless._closed_reason(Cell(0)) == "the stream is closed"
    ending = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, end_step=5)
    assert ending._closed_reason(Cell(0)) == "late: the stream ended at step 4"


def test_a_stream_opening_on_data_opens_at_its_earliest_buffered_step():
    dofn = OrderedReleaseDoFn(RunningSpec(), bounded=False, seed=0, opens="data")
    s = Stream(dofn)
    assert _split(s.fire(100)) == ([], [], [])  # nothing buffered: it stays unopened
    assert s.first.value is None and s.next.value is None
    s.send(3, (1.0, 1))
    s.send(2, (2.0, 1))
    s.send(4, (4.0, 1))
    assert s.earliest.value == 2 and s.timer.set_at == [40.0, 30.0]
    releases, ledger, _ = _split(s.fire(40))
    assert releases == [("k", 2, 2.0, 1), ("k", 3, 3.0, 1)]
    assert ledger == ["ledger k"]
    assert s.first.value == 2 and s.earliest.value is None
    assert s.next.value == 4 and s.buffer.items == [(4, (4.0, 1))]
    assert s.timer.set_at[-1] == 50.0


class _Together(list):
    """Mechanisms stepped together by LockstepRunningSpec (nothing to write back)."""

    def write_back(self):
        self.written = True


class LockstepRunningSpec(RunningSpec):
    """RunningSpec whose streams can step together; it records each joint step."""

    def __init__(self, horizon=None):
        super().__init__(horizon)
        self.joint = []
        self.together = []

    def lockstep(self, mechanisms):
        self.together.append(_Together(mechanisms))
        return self.together[-1]

    def release_lockstep(self, lockstep, keys, step, aggregates, sources):
        self.joint.append((tuple(keys), step))
        out = []
        for mechanism, key, aggregate, source in zip(lockstep, keys, aggregates, sources):
            mechanism.rng = source
            out.extend(self.release(mechanism, key, step, aggregate))
        return out


def _shard(dofn):
    """Streams a, b open at step 0, c, d at step 2 (each with data and a step past the
    horizon); e, f were released through step 2 before, so they are restored, and g alone
    opens at step 1."""
    streams = {key: Stream(dofn, key) for key in "abcdefg"}
    for key, first in (("a", 0), ("b", 0), ("c", 2), ("d", 2), ("e", 0), ("f", 0), ("g", 1)):
        streams[key].send(first, StreamStart())
    for key, s in streams.items():
        s.send(3, (float(ord(key)), 1))
        s.send(9, (1.0, 1))                       # beyond the horizon of 6 steps from c, d
    for key, total in (("e", 10.0), ("f", 20.0)):
        streams[key].next.value, streams[key].mech.value = 3, total
    return streams


def test_streams_releasing_the_same_steps_are_stepped_together_with_their_own_records():
    """_fire_start + _fire_together on a shard's streams give each stream the records, ledger,
    dead letters and cells of its own _fire; the streams opened by the firing that release
    the same steps (a, b from 0, c, d from 2) are stepped together at each step, with each
    stream's own source; a lone stream (g) and the restored ones (e, f) step on their own."""
    def run(together):
        spec = LockstepRunningSpec(horizon=6)
        dofn = OrderedReleaseDoFn(spec, bounded=True, seed=3, end_step=8)
        streams = _shard(dofn)
        out = []
        if together:
            firings = []
            for s in streams.values():
                gen = dofn._fire_start(s.key, Timestamp.of(80), s.buffer, s.mech, s.next, s.first,
                                       s.earliest, s.timer)
                while True:
                    try:
                        out.append(next(gen))
                    except StopIteration as stop:
                        firings.append(stop.value)
                        break
            out += list(dofn._fire_together(firings))
        else:
            for s in streams.values():
                out += s.fire(80)
        cells = {k: (s.buffer.items, s.mech.value, s.next.value) for k, s in streams.items()}
        releases, ledger, invalid = _split(out)
        return spec, (sorted(releases), sorted(ledger), sorted((i.reason, i.count) for i in invalid),
                      cells)

    alone, expected = run(False)
    spec, got = run(True)
    assert got == expected
    assert expected[0][:2] == [("a", 0, 0.0, 0), ("a", 1, 0.0, 0)] and expected[2]
    assert not alone.joint
    assert spec.joint == [(("a", "b"), s) for s in range(6)] + [(("c", "d"), s) for s in range(2, 8)]
    assert all(t.written for t in spec.together)
    # Each stream drew from its own source at each step: the last one is its own last step's.
    assert len({m.rng for t in spec.together for m in t}) == 4
