"""The sharded release gives the per-key release's records, bit for bit, on batch and streaming input."""

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import pvalue
from apache_beam.portability import common_urns
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.testing import test_stream
from apache_beam.utils.timestamp import Timestamp

import dp_beam as dpb
from dp_beam.transforms.release import OrderedReleaseDoFn
from dp_beam.transforms.schedule import StreamStart
from dp_beam.transforms.streams import release_shards
from dp_beam.transforms.shards import (KEYS_PER_SHARD, ShardedReleaseDoFn, _Column, default_shards,
                                       shard_of)
from tests.beam_util import batch_options, collect, streaming_options
from tests.fake_state import Bag, Cell, Timer

HOUR = 3600.0
KEY = dpb.NoiseKey.from_bytes(bytes(range(32)))


def _events(keys, steps):
    # Uneven traffic (key k has k % 3 events per step), one undeclared key and
    # one event outside the schedule, so invalid records are compared too.
    out = [(f"k{k}", s * HOUR + 60.0 * j, float(j + k % 5)) for k in range(keys) for s in range(steps)
           for j in range(k % 3)]
    return out + [("stranger", 10.0, 1.0), ("k1", steps * HOUR + 5.0, 1.0)]


def _stamp(e):
    return beam.window.TimestampedValue(e, e[1])


def _records(out):
    releases = sorted((r.key, r.step, r.value, r.noise_std, r.ci95) for r in out["releases"])
    ledger = sorted(repr(e) for e in out["accounting"])
    invalid = sorted((i.reason, i.count, i.id) for i in out["invalid"])
    return releases, ledger, invalid


def _run_batch(make, keys, steps, shards, windowed=False):
    events = _events(keys, steps)

    def build(p):
        stamped = p | beam.Create(events) | beam.Map(_stamp)
        if windowed:
            stamped = stamped | beam.WindowInto(beam.window.FixedWindows(HOUR))
        res = stamped | make(shards)
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

    return _records(collect(batch_options(), build))


def _count(keys, steps, **noise):
    return lambda shards: dpb.ContinualCount(
        epsilon=1.0, step=HOUR, start=0, end=steps * HOUR, key_fn=lambda e: e[0],
        keys=[f"k{k}" for k in range(keys)], noise_key=KEY, shards=shards, **noise)


def _sum(keys, steps):
    return lambda shards: dpb.ContinualSum(
        value_fn=lambda e: e[2], lower=0.0, upper=4.0, epsilon=1.0, step=HOUR, start=0,
        end=steps * HOUR, key_fn=lambda e: e[0], keys=[f"k{k}" for k in range(keys)], noise_key=KEY,
        shards=shards)


def _gaussian_count(keys, steps):
    # Gaussian noise: BLT, whose scalar streams step on Python numbers between states.
    return _count(keys, steps, noise="gaussian", delta=1e-6)


@pytest.mark.parametrize("make", [_count, _sum, _gaussian_count], ids=["count", "sum", "blt"])
def test_batch_sharded_release_equals_per_key_release(make):
    keys, steps = 12, 9
    per_key = _run_batch(make(keys, steps), keys, steps, 0)
    assert len(per_key[0]) == keys * steps and per_key[2]      # every step; invalid records too
    assert _run_batch(make(keys, steps), keys, steps, 3) == per_key
    assert _run_batch(make(keys, steps), keys, steps, 1) == per_key


def _full_records(make, keys, steps, shards):
    """Every field of every record (releases, ledger, invalid) of a batch run."""
    events = _events(keys, steps)

    def build(p):
        res = p | beam.Create(events) | beam.Map(_stamp) | make(shards)
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

    out = collect(batch_options(), build)
    return {name: sorted(repr(tuple(r)) if isinstance(r, tuple) else repr(r) for r in records)
            for name, records in out.items()}


@pytest.mark.parametrize("options,together", [
    (dict(), "LockstepTrees"), (dict(rng=5, noise_key=None), "LockstepTrees"),
    (dict(sum=True), "LockstepTrees"), (dict(noise="gaussian", delta=1e-6), "LockstepBLT"),
    (dict(mechanism="honaker"), "LockstepStreams"), (dict(monotone=True), None)],
    ids=["keyed", "int-seed", "sum", "blt", "honaker", "monotone"])
def test_batch_shard_steps_its_streams_together(monkeypatch, options, together):
    """On bounded input a shard's streams release the same steps, so they are stepped
    together: tree streams as one array (LockstepTrees), BLT streams with their float
    post-processing as one array (LockstepBLT), other counters each by its own mechanism
    in one call per step (LockstepStreams). Every field of every record is the
    per-key release's, with the keyed source and with a test seed. A monotone release
    wraps its mechanism and steps each stream on its own, with the same records."""
    from dp_beam.mechanisms import counting

    options = dict(options)
    keys, steps = 10, 6
    if options.pop("sum", False):
        def make(shards):
            return dpb.ContinualSum(
                value_fn=lambda e: e[2], lower=0.0, upper=4.0, epsilon=1.0, step=HOUR, start=0,
                end=steps * HOUR, key_fn=lambda e: e[0], keys=[f"k{k}" for k in range(keys)],
                noise_key=KEY, shards=shards)
    else:
        def make(shards):
            return dpb.ContinualCount(
                epsilon=1.0, step=HOUR, start=0, end=steps * HOUR, key_fn=lambda e: e[0],
                keys=[f"k{k}" for k in range(keys)], shards=shards, **{"noise_key": KEY, **options})
    calls = []
    for name in ("LockstepTrees", "LockstepBLT", "LockstepStreams"):
        cls = getattr(counting, name)
        monkeypatch.setattr(cls, "step", lambda self, x, sources, name=name, step=cls.step:
                            calls.append((name, len(x))) or step(self, x, sources))
    per_key = _full_records(make, keys, steps, 0)
    assert not calls                      # one stream per key: nothing to step together
    sharded = _full_records(make, keys, steps, 2)
    assert sharded == per_key
    assert len(per_key["releases"]) == keys * steps and per_key["invalid"]
    if together:
        # Two shards, each with several of the 10 keys (their public hash splits them 3 + 7):
        # at every step each shard stepped all its streams together.
        assert {name for name, _ in calls} == {together}
        assert len(calls) == 2 * steps and sum(n for _, n in calls) == keys * steps
    else:
        assert not calls


