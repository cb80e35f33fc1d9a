"""The ordered release (release.py) driven directly, on in-memory stand-ins for its state cells:
the per-key append-only log, the release of every step on the public schedule, late aggregates,
closing at the horizon, noise identities of stream keys."""

import math

import pytest
from apache_beam import pvalue
from apache_beam.utils.timestamp import Timestamp

from dp_beam.mechanisms.noise_key import NoiseKey
from dp_beam.records import InvalidElement
from dp_beam.transforms.events import INVALID
from dp_beam.transforms.release import (ACCOUNTING, CLOSED, NOT_ADMITTED, BagLog,
                                        OrderedReleaseDoFn, ReleaseSpec, key_label)
from dp_beam.transforms.schedule import NotAdmitted, StreamStart


class Cell:
    """A ``ReadModifyWriteState`` stand-in that counts writes."""

    def __init__(self, value=None):
        self.value = value
        self.writes = 0

    def read(self):
        return self.value

    def write(self, value):
        self.value = value
        self.writes += 1

    def clear(self):
        self.value = None


class Bag:
    """A ``BagState`` stand-in that counts reads and clears."""

    def __init__(self):
        self.items = []
        self.reads = 0
        self.clears = 0

    def read(self):
        self.reads += 1
        return list(self.items)

    def add(self, value):
        self.items.append(value)

    def clear(self):
        self.items = []
        self.clears += 1


class Timer:
    def __init__(self):
        self.set_at = []

    def set(self, ts):
        self.set_at.append(float(ts))


class Counter:
    def __init__(self):
        self.n = 0

    def inc(self, n=1):
        self.n += n


# --------------------------------------------------------------------------- BagLog

def test_bag_log_reads_pending_entries_without_reading_the_bag():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2, 3):
        log.append(i, f"b{i}")
    assert log.read(0, 3) == ["b1", "b2", "b3"]
    assert bag.reads == 0 and log.bag_reads == 0
    log.flush()
    assert bag.items == [(1, "b1"), (2, "b2"), (3, "b3")]
    assert log.stored == 3
    assert meta.value == (3, 1, None)


def test_bag_log_reads_older_entries_once_per_firing_and_counts_them():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2, 3):
        log.append(i, i * 10)
    log.flush()
    reads = Counter()
    log = BagLog(bag, meta, reads=reads)
    log.append(4, 40)
    assert log.read(1, 4) == [20, 30, 40]
    assert log.read(0, 2) == [10, 20]
    assert bag.reads == 1 and log.bag_reads == 1
    assert reads.n == 3


def test_bag_log_compacts_once_released_entries_reach_the_live_ones():
    bag, meta = Bag(), Cell()
    compactions = Counter()
    log = BagLog(bag, meta, compactions=compactions)
    for i in range(1, 5):
        log.append(i, i)
    log.flush()
    # Releasing 1 of 4 leaves 1 released < 3 live: nothing is rewritten.
    log = BagLog(bag, meta, compactions=compactions)
    log.release_before(2)
    log.append(5, 5)
    log.flush()
    assert [i for i, _ in bag.items] == [1, 2, 3, 4, 5]
    assert bag.clears == 0 and compactions.n == 0
    # Released 1..3 (3) >= live 4..6 (3): the bag is rewritten with the live entries only.
    log = BagLog(bag, meta, compactions=compactions)
    log.release_before(4)
    log.append(6, 6)
    log.flush()
    assert bag.items == [(4, 4), (5, 5), (6, 6)]
    assert bag.clears == 1 and compactions.n == 1
    assert meta.value == (3, 4, 4)


def test_bag_log_clears_without_reading_when_everything_is_released():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in (1, 2):
        log.append(i, i)
    log.flush()
    log = BagLog(bag, meta)
    log.release_before(3)
    log.flush()
    assert bag.items == [] and bag.reads == 0 and bag.clears == 1
    assert log.stored == 0


def test_bag_log_refuses_released_entries_and_keeps_the_release_bound_monotone():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    for i in range(1, 5):
        log.append(i, i)
    log.release_before(3)
    log.release_before(2)  # a lower bound never lowers it
    log.flush()
    assert meta.value[2] == 3
    log = BagLog(bag, meta)
    with pytest.raises(KeyError, match="log entry 1"):
        log.read(0, 1)
    assert log.read(2, 4) == [3, 4]


def test_bag_log_writes_meta_only_when_it_changes():
    bag, meta = Bag(), Cell()
    log = BagLog(bag, meta)
    log.append(1, "x")
    log.flush()
    assert meta.writes == 1
    BagLog(bag, meta).flush()  # a firing that appends and releases nothing
    assert meta.writes == 1


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


@pytest.mark.parametrize("key", ["a", 3, 2.5, b"x", None, ("a", 1), ("a", (None, b"y"))])
def test_key_label_keeps_keys_with_a_canonical_encoding(key):
    assert key_label(key) == key


def test_key_label_names_other_keys_by_type_and_repr():
    class Opaque:
        def __repr__(self):
            return "Opaque()"

    label = key_label(Opaque())
    assert label == ("repr", __name__, "test_key_label_names_other_keys_by_type_and_repr"
                     ".<locals>.Opaque", "Opaque()")
    assert key_label(frozenset([1])) == ("repr", "builtins", "frozenset", "frozenset({1})")