def _mean_lockstep_calls(monkeypatch):
    """The number of streams of every ``MeanLockstep.step`` call from now on."""
    from dp_beam.mechanisms.continual_mean import MeanLockstep

    calls = []
    monkeypatch.setattr(MeanLockstep, "step", lambda self, aggs, sources, step=MeanLockstep.step:
                        calls.append(len(aggs)) or step(self, aggs, sources))
    return calls


@pytest.mark.parametrize("preset", ["tuned", "paper"])
def test_batch_sharded_mean_equals_per_key_mean(preset, monkeypatch):
    # The paper preset keeps its medians' samples in a per-stream log.
    calls = _mean_lockstep_calls(monkeypatch)
    keys, steps = 6, 6
    events = [(f"k{k}", s * HOUR + 60.0 * j, float((k + j) % 7), f"u{j}") for k in range(keys)
              for s in range(steps) for j in range(3)]

    def run(shards):
        def build(p):
            res = (p | beam.Create(events) | beam.Map(_stamp)
                   | dpb.ContinualMean(user_fn=lambda e: e[3], value_fn=lambda e: e[2], lower=0.0,
                                       upper=6.0, max_samples_per_user=4, epsilon=1.0, step=HOUR,
                                       start=0, end=steps * HOUR, key_fn=lambda e: e[0],
                                       keys=[f"k{k}" for k in range(keys)], max_users=100,
                                       noise_key=KEY, shards=shards, preset=preset))
            return {"releases": res.releases, "accounting": res.accounting}

        out = collect(batch_options(), build)
        return (sorted(repr(r) for r in out["releases"]), sorted(repr(e) for e in out["accounting"]))

    per_key = run(0)
    assert len(per_key[0]) == keys * steps and not calls
    assert run(2) == per_key
    if preset == "tuned":
        # Each shard stepped its streams together at every step.
        assert len(calls) == 2 * steps and sum(calls) == keys * steps
    else:
        # Streams whose medians read a log step one by one.
        assert not calls


@pytest.mark.parametrize("cls, extra", [(dpb.ContinualERM, {"base_size": 16}),
                                        (dpb.SlidingWindowERM, {"window": 12}),
                                        (dpb.MultiResolutionERM, {"max_scale": 4})],
                         ids=["continual", "sliding", "multi-resolution"])
@pytest.mark.parametrize("packed", [False, True], ids=["lists", "packed"])
def test_batch_sharded_erm_equals_per_key_erm(cls, extra, packed, monkeypatch):
    # ERM streams keep their blocks in a per-stream log; sharded, it lives in memory.
    # "packed": every step's points leave their bundle as a PointBatch (wide points do).
    from dp_beam.transforms import erm_points
    if packed:
        monkeypatch.setattr(erm_points, "PACK_MIN_VALUES", 1)
    keys, steps = 7, 10
    events = _events(keys, steps)

    def run(shards):
        def build(p):
            res = (p | beam.Create(events) | beam.Map(_stamp)
                   | cls(features_fn=lambda e: [e[2] / 5.0, (e[1] % 7) / 7.0],
                         label_fn=lambda e: int(e[2]) % 2, classes=(0, 1), n_features=2,
                         feature_bound=1.0, lam=0.1, block_size=4, epsilon=1.0, step=HOUR,
                         start=0, end=steps * HOUR, key_fn=lambda e: e[0],
                         keys=[f"k{k}" for k in range(keys)], noise_key=KEY, shards=shards,
                         **extra))
            return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

        out = collect(batch_options(), build)
        return tuple(sorted(repr(r) for r in out[name]) for name in ("releases", "accounting", "invalid"))

    per_key = run(0)
    assert per_key[0] and len(per_key[1]) == keys and per_key[2]
    assert run(3) == per_key


@pytest.mark.parametrize("selection", [False, True], ids=["declared", "private-keys"])
def test_batch_sharded_user_level_count_equals_per_key_count(selection):
    # Users spread over keys with more events than the cap, so caps bind (dead letters).
    keys, steps = 4, 5
    events = [(f"k{(u + j) % keys}", s * HOUR + 60.0 * j, 1.0, f"u{u}")
              for u in range(80) for s in range(steps) for j in range(u % 4)]
    declared = (dpb.PrivateKeys(epsilon=5.0, delta=0.5, max_keys_per_unit=2)
                if selection else [f"k{k}" for k in range(keys)])

    def run(shards):
        def build(p):
            res = (p | beam.Create(events) | beam.Map(_stamp)
                   | dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=steps * HOUR,
                                        key_fn=lambda e: e[0], keys=declared, noise_key=KEY,
                                        privacy_unit="user", user_fn=lambda e: e[3],
                                        max_contributions=5, shards=shards))
            return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

        out = collect(batch_options(), build)
        return tuple(sorted(repr(r) for r in out[name]) for name in ("releases", "accounting", "invalid"))

    per_key = run(0)
    assert per_key[0] and any("max_contributions (5)" in r for r in per_key[2])
    assert run(2) == per_key


def _erm_records(events, steps, shards, declared, features_fn):
    """Sorted reprs of the (releases, ledger, invalid) of a ``ContinualERM`` (blocks of 4, base
    8) over ``events``; ``declared``: its keys, or a function of the pipeline that makes them."""
    def build(p):
        keys = declared(p) if callable(declared) else declared
        res = (p | beam.Create(events) | beam.Map(_stamp)
               | dpb.ContinualERM(features_fn=features_fn, label_fn=lambda e: int(e[2]) % 2,
                                  classes=(0, 1), n_features=2, feature_bound=1.0, lam=0.1,
                                  block_size=4, base_size=8, epsilon=1.0, step=HOUR, start=0,
                                  end=steps * HOUR, key_fn=lambda e: e[0], keys=keys,
                                  noise_key=KEY, shards=shards))
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

    out = collect(batch_options(), build)
    return tuple(sorted(repr(r) for r in out[name]) for name in ("releases", "accounting", "invalid"))


def test_batch_sharded_erm_with_keys_from_a_pcollection_equals_per_key_erm():
    # Keys known only at run time: their stream markers are routed to the shards in the
    # pipeline, beside the bundles' lists of points (a declared key without events too).
    keys, steps = 5, 6
    events = _events(keys, steps)

    def run(shards):
        return _erm_records(
            events, steps, shards,
            lambda p: p | "keys" >> beam.Create([f"k{k}" for k in range(keys + 1)]),
            lambda e: [e[2] / 8.0, 0.5])

    per_key = run(0)
    assert per_key[0] and len(per_key[1]) == keys + 1 and per_key[2]
    assert run(2) == per_key


@pytest.mark.parametrize("with_points", [True, False], ids=["one-key", "no-events"])
def test_batch_sharded_erm_releases_the_shards_that_no_point_reached(with_points):
    """ERM's sharded release groups the points alone and reads the stream markers as a side
    input; the shards that no point reached are released from their markers by a second
    ParDo. Every declared key still has its ledger entry, and the records are the per-key
    path's: with points for one key only (three shards without any), and with none at all."""
    keys, steps, shards = 8, 6, 4
    declared = [f"k{k}" for k in range(keys)]
    assert len({shard_of(k, shards) for k in declared}) == shards
    events = [("k1", s * HOUR + 60.0 * j, float(j)) for s in range(steps) for j in range(3)]
    events = events if with_points else []

    def run(n):
        return _erm_records(events, steps, n, declared, lambda e: [e[2] / 5.0, 0.5])

    per_key = run(0)
    assert bool(per_key[0]) == with_points and len(per_key[1]) == keys
    assert run(shards) == per_key


@pytest.mark.parametrize("pack_from", [None, 1, 4], ids=["lists", "packed", "mixed"])
def test_batch_sharded_erm_merges_a_steps_points_from_many_partial_lists(pack_from, monkeypatch):
    """Bounded input: each bundle sends a step's points on in lists (at most MAX_BUNDLE_POINTS
    at a time, here 2), which the release merges. Ties in event time, identical points among
    them, must still reach the stream in the per-key path's order (production tie-breakers).
    ``pack_from``: PACK_MIN_VALUES, the partials packed (all, or those of two points)."""
    from dp_beam.transforms import erm_points
    monkeypatch.setattr(erm_points, "MAX_BUNDLE_POINTS", 2)
    if pack_from is not None:
        monkeypatch.setattr(erm_points, "PACK_MIN_VALUES", pack_from)
    keys, steps = 3, 8
    # Per key and step: two identical points and a third, all at the same time, and one later.
    events = [(f"k{k}", s * HOUR + 60.0, float(v)) for k in range(keys) for s in range(steps)
              for v in (k, k, k + 1)]
    events += [(f"k{k}", s * HOUR + 90.0, float(s % 3)) for k in range(keys) for s in range(steps)]

    def run(shards):
        def build(p):
            res = (p | beam.Create(events) | beam.Map(_stamp)
                   | dpb.ContinualERM(features_fn=lambda e: [e[2] / 5.0, 0.5],
                                      label_fn=lambda e: int(e[2]) % 2, classes=(0, 1),
                                      n_features=2, feature_bound=1.0, lam=0.1, block_size=4,
                                      base_size=8, epsilon=1.0, step=HOUR, start=0,
                                      end=steps * HOUR, key_fn=lambda e: e[0],
                                      keys=[f"k{k}" for k in range(keys)], noise_key=KEY,
                                      shards=shards))
            return {"releases": res.releases}

        return sorted(repr(r) for r in collect(batch_options(), build)["releases"])

    per_key = run(0)
    assert per_key
    assert run(1) == per_key and run(2) == per_key


@pytest.mark.parametrize("noise", [{}, dict(noise="gaussian", delta=1e-6)], ids=["tree", "blt"])
def test_streaming_sharded_release_equals_per_key_release_with_late_data(noise):
    """TestStream: the watermark passes steps in jumps, one event is late (deferred)
    and one is dropped: the shard's single timer reproduces every stream's firings (its
    streams held as arrays between firings, through the runner's state coder)."""
    keys, steps = 5, 6

    def stream():
        s = test_stream.TestStream()
        s.advance_watermark_to(0)
        s.add_elements([beam.window.TimestampedValue(("k0", 10.0, 1.0), 10.0),
                        beam.window.TimestampedValue(("k3", 20.0, 1.0), 20.0)])
        s.advance_watermark_to(2 * HOUR + 1)
        s.add_elements([beam.window.TimestampedValue(("k1", 2 * HOUR + 30.0, 1.0), 2 * HOUR + 30.0),
                        beam.window.TimestampedValue(("k2", 100.0, 1.0), 100.0)])   # late: step 0
        s.advance_watermark_to(5 * HOUR + 1)
        s.add_elements([beam.window.TimestampedValue(("k4", 5 * HOUR + 9.0, 1.0), 5 * HOUR + 9.0)])
        s.advance_watermark_to_infinity()
        return s

    def run(shards, late):
        def build(p):
            res = (p | stream()
                   | dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=steps * HOUR,
                                        key_fn=lambda e: e[0], timestamp_fn=lambda e: e[1],
                                        keys=[f"k{k}" for k in range(keys)], noise_key=KEY,
                                        late=late, shards=shards, **noise))
            return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

        return _records(collect(streaming_options(), build))

    for late in ("defer", "drop"):
        per_key = run(0, late)
        assert len(per_key[0]) == keys * steps
        assert run(2, late) == per_key


def test_streaming_sharded_mean_equals_per_key_mean(monkeypatch):
    """TestStream: a shard's mean streams opened by one firing step together (the shard
    holds no array form for them, so each keeps its own state between firings); the
    records, ledger and dead letters are the per-key path's."""
    calls = _mean_lockstep_calls(monkeypatch)
    keys, steps = 5, 6

    def event(key, seconds, value, user):
        return beam.window.TimestampedValue((key, seconds, value, user), seconds)

    def stream():
        s = test_stream.TestStream()
        s.advance_watermark_to(0)
        s.add_elements([event(f"k{k}", 10.0 + k, float(k % 3), f"u{k}") for k in range(keys)])
        s.advance_watermark_to(2 * HOUR + 1)
        s.add_elements([event("k1", 2 * HOUR + 30.0, 2.0, "u9"),
                        event("k2", 100.0, 1.0, "u2")])                           # late: step 0
        s.advance_watermark_to(5 * HOUR + 1)
        s.add_elements([event("k4", 5 * HOUR + 9.0, 3.0, "u4")])
        s.advance_watermark_to_infinity()
        return s

    def run(shards):
        def build(p):
            res = (p | stream()
                   | dpb.ContinualMean(user_fn=lambda e: e[3], value_fn=lambda e: e[2], lower=0.0,
                                       upper=4.0, max_samples_per_user=4, epsilon=1.0, step=HOUR,
                                       start=0, end=steps * HOUR, key_fn=lambda e: e[0],
                                       keys=[f"k{k}" for k in range(keys)], max_users=10,
                                       noise_key=KEY, shards=shards))
            return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

        return _records(collect(streaming_options(), build))

    per_key = run(0)
    assert len(per_key[0]) == keys * steps and not calls
    assert run(2) == per_key
    # Each shard's first firing opened its streams and stepped them together.
    assert sorted(calls) == [2, 3]            # the public hash splits the 5 keys 2 + 3


def test_shards_validation_and_default():
    with pytest.raises(ValueError, match="shards"):
        dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=HOUR, shards=-1)
    with pytest.raises(ValueError, match="shards"):
        dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=HOUR, shards=True)

    def count(keys=None, **kw):
        key_fn = None if keys is None else (lambda e: e)
        return dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=HOUR, key_fn=key_fn,
                                  keys=keys, **kw)

    p = beam.Pipeline(options=batch_options())
    bounded = p | beam.Create([1])
    unbounded = p | test_stream.TestStream()
    assert bounded.is_bounded and not unbounded.is_bounded
    many, few = count(list(range(10 * KEYS_PER_SHARD))), count(list(range(3)))
    single, private = count(), count(dpb.PrivateKeys(epsilon=1.0, delta=1e-6))
    from_data = count(p | "Keys" >> beam.Create(["a"]))
    # (bounded, unbounded): one shard per 64 declared keys; below that one shard for bounded
    # input (no timers) and a stateful key per stream for unbounded input; a key set not
    # known up front keeps the per-key path.
    expected = {many: (10, 10), few: (1, 0), single: (1, 0), private: (0, 0), from_data: (0, 0)}
    for transform, shards in expected.items():
        assert transform._shards is None
        assert (release_shards(transform, bounded), release_shards(transform, unbounded)) == shards
    assert default_shards(10 * KEYS_PER_SHARD) == 10 and default_shards(3, bounded=True) == 1
    # An explicit choice is kept whatever the input.
    for shards in (0, 2):
        explicit = count(list(range(3)), shards=shards)
        assert release_shards(explicit, bounded) == release_shards(explicit, unbounded) == shards


def test_bounded_default_releases_a_single_stream_without_timers():
    """The default for bounded input without keys is the one-shard release (no state or
    timers): the same records as the per-key path, and no stateful release in the graph."""
    steps = 6
    events = [(None, s * HOUR + 30.0 * j, 1.0) for s in range(steps) for j in range(s % 3)]
    events.append((None, steps * HOUR + 1.0, 1.0))           # after the end: a dead letter

    def run(shards, graph=None):
        def build(p):
            res = (p | beam.Create(events) | beam.Map(_stamp)
                   | dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=steps * HOUR,
                                        noise_key=KEY, shards=shards))
            if graph is not None:
                graph.append(p)
            return {"releases": res.releases, "accounting": res.accounting,
                    "invalid": res.invalid}
        return _records(collect(batch_options(), build))

    graph, per_key_graph = [], []
    default = run(None, graph)
    assert len(default[0]) == steps and default[2]
    assert default == run(0, per_key_graph)
    transforms = graph[0].to_runner_api().components.transforms.values()
    assert any(t.unique_name.endswith("/GroupShard") for t in transforms)
    pardos = _pardos(graph[0])
    assert pardos and not any(p.state_specs or p.timer_family_specs for p in pardos)
    # The per-key path, for contrast, has a stateful release.
    assert any(p.state_specs for p in _pardos(per_key_graph[0]))


def _pardos(pipeline):
    """The ParDo payloads of ``pipeline``'s runner API graph (their state and timer specs)."""
    return [beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            for t in pipeline.to_runner_api().components.transforms.values()
            if t.spec.urn == common_urns.primitives.PAR_DO.urn]


def test_shard_of_is_stable_and_spreads_keys():
    counts = [0] * 8
    for k in range(4000):
        counts[shard_of(f"k{k}", 8)] += 1
    # 4000 keys in 8 shards: each count is Binomial(4000, 1/8), sd ≈ 20.9; 5 sd.
    assert all(abs(c - 500) < 5 * 20.9 for c in counts)
    assert shard_of(("a", 1), 5) == shard_of(("a", 1), 5)


def test_batch_sharded_release_with_private_keys_equals_per_key_release():
    """Privately selected keys: admissions, the not-admitted markers and the dead letters of
    keys never admitted pass through the timer-free shard release unchanged."""
    step, steps = 10.0, 10
    events = [{"ts": s * step + 1.0 + i / 100, "k": "busy", "u": f"b{s}-{i}"}
              for s in (1, 2, 3) for i in range(10)]
    events += [{"ts": 15.0, "k": "rare", "u": "r"}, {"ts": 55.0, "k": "other", "u": "o"}]

    def run(shards):
        def build(p):
            res = (p | beam.Create(events)
                   | dpb.ContinualCount(epsilon=1.0, step=step, start=0, end=steps * step,
                                        key_fn=lambda e: e["k"], timestamp_fn=lambda e: e["ts"],
                                        keys=dpb.PrivateKeys(epsilon=5.0, delta=0.5),
                                        noise_key=KEY, shards=shards))
            return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}

        out = collect(batch_options(), build)
        return (sorted(repr(r) for r in out["releases"]), sorted(repr(e) for e in out["accounting"]),
                sorted((i.reason, i.count, i.id) for i in out["invalid"]))

    per_key = run(0)
    assert any("busy" in r for r in per_key[0]) and per_key[2]   # an admission; dead letters
    assert run(2) == per_key


def test_timer_free_release_refuses_unbounded_input_and_stray_combine():
    from dp_beam.transforms.continual import CounterReleaseSpec, _SumCount
    from dp_beam.transforms.release import OrderedReleaseDoFn
    from dp_beam.transforms.streams import release_in_order
    from dp_beam.transforms.schedule import resolve_schedule
    from dp_beam.transforms.shards import BatchShardReleaseDoFn

    count = dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=4 * HOUR)
    spec = CounterReleaseSpec("c", HOUR, count._mechanism, count._config,
                              count.plan_entry("c"))
    with pytest.raises(ValueError, match="bounded"):
        BatchShardReleaseDoFn(OrderedReleaseDoFn(spec, bounded=False, end_step=4))
    with pytest.raises(ValueError, match="combine_fn"):
        release_in_order(None, spec, (), (), schedule=resolve_schedule(HOUR, 0, 4 * HOUR, None),
                         seeds=None, bounded=True, late="defer", seed=None, shards=0,
                         combine_fn=_SumCount())
    with pytest.raises(ValueError, match="markers_aside needs routed_seeds"):
        release_in_order(None, spec, (), (), schedule=resolve_schedule(HOUR, 0, 4 * HOUR, None),
                         seeds=None, bounded=True, late="defer", seed=None, shards=2,
                         combine_fn=_SumCount(), markers_aside=True)


def test_a_spec_with_a_log_needs_the_logged_release_and_bounded_input_to_shard():
    from dp_beam.transforms.continual import CounterReleaseSpec
    from dp_beam.transforms.release import LoggedReleaseDoFn, OrderedReleaseDoFn
    from dp_beam.transforms.shards import BatchShardReleaseDoFn, ShardedReleaseDoFn

    count = dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=4 * HOUR)
    spec = CounterReleaseSpec("c", HOUR, count._mechanism, count._config, count.plan_entry("c"))
    spec.uses_log = True
    with pytest.raises(ValueError, match="LoggedReleaseDoFn"):
        BatchShardReleaseDoFn(OrderedReleaseDoFn(spec, bounded=True, end_step=4))
    BatchShardReleaseDoFn(LoggedReleaseDoFn(spec, bounded=True, end_step=4))
    # Streaming, a shard's one cell would rewrite every stream's log at every firing.
    with pytest.raises(ValueError, match="without a log"):
        ShardedReleaseDoFn(LoggedReleaseDoFn(spec, bounded=False, end_step=4))


def test_batch_shard_release_merges_partial_totals_like_the_upstream_combine():
    """The engine of the timer-free path without a pipeline: partial totals of one shard
    (here one per event, as from bundles of one event each), in any order, give the
    releases of the per-(key, step) aggregates fed in the per-key order."""
    from dp_beam.transforms.continual import CounterReleaseSpec, _SumCount
    from dp_beam.transforms.release import OrderedReleaseDoFn
    from dp_beam.transforms.schedule import StreamStart
    from dp_beam.transforms.shards import BatchShardReleaseDoFn

    count = dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, end=4 * HOUR)
    spec = CounterReleaseSpec("c", HOUR, count._mechanism, count._config,
                              count.plan_entry("c"))

    def release(elements, combine_fn):
        dofn = BatchShardReleaseDoFn(OrderedReleaseDoFn(spec, bounded=True, end_step=4,
                                                        noise_key=KEY), combine_fn)
        dofn.setup()
        out = list(dofn.process((0, elements)))
        return sorted((r.value.key, r.value.step, r.value.value) for r in out
                      if hasattr(r, "value") and hasattr(r.value, "step"))

    one = _SumCount().add_input(_SumCount().create_accumulator(), 1.0)
    raw = [[("b", 2, one), ("a", 0, one)], [("a", 0, one)], [("b", 0, StreamStart())],
           [("a", 0, StreamStart())], [("a", 3, one)]]
    combined = [("a", (0, StreamStart())), ("b", (0, StreamStart())), ("a", (0, (2.0, 2))),
                ("a", (3, (1.0, 1))), ("b", (2, (1.0, 1)))]
    got = release(raw, _SumCount())
    assert len(got) == 8 and got == release(combined, None)


@pytest.mark.parametrize("make", [_count, _sum], ids=["count", "sum"])
def test_windowed_batch_input_is_released_once_per_step_by_shards(make):
    """Input in fixed windows: the sharded path merges its partial totals in the global
    window, so each (key, step) is released once, as by the per-key path (this used to
    fail on the FnApiRunner with a window coder mismatch)."""
    keys, steps = 12, 5
    per_key = _run_batch(make(keys, steps), keys, steps, 0, windowed=True)
    sharded = _run_batch(make(keys, steps), keys, steps, 3, windowed=True)
    assert len(sharded[0]) == keys * steps
    assert sharded[0] == per_key[0] and sharded[1] == per_key[1]
    assert sorted(r[:2] for r in sharded[2]) == sorted(r[:2] for r in per_key[2])


# ------------------------------------------------ streaming shards: tree streams held as arrays

def _streaming_inner(horizon=None, end_step=None, **options):
    """The per-key release DoFn of a ContinualCount (tree by default), unbounded input."""
    count = dpb.ContinualCount(epsilon=1.0, step=HOUR, start=0, horizon=horizon,
                               **{"noise_key": KEY, **options})
    return OrderedReleaseDoFn(count.release_spec("count"), bounded=False, end_step=end_step,
                              seed=count._seed, noise_key=count._noise_key)


class _ShardCells:
    """A ShardedReleaseDoFn and its shard's state cells and timer (tests/fake_state.py)."""

    def __init__(self, inner):
        self.dofn = ShardedReleaseDoFn(inner)
        self.dofn.setup()
        self.streams, self.groups, self.armed, self.timer = Cell(), Cell(), Cell(), Timer()

    def send(self, key, step, aggregate):
        return list(self.dofn.process((0, (key, (step, aggregate))), self.streams, self.armed,
                                      self.timer))

    def fire(self, at):
        return list(self.dofn.on_release(Timestamp.of(at), self.streams, self.groups,
                                         self.armed, self.timer))


class _PerKeyCells:
    """The per-key DoFn with one set of cells and a timer per key, fired as a runner would."""

    def __init__(self, inner):
        self.dofn = inner
        inner.setup()
        self.cells = {}

    def send(self, key, step, aggregate):
        cells = self.cells.setdefault(key, (Bag(), Cell(), Cell(), Cell(), Cell(), Timer()))
        buffer, _, nxt, first, earliest, timer = cells
        return list(self.dofn._process((key, (step, aggregate)), buffer, nxt, first, earliest,
                                       timer))

    def fire(self, at):
        out = []
        for key, cells in self.cells.items():
            timer = cells[5]
            while timer.at is not None and float(timer.at) <= at:
                due, timer.at = float(timer.at), None
                out += self.dofn._fire(key, Timestamp.of(due), *cells)
        return out


def _outputs(outputs):
    """Every release, ledger entry and dead letter of a firing, in a canonical order."""
    def payload(value):
        return getattr(value, "value", value)

    releases = sorted(tuple(o.value) for o in outputs if not isinstance(o, pvalue.TaggedOutput))
    tagged = sorted((o.tag, repr(payload(o.value))) for o in outputs
                    if isinstance(o, pvalue.TaggedOutput))
    return releases, tagged


def _drive(cells, plan):
    """Runs ``plan`` (``("send", key, step, aggregate)`` / ``("fire", seconds)``) on ``cells``;
    the outputs of each action."""
    return [_outputs(cells.send(*action[1:]) if action[0] == "send" else cells.fire(action[1]))
            for action in plan]


def _plan(keys, steps, late=(), jumps=()):
    """Stream markers, then per step each key's total (key j has j % 3 events), and a firing
    at the step's end (or only at the ends in ``jumps``, when given); ``late`` adds
    (key, step, at step) aggregates that arrive after their step was released."""
    plan = [("send", k, 0, StreamStart()) for k in keys]
    for s in range(steps):
        plan += [("send", k, s, (float(j % 3) + 0.25 * s, j % 3)) for j, k in enumerate(keys)
                 if j % 3]
        plan += [("send", k, step, (1.0, 1)) for k, step, at in late if at == s]
        if not jumps or s in jumps:
            plan.append(("fire", (s + 1) * HOUR))
    return plan


#: The mechanisms a streaming shard holds as arrays. With a horizon the default with Laplace
#: noise is the smooth binary mechanism: the tree is asked for; BLT is Gaussian's default.
_ARRAY_KINDS = {"tree": dict(mechanism="tree"), "blt": dict(noise="gaussian", delta=1e-6)}


@pytest.mark.parametrize("kind", sorted(_ARRAY_KINDS))
@pytest.mark.parametrize("horizon,end_step", [(None, None), (None, 12), (16, None), (5, None)],
                         ids=["unbounded", "schedule-end", "horizon", "horizon-closes"])
def test_streaming_shard_steps_its_streams_from_one_array(kind, horizon, end_step):
    """Tree or BLT streams that open together are held as one group: the shard's state keeps
    them as arrays with a column per stream (tree nodes; BLT's float buffers, its integer
    buffers a list per stream) and each stream's mechanism cell names its column, not a
    state of its own. Every firing's records are the per-key path's, bit for bit; streams
    that close (schedule end, horizon) leave the group with their own final state."""
    keys = [f"k{j}" for j in range(7)]
    plan = _plan(keys, 12, late=[("k1", 2, 4)], jumps=(0, 1, 4, 5, 6, 8, 11))
    shard = _ShardCells(_streaming_inner(horizon, end_step, **_ARRAY_KINDS[kind]))
    per_key = _PerKeyCells(_streaming_inner(horizon, end_step, **_ARRAY_KINDS[kind]))
    got, expected = _drive(shard, plan[:len(keys) + 6]), _drive(per_key, plan[:len(keys) + 6])
    assert got == expected
    groups = shard.groups.read()
    [(gid, group)] = groups.items()
    assert group["keys"] == keys
    arrays = group["arrays"]
    columns = next(arrays[f] for f in ("nodes", "floats", "roots") if arrays.get(f) is not None)
    assert columns.shape[-1] == len(keys)
    streams = shard.streams.read()
    assert [streams[k]["mechanism"] for k in keys] == [_Column(gid, j) for j in range(len(keys))]
    rest = plan[len(keys) + 6:]
    assert _drive(shard, rest) == _drive(per_key, rest)
    streams = shard.streams.read()
    if end_step is None and (horizon is None or horizon > 12):
        assert len(shard.groups.read()) == 1
    else:
        # Closed streams: the group is gone, each stream keeps its own state, the per-key one.
        assert shard.groups.read() is None
        for j, k in enumerate(keys):
            assert streams[k]["mechanism"] == per_key.cells[k][1].read()


def test_a_streaming_group_that_cannot_fire_whole_gives_its_streams_their_own_state():
    """A stream of a group that fires apart from the others (here: its timer moved by hand,
    as a stream that diverges would) breaks the group up: each stream continues from its
    own state, with the per-key path's records."""
    keys = [f"k{j}" for j in range(4)]
    plan = _plan(keys, 8)
    shard = _ShardCells(_streaming_inner())
    per_key = _PerKeyCells(_streaming_inner())
    assert _drive(shard, plan[:len(keys) + 10]) == _drive(per_key, plan[:len(keys) + 10])
    assert len(shard.groups.read()) == 1
    streams = shard.streams.read()
    # k2 fires one step later than the others (its per-key twin too).
    streams["k2"]["timer"] += HOUR
    per_key.cells["k2"][5].at = Timestamp.of(float(per_key.cells["k2"][5].at) + HOUR)
    rest = plan[len(keys) + 10:]
    assert _drive(shard, rest) == _drive(per_key, rest)
    assert shard.groups.read() is None
    assert all(isinstance(shard.streams.read()[k]["mechanism"], dict) for k in keys)


@pytest.mark.parametrize("options", [
    lambda: dict(mechanism="honaker"), lambda: dict(monotone=True),
    lambda: dict(rng=dpb.mechanisms.SeededNoise(3))], ids=["honaker", "monotone", "shared-source"])
def test_streaming_streams_that_cannot_be_held_as_arrays_keep_their_own_state(options):
    """Other counters (Honaker's) and monotone releases have no array form, and streams
    drawing from one shared test source (not a source per step) are not stepped together:
    each stream keeps its own state; the records are still the per-key path's."""
    keys = [f"k{j}" for j in range(4)]
    plan = _plan(keys, 5)
    shard = _ShardCells(_streaming_inner(**options()))
    per_key = _PerKeyCells(_streaming_inner(**options()))
    assert _drive(shard, plan) == _drive(per_key, plan)
    assert shard.groups.read() is None
    assert all(isinstance(shard.streams.read()[k]["mechanism"], dict) for k in keys)


def _benchmark(name):
    """The module of ``benchmarks/<name>.py``, loaded from its file."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_the_streaming_release_benchmark_compares_the_same_releases(noise, capsys):
    """benchmarks/streaming_release.py drives both release DoFns over several shards (130 keys:
    two shards) and stops if their releases differ; a short run must get through."""
    module = _benchmark("streaming_release")
    module.main(["--keys", "130", "--steps", "5", "--repeats", "1", "--noise", noise])
    assert "the same releases" in capsys.readouterr().out


def test_the_scale_benchmark_runs_the_mean_users_axis(capsys):
    """benchmarks/scale.py --mean-users: each user's events stay in one key, and a short run
    prints one row per user count with its event count."""
    module = _benchmark("scale")
    events = module.user_events(30, 3, 72)
    assert len(events) == 30 * module.USER_EVENTS
    assert all(e[0] == f"k{e[3] % 3}" for e in events)
    # A user's steps are distinct, so its samples are spread over the schedule.
    steps = {}
    for e in events:
        steps.setdefault(e[3], set()).add(int(e[1] // module.HOUR))
    assert all(len(s) == module.USER_EVENTS for s in steps.values())
    module.main(["--keys", "", "--mean-users", "20", "--mean-keys", "2", "--steps", "6",
                 "--repeats", "1", "--state-keys", "0"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("20 |")]
    assert len(rows) == 1 and rows[0].split("|")[1].strip() == "80"


def test_the_scale_benchmark_spreads_many_events_and_sizes_the_erm_blocks(capsys):
    """benchmarks/scale.py --per-step, --erm-block and the input case: two events a step stay a
    minute apart, more than 60 are spread over their hour, the ERM cases take the block size
    (base 2B), and a run with the input stage prints its share and each case's time beyond it."""
    module = _benchmark("scale")
    assert module.events_for(1, 1) == [("k0", 0.0, 0.0), ("k0", 60.0, 1.0)]
    events = module.events_for(2, 3, 70)
    assert len(events) == 2 * 3 * 70
    for k in range(2):
        for s in range(3):
            times = [e[1] for e in events if e[0] == f"k{k}" and int(e[1] // module.HOUR) == s]
            assert len(set(times)) == 70
    erm = module.private_transform("erm-d10", 2, 3, erm_block=16)
    assert (erm._config.block_size, erm._config.base_size) == (16, 32)
    module.main(["--keys", "2", "--steps", "3", "--per-step", "70", "--erm-block", "16",
                 "--cases", "sharded,erm-d10,input,filled", "--repeats", "1", "--state-keys", "0"])
    out = capsys.readouterr().out
    assert "70 events per key and step, ERM blocks of 16" in out
    lines = [line for line in out.splitlines() if "input stage" in line]
    assert len(lines) == 1 and "sharded " in lines[0] and "erm-d10 " in lines[0]


def test_the_scale_benchmark_gives_the_erm_cases_array_features_of_the_same_values(capsys):
    """benchmarks/scale.py --array-features: the features are new NumPy arrays of the list
    values, the non-private models are those fitted on the lists, and a run says so."""
    module = _benchmark("scale")
    as_list, as_array = module._Features(10), module._Features(10, as_array=True)
    event = ("k0", 60.0, 3.0)
    assert type(as_array(event)) is np.ndarray and as_array(event) is not as_array(event)
    assert as_array(event).tolist() == as_list(event)
    events = ("k0", [("k0", 60.0 * i, float(i % 5)) for i in range(16)])
    fits = [list(module._PlainERM(10, 8, array_features=a).process(events)) for a in (False, True)]
    assert [n for _, n, _ in fits[0]] == [8, 16]
    assert all(np.array_equal(a[2], b[2]) for a, b in zip(*fits))
    module.main(["--keys", "2", "--steps", "2", "--erm-block", "2", "--array-features",
                 "--cases", "sharded,erm-d10,plain-erm-d10,filled", "--repeats", "1",
                 "--state-keys", "0"])
    assert "ERM blocks of 2, features as NumPy arrays" in capsys.readouterr().out


def test_the_scale_benchmark_floor_does_the_work_of_the_transforms(capsys):
    """benchmarks/scale.py --floor: the engine-free ERM mechanism alone trains as many models
    on the case's points as the transform releases (so the floor does the whole work of the
    models, and no more), the mean's steps every stream at every step, and a run prints a
    line per case with the bound of the ratio."""
    module = _benchmark("scale")
    keys, steps, block = 3, 8, 4
    events = module.events_for(keys, steps)
    wall, cpu, models = module.mechanism_seconds("erm-d10", keys, steps, events, erm_block=block)
    assert wall > 0 and cpu > 0

    def build(p):
        stamped = p | beam.Create(events) | beam.Map(module._stamp)
        return {"releases": (stamped | module.private_transform("erm-d10", keys, steps,
                                                                 erm_block=block)).releases}

    released = collect(batch_options(), build)["releases"]
    # 16 points per key: blocks 1 to 4 of 4, the first model at the base of 2 blocks.
    assert models == len(released) == keys * 3
    # The mean's floor steps every stream at every step, as the release does.
    assert module.mean_mechanism_seconds(keys, steps, events)[2] == keys * steps
    module.main(["--keys", "2", "--steps", "8", "--repeats", "1", "--cases",
                 "sharded,erm-d10,mean,input,filled", "--floor", "--state-keys", "0"])
    lines = [row for row in capsys.readouterr().out.splitlines() if "mechanism alone" in row]
    # In the order of --cases.
    assert len(lines) == 2 and "erm-d10 mechanism alone, no Beam (2 models)" in lines[0]
    assert "mean mechanism alone, no Beam (16 releases)" in lines[1]
    assert all("filled / (input + it)" in line for line in lines)



def test_the_scale_benchmark_moves_the_erm_points_alone(capsys):
    """benchmarks/scale.py points-d…: a bundle's buffers hold every event's time, features and
    label, per (key, step) under the shard of the key; the pipeline reads back every point;
    with --floor a line bounds the ERM case of the same d by the points' time."""
    module = _benchmark("scale")
    events = module.events_for(3, 2, 5)
    gather = module._GatherPoints(10, 2)
    gather.setup()
    gather.start_bundle()
    for e in events:
        gather.process(e)
    out = [wv.value for wv in gather.finish_bundle()]
    features = module._Features(10)
    seen = []
    for shard, items in out:
        for key, step, times, rows, labels in items:
            assert shard == module.shard_of(key, 2)
            matrix = np.frombuffer(rows, dtype="<f8").reshape(-1, 10)
            mine = [e for e in events if e[0] == key and int(e[1] // module.HOUR) == step]
            assert np.frombuffer(times, dtype="<f8").tolist() == [e[1] for e in mine]
            assert matrix.tolist() == [features(e) for e in mine]
            assert labels == [module._label(e) for e in mine]
            seen.extend(mine)
    assert sorted(seen) == sorted(events)
    assert list(module._ReadPoints(10).process((0, [[("k0", 0, b"", bytes(160), [0, 1])]]))) == [
        (0, 2)]

    def build(p):
        return {"read": p | beam.Create(events) | beam.ParDo(module._GatherPoints(10, 2))
                | beam.GroupByKey() | beam.ParDo(module._ReadPoints(10))}

    assert sum(n for _, n in collect(batch_options(), build)["read"]) == len(events)
    module.main(["--keys", "2", "--steps", "4", "--repeats", "1", "--per-step", "4",
                 "--erm-block", "4", "--cases", "sharded,erm-d10,points-d10,filled", "--floor",
                 "--state-keys", "0"])
    out = capsys.readouterr().out
    assert len([row for row in out.splitlines()
                if "points moved alone / filled" in row and "points-d10 " in row]) == 1
    assert len([row for row in out.splitlines()
                if "erm-d10 with its points moved alone" in row]) == 1


def test_the_lockstep_benchmark_checks_that_both_ways_release_the_same(capsys, monkeypatch):
    """benchmarks/lockstep.py: one row per case, and a run whose streams stepped together
    released other values than one by one is refused."""
    module = _benchmark("lockstep")
    module.main(["--streams", "3", "--steps", "5", "--repeats", "1"])
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[0].strip() for r in rows] == list(module.CASES)
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)
    together = module._together
    # A planted difference: the last stream's last release replaced by its first.
    monkeypatch.setattr(module, "_together", lambda make, inputs, kind:
                        (lambda out: out[:-1] + out[:1])(together(make, inputs, kind)))
    with pytest.raises(AssertionError, match="other values"):
        module.run("mean", 3, 5, 1)


def test_the_lockstep_benchmark_counts_the_values_drawn_and_restores_the_draws(capsys):
    """benchmarks/lockstep.py --draws: the values its timed run counts are the draws the same
    tree streams make stepped alone (a node a draw, counted by their own sources), and the
    draw methods are KeyedNoise's own again afterwards."""
    from dp_beam.mechanisms import BinaryTreeMechanism
    from dp_beam.mechanisms.noise_key import KeyedNoise
    module = _benchmark("lockstep")
    originals = {name: getattr(KeyedNoise, name) for name in module._DRAWS}
    values, seconds, total = module.draw_cost("tree", 3, 5)
    assert {name: getattr(KeyedNoise, name) for name in module._DRAWS} == originals
    # The same streams stepped alone, their draws counted by the sources themselves.
    drawn = 0
    streams = [BinaryTreeMechanism(1.0) for _ in range(3)]
    for t in range(5):
        for j, m in enumerate(streams):
            source = module._source(j, t)
            m.set_noise_source(source)
            m.step(float((j + t) % 3))
            drawn += source.draws
    assert values == drawn / 15 and 0 < seconds < total
    module.main(["--streams", "3", "--steps", "5", "--repeats", "1", "--cases", "tree,mean",
                 "--draws"])
    out = capsys.readouterr().out.splitlines()
    rows = [line.split("|") for line in out[out.index(
        "noise draws of the streams stepped together, per stream and step (one timed run)") + 2:]]
    assert [r[0].strip() for r in rows] == ["tree", "mean"]
    assert all(float(r[1]) > 0 and 0 < float(r[4]) < 1 for r in rows)


def test_the_scale_benchmark_times_the_garbage_collector_and_freezes_the_events(capsys):
    """benchmarks/scale.py --gc prints each case's seconds in the garbage collector, and
    --gc-freeze keeps the events out of its reach during the runs only."""
    import gc

    module = _benchmark("scale")
    frozen = gc.get_freeze_count()
    with module._GcClock(True) as clock:
        gc.collect()
    assert clock.seconds > 0 and gc.callbacks.count(clock._callback) == 0
    module.main(["--keys", "12", "--steps", "3", "--repeats", "1", "--cases", "sharded,filled",
                 "--state-keys", "0", "--gc", "--gc-freeze"])
    out = capsys.readouterr().out
    assert "the events frozen out of the garbage collector's reach" in out
    line = [row for row in out.splitlines() if "garbage collection, s:" in row]
    assert len(line) == 1 and "sharded " in line[0] and "filled " in line[0]
    assert gc.get_freeze_count() == frozen
