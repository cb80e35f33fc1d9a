"""Tests of ContinualERM / SlidingWindowERM / MultiResolutionERM: batch (FnApiRunner), the per-key
block log (spec private_erm_and_incremental_regression.md §3) and streaming (TestStream on
BundleBasedDirectRunner)."""

import dataclasses
import inspect
import json
import math
import random

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.transforms.window import TimestampedValue

import dp_beam as dpb
from dp_beam.mechanisms import ZeroNoise, make_noise
from dp_beam.mechanisms import erm as mech
from dp_beam.records import InvalidElement, LedgerEntry
from dp_beam.records_erm import ModelRecord
from dp_beam.transforms.erm import ContinualERM, MultiResolutionERM, SlidingWindowERM, _listify
from dp_beam.transforms.erm_points import reproducible_tiebreak
from dp_beam.mechanisms.stable_hash import stable_hash
from dp_beam.transforms.bag_log import BagLog
from dp_beam.transforms.release_spec import PLAN_ATTRIBUTE
from tests.beam_util import batch_options, collect, global_and_windowed, streaming_options

STEP = 10.0
# Every test's schedule starts at 0 (the step of the first point); each run passes
# its end (the end of the step of its last point, for _points(n): 1 + 1.7·(n − 1)).
COMMON = dict(features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=["a", "b"], n_features=2,
              feature_bound=2.0, lam=0.5, epsilon=1.0, step=STEP, start=0.0,
              timestamp_fn=lambda e: e["ts"])


def _points(n, seed=0, keys=("k",)):
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        x = rng.normal(size=2)
        x = x * min(1.0, 1.5 / np.linalg.norm(x))      # inside the bound: no clipping differences
        events.append({"ts": 1.0 + i * 1.7, "x": [float(v) for v in x], "y": "a" if x[0] + 0.3 * x[1] > 0 else "b",
                       "key": keys[i % len(keys)]})
    return events


def _run(transform, events):
    shuffled = list(events)
    random.Random(3).shuffle(shuffled)

    def build(p):
        res = p | beam.Create(shuffled, reshuffle=False) | "erm" >> transform
        return {"releases": res.releases, "accounting": res.accounting, "invalid": res.invalid}
    return collect(batch_options(), build)


def _reference(stream, events):
    ordered = sorted(events, key=lambda e: e["ts"])
    return stream.extend(np.array([e["x"] for e in ordered]), [e["y"] for e in ordered])


def test_continual_erm_matches_the_engine_free_stream_in_event_time_order():
    events = _points(40)
    out = _run(ContinualERM(block_size=4, base_size=8, rng=ZeroNoise(), end=70.0, **COMMON), events)
    releases = sorted(out["releases"], key=lambda r: r.t)
    expected = _reference(mech.ContinualERMMechanism(1.0, 4, 8, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), events)
    assert [r.t for r in releases] == [r.t for r in expected] == list(range(8, 41, 4))
    for got, want in zip(releases, expected):
        assert isinstance(got, ModelRecord)
        assert got.kind == want.kind and got.trained_on == want.trained_on
        assert got.depends_on == want.depends_on and got.data_window == want.window
        assert got.blocks == (want.trained_on[0] // 4, want.trained_on[1] // 4)
        np.testing.assert_allclose(got.weights, want.weights, rtol=0, atol=1e-12)
        assert got.intercept == pytest.approx(want.intercept, abs=1e-12)
        assert got.noise_std == pytest.approx(want.noise_std)
        # The step is the one in which the triggering (t-th) point arrived.
        ts = sorted(e["ts"] for e in events)[got.t - 1]
        assert got.window_start <= ts < got.window_end and got.step == int(ts // STEP)
    assert out["invalid"] == []
    (entry,) = out["accounting"]
    assert isinstance(entry, LedgerEntry)
    assert entry.epsilon == 1.0 and entry.delta == 0.0 and entry.mechanism == "erm_continual"
    assert entry.unit == "event" and "replace" in entry.neighbours


def test_seeded_runs_repeat_and_noise_is_present():
    events = _points(24)
    make = lambda: SlidingWindowERM(block_size=2, window=6, rng=11, end=50.0, **COMMON)  # noqa: E731
    first = sorted(_run(make(), events)["releases"], key=lambda r: r.t)
    second = sorted(_run(make(), events)["releases"], key=lambda r: r.t)
    assert [r.t for r in first] == list(range(6, 25, 2))
    assert [r.weights for r in first] == [r.weights for r in second]
    quiet = sorted(_run(SlidingWindowERM(block_size=2, window=6, rng=ZeroNoise(), end=50.0, **COMMON),
                        events)["releases"],
                   key=lambda r: r.t)
    assert any(not np.allclose(a.weights, b.weights) for a, b in zip(first, quiet))
    for r in first:
        lo, hi = r.data_window
        assert hi == r.t and hi - lo == 6
        assert all(lo <= a and b <= hi for a, b in r.depends_on)


def test_keyed_streams_are_independent_and_each_charges_the_ledger():
    events = _points(32, keys=("x", "y"))
    out = _run(MultiResolutionERM(block_size=4, rng=ZeroNoise(), key_fn=lambda e: e["key"], keys=["x", "y"],
                                  end=60.0, **COMMON), events)
    by_key = {}
    for r in out["releases"]:
        by_key.setdefault(r.key, []).append(r)
    assert set(by_key) == {"x", "y"}
    for key, releases in by_key.items():
        mine = [e for e in events if e["key"] == key]
        expected = _reference(mech.MultiResolutionERMMechanism(1.0, 4, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), mine)
        got = sorted(releases, key=lambda r: (r.t, r.level))
        assert [(r.t, r.level) for r in got] == [(r.t, r.level) for r in expected]
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a.weights, b.weights, atol=1e-12)
    assert sorted(e.key for e in out["accounting"]) == ["x", "y"]
    assert all(e.scope == "key" for e in out["accounting"])


def test_invalid_elements_are_routed_with_reasons_and_counts_add_up():
    good = _points(8)
    bad = [
        {"ts": 3.0, "x": [1.0], "y": "a"},                       # wrong length
        {"ts": 3.0, "x": [float("nan"), 0.0], "y": "a"},         # NaN
        {"ts": 3.0, "x": [0.1, 0.2], "y": "zzz"},                # unknown label
        {"ts": 3.0, "y": "a"},                                   # missing features
        {"ts": float("inf"), "x": [0.1, 0.2], "y": "a"},         # bad event time
        {"ts": 3.0, "x": "ab", "y": "a"},                        # not numbers
    ]
    out = _run(ContinualERM(block_size=4, base_size=4, rng=ZeroNoise(), end=20.0, **COMMON), good + bad)
    assert len(out["invalid"]) == len(bad)
    assert all(isinstance(r, InvalidElement) for r in out["invalid"])
    reasons = " | ".join(r.reason for r in out["invalid"])
    for fragment in ("expected 2", "NaN", "not one of classes", "KeyError", "infinite", "not a real"):
        assert fragment in reasons
    used = max(r.t for r in out["releases"])
    assert used + sum(r.count for r in out["invalid"]) == len(good) + len(bad)


def test_features_are_clipped_and_the_plan_is_attached():
    events = [{"ts": 1.0 + i, "x": [30.0 * (i % 2) - 15.0, 4.0], "y": "a" if i % 2 else "b"} for i in range(8)]
    transform = ContinualERM(block_size=4, base_size=4, rng=ZeroNoise(), end=STEP, **COMMON)
    out = _run(transform, events)
    clipped = [{**e, "x": list(np.array(e["x"]) * 2.0 / np.linalg.norm(e["x"]))} for e in events]
    expected = _reference(mech.ContinualERMMechanism(1.0, 4, 4, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), clipped)
    got = sorted(out["releases"], key=lambda r: r.t)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-9)

    def build(p):
        res = p | beam.Create(events) | "erm" >> ContinualERM(block_size=4, base_size=4, end=STEP, **COMMON)
        assert getattr(res.accounting, PLAN_ATTRIBUTE)[0].epsilon == 1.0
        return {}
    collect(batch_options(), build)


@pytest.mark.parametrize("cls,kwargs,name", [
    (SlidingWindowERM, dict(block_size=4, window=16), "window"),
    (SlidingWindowERM, dict(block_size=4, window=12, window_policy="x"), "window_policy"),
    (ContinualERM, dict(block_size=4, base_size=6), "base_size"),
    (ContinualERM, dict(block_size=4, base_size=8, step=0), "step"),
    (ContinualERM, dict(block_size=4, base_size=8, epsilon=-1), "epsilon"),
    (ContinualERM, dict(block_size=4, base_size=8, features_fn=None), "features_fn"),
    (ContinualERM, dict(block_size=4, base_size=8, classes="ab"), "classes"),
    (ContinualERM, dict(block_size=4, base_size=8, id_fn="id"), "id_fn"),
    (MultiResolutionERM, dict(block_size=4, max_scale=-2), "max_scale"),
    (MultiResolutionERM, dict(block_size=4, noise="gaussian"), "delta"),
    (MultiResolutionERM, dict(block_size=4, rng=1.5), "rng"),
    (ContinualERM, dict(block_size=4, base_size=8, start=None), "start"),
    (ContinualERM, dict(block_size=4, base_size=8, end=0.0), "end"),
    (MultiResolutionERM, dict(block_size=4, key_fn=lambda e: e["key"]), "keys"),
    (MultiResolutionERM, dict(block_size=4, keys=["x"]), "key_fn"),
    (MultiResolutionERM, dict(block_size=4, key_fn=lambda e: e["key"], keys="xy"), "keys"),
    (MultiResolutionERM, dict(block_size=4, key_fn=lambda e: e["key"], keys=dpb.PrivateKeys(1.0, 1e-6)),
     "PrivateKeys"),
])
def test_configuration_errors_name_the_parameter(cls, kwargs, name):
    args = {**COMMON, **kwargs}
    with pytest.raises(ValueError, match=name):
        cls(**args)


def test_max_idle_steps_is_gone():
    # The data-driven pause was removed: the schedule alone decides what is released.
    with pytest.raises(TypeError, match="max_idle_steps"):
        ContinualERM(block_size=4, base_size=8, max_idle_steps=2, **COMMON)


def test_public_schedule_and_key_set():
    # Batch input needs a declared end: the streams must not end where the data ends.
    events = _points(32, keys=("x", "y"))
    make = lambda **kw: MultiResolutionERM(block_size=4, rng=ZeroNoise(), key_fn=lambda e: e["key"],  # noqa: E731
                                           **{**COMMON, **kw})
    with pytest.raises(ValueError, match="end"):
        _run(make(keys=["x", "y"]), events)
    # A declared key without points ("z") has its stream and its ledger entry all the
    # same (it releases no model: models come with complete blocks). Points of an
    # undeclared key, before start or at/after end go to .invalid, with the reason.
    stray = [{**events[0], "key": "w"}, {**events[1], "ts": -0.5}, {**events[2], "ts": 60.0}]
    out = _run(make(keys=["x", "y", "z"], end=60.0), events + stray)
    reasons = sorted(r.reason.split(" (")[0] for r in out["invalid"])
    assert reasons == ["event time at or after end", "event time before start", "undeclared key 'w'"]
    assert sorted(e.key for e in out["accounting"]) == ["x", "y", "z"]
    assert {r.key for r in out["releases"]} == {"x", "y"}
    reference = _run(make(keys=["x", "y"], end=60.0), events)["releases"]
    order = lambda r: (r.key, r.t, r.level)  # noqa: E731
    assert [(r.key, r.t, r.level, r.step) for r in sorted(out["releases"], key=order)] == \
        [(r.key, r.t, r.level, r.step) for r in sorted(reference, key=order)]


def test_gaussian_option_reports_delta_and_rho():
    t = MultiResolutionERM(block_size=4, noise="gaussian", delta=1e-6, **COMMON)
    entry = t.plan_entry("m")
    assert entry.delta == 1e-6 and entry.rho > 0 and entry.noise == "gaussian"
    assert entry.sensitivity == pytest.approx(2 * math.sqrt(2.0**2 + 1) / 0.5)


def test_prediction_helper_accepts_transform_records():
    events = _points(16)
    out = _run(ContinualERM(block_size=8, base_size=8, rng=ZeroNoise(), end=30.0, **COMMON), events)
    last = max(out["releases"], key=lambda r: r.t)
    X = np.array([e["x"] for e in events])
    proba = mech.predict_proba(last, X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    labels = mech.predict(last, X)
    assert np.mean([a == e["y"] for a, e in zip(labels, events)]) > 0.8


# -- the per-key log (spec §3): engine-free checks of BagLog, then seeded and streaming runs ---------


class _Cell:
    def __init__(self):
        self.value, self.writes = None, 0

    def read(self):
        return self.value

    def write(self, value):
        self.value, self.writes = value, self.writes + 1


class _Bag:
    """Stands for a BagState: counts what a firing reads and writes."""

    def __init__(self):
        self.items, self.adds, self.reads, self.clears = [], 0, 0, 0

    def read(self):
        self.reads += 1
        return list(self.items)

    def add(self, value):
        self.items.append(value)
        self.adds += 1

    def clear(self):
        self.items, self.clears = [], self.clears + 1


def _fire_per_block(make, n_blocks, block, seed):
    """Runs a stream as the release DoFn does: restore from the small state and
    a BagLog at every block (one firing each), flush at the end of the firing."""
    bag, meta = _Bag(), _Cell()
    X, y = np.random.default_rng(seed).normal(size=(n_blocks * block, 2)), ["a", "b"] * (n_blocks * block // 2)
    gen = np.random.default_rng(seed)
    state, releases, per_firing = None, [], []
    for c in range(n_blocks):
        log = BagLog(bag, meta)
        stream = make(gen, log) if state is None else make(gen, log, state)
        before_adds, before_reads = bag.adds, bag.reads
        releases += stream.step(X[block * c:block * (c + 1)], y[block * c:block * (c + 1)])
        state = stream.to_state()
        log.flush()
        per_firing.append({"stored": len(bag.items), "adds": bag.adds - before_adds,
                           "reads": bag.reads - before_reads, "retained": stream.retained_blocks})
        assert log.stored == len(bag.items)
        assert [i for i, _ in bag.items] == list(range(c + 2 - len(bag.items), c + 2))
    memory = make(np.random.default_rng(seed), None)
    expected = memory.extend(X, y)
    assert releases == expected
    for a, b in zip(releases, expected):
        np.testing.assert_array_equal(a.params, b.params)
    return per_firing


def _maker(cls, **kwargs):
    args = dict(epsilon=1.0, n_features=2, classes=["a", "b"], feature_bound=2.0, lam=0.5, **kwargs)

    def make(rng, log, state=None):
        if state is not None:
            return cls.from_state(json.loads(json.dumps(state)), rng=rng, log=log)
        return cls(rng=rng, log=log, **args)
    return make


def test_bag_log_sliding_window_keeps_less_than_twice_the_window_with_amortised_rewrites():
    W, n = 7, 60
    firings = _fire_per_block(_maker(mech.SlidingWindowERMMechanism, block_size=2, window=2 * W), n, 2, seed=1)
    for c, f in enumerate(firings, start=1):
        live = f["retained"][1] - f["retained"][0] + 1
        assert live == min(c, W - 1)
        assert live <= f["stored"] < 2 * (W - 1)
        assert f["reads"] <= 1
    # Each block is added once, and a rewrite of the W − 1 live blocks happens at
    # most once per W − 1 released ones: at most 2 adds per block overall.
    assert sum(f["adds"] for f in firings) <= 2 * n
    assert sum(f["adds"] > 1 for f in firings) <= n // (W - 1) + 1
    # Half of the firings (odd offsets) train on the new block only and read nothing.
    assert 0 < sum(f["reads"] for f in firings) < n


def test_bag_log_capped_multiresolution_never_holds_more_than_its_interval():
    firings = _fire_per_block(_maker(mech.MultiResolutionERMMechanism, block_size=2, max_scale=2), 40, 2, seed=2)
    for c, f in enumerate(firings, start=1):
        assert f["stored"] == c % 4 and f["stored"] <= 3      # the aligned interval of 2^2 blocks
        assert f["adds"] == (c % 4 != 0)                       # cleared, unread, when it completes
        assert f["reads"] == (c % 2 == 0)                      # even blocks train on older ones


def test_bag_log_continual_appends_each_block_once_and_reads_only_for_base_and_doubling():
    firings = _fire_per_block(_maker(mech.ContinualERMMechanism, block_size=2, base_size=4), 40, 2, seed=3)
    tg = None
    for c, f in enumerate(firings, start=1):
        assert f["stored"] == c and f["adds"] == 1
        kind = mech.ContinualERMMechanism.schedule(c, 2, tg)
        if kind and kind[0] == "base":
            tg = c
        # Single steps and the first doubling step train on the new block alone.
        reads_old = kind is not None and (kind[0] == "base" or (kind[0] == "doubling" and kind[1] > 0))
        assert f["reads"] == int(reads_old)


def _seeded_reference(cls, args, events, seed, key=None, start_step=0, tie_seed=None):
    """The release path before the log: one self-contained state restored at
    every step with that step's seeded generator (as OrderedReleaseDoFn seeds),
    from the public start step on."""
    by_step = {}
    for e in events:
        by_step.setdefault(int(e["ts"] // STEP), []).append(e)
    state, out = None, []
    for step in range(start_step, max(by_step) + 1):
        rng = make_noise(np.random.default_rng([seed, stable_hash(key), step]))
        stream = cls(rng=rng, **args) if state is None else cls.from_state(state, rng=rng)
        # The transform's order in a test mode: event time, then the seeded tie-breaker.
        tiebreak = lambda e: reproducible_tiebreak(  # noqa: E731
            seed if tie_seed is None else tie_seed, e["ts"], tuple(e["x"]),
            args["classes"].index(e["y"]))
        for e in sorted(by_step.get(step, []), key=lambda e: (e["ts"], tiebreak(e))):
            out.extend(stream.push(e["x"], e["y"]))
        state = stream.to_state()
    return out


MECH_ARGS = dict(epsilon=1.0, n_features=2, classes=["a", "b"], feature_bound=2.0, lam=0.5)


def _assert_seeded_records(transform, cls, args, events, end):
    """The transform with rng=7 releases the models of :func:`_seeded_reference`, bit for bit."""
    out = _run(transform(rng=7, end=end, **args, **COMMON), events)
    got = sorted(out["releases"], key=lambda r: (r.t, r.level, r.kind))
    want = sorted(_seeded_reference(cls, {**MECH_ARGS, **args}, events, 7),
                  key=lambda r: (r.t, r.level, r.kind))
    assert [(r.t, r.kind, r.level) for r in got] == [(r.t, r.kind, r.level) for r in want]
    assert len(got) >= 20
    for a, b in zip(got, want):
        assert a.weights == _listify(b.weights) and a.intercept == b.intercept


@pytest.mark.parametrize("transform,cls,args", [
    (ContinualERM, mech.ContinualERMMechanism, dict(block_size=3, base_size=6)),
    (SlidingWindowERM, mech.SlidingWindowERMMechanism, dict(block_size=2, window=14)),
    (MultiResolutionERM, mech.MultiResolutionERMMechanism, dict(block_size=3)),
    (MultiResolutionERM, mech.MultiResolutionERMMechanism, dict(block_size=3, max_scale=2)),
])
def test_seeded_transform_with_log_matches_the_self_contained_state_bit_for_bit(transform, cls, args):
    events = _points(90)
    _assert_seeded_records(transform, cls, args, events, 160.0)


@pytest.mark.parametrize("transform,cls,args", [
    (ContinualERM, mech.ContinualERMMechanism, dict(block_size=3, base_size=6)),
    (SlidingWindowERM, mech.SlidingWindowERMMechanism, dict(block_size=2, window=14)),
    (MultiResolutionERM, mech.MultiResolutionERMMechanism, dict(block_size=4)),
])
def test_steps_of_many_points_go_in_as_one_array_with_the_records_of_a_push_per_point(
        transform, cls, args):
    # 25 points a step, 2 in the last: the release hands a step of at least _ARRAY_POINTS
    # points to the stream as one array (extend) and pushes the last step's points; the
    # reference pushes them all one by one.
    from dp_beam.transforms.erm import _ARRAY_POINTS
    events = [dict(e, ts=1.0 + 0.4 * i) for i, e in enumerate(_points(100, seed=4))]
    per_step = {}
    for e in events:
        per_step[int(e["ts"] // STEP)] = per_step.get(int(e["ts"] // STEP), 0) + 1
    counts = sorted(per_step.values())
    assert counts[0] < _ARRAY_POINTS <= counts[1]
    _assert_seeded_records(transform, cls, args, events, 50.0)


def test_seeded_ties_are_reproducible_and_follow_the_test_tiebreaker():
    # Four points per event time: a test seed orders them by a hash of (seed, point),
    # so runs repeat and match the reference; production draws the order at random.
    events = [{**e, "ts": 1.0 + (i // 4) * 1.7} for i, e in enumerate(_points(90))]
    args = dict(block_size=3, base_size=6)
    make = lambda: ContinualERM(rng=7, end=160.0, **args, **COMMON)  # noqa: E731
    got = sorted(_run(make(), events)["releases"], key=lambda r: (r.t, r.level, r.kind))
    again = sorted(_run(make(), events[::-1])["releases"], key=lambda r: (r.t, r.level, r.kind))
    want = sorted(_seeded_reference(mech.ContinualERMMechanism, {**MECH_ARGS, **args}, events, 7),
                  key=lambda r: (r.t, r.level, r.kind))
    assert len(got) == len(want) >= 20
    for a, b, c in zip(got, again, want):
        assert a.weights == b.weights == _listify(c.weights) and a.intercept == c.intercept
    # The order matters here (ties straddle blocks): the same noise with the ties
    # ordered by another seed's tie-breaker gives other models.
    shuffled = sorted(_seeded_reference(mech.ContinualERMMechanism, {**MECH_ARGS, **args}, events, 7, tie_seed=8),
                      key=lambda r: (r.t, r.level, r.kind))
    assert any(a.weights != _listify(b.weights) for a, b in zip(got, shuffled))


def test_ids_labels_and_huge_features_that_could_break_the_release():
    # id_fn: a public event id per event; ids of several kinds order together.
    # Ids that cannot be ordered with the others, and labels the release could not
    # look up (an array equal to a class), go to .invalid instead of crashing the
    # release; a huge feature vector is clipped to the bound, not to zero.
    good = _points(8)
    for i, e in enumerate(good):
        e["id"] = i if i % 2 else f"e{i}"
    huge = {"ts": good[-1]["ts"] + 0.1, "x": [1e308, -1e308], "y": "a", "id": (9, "z")}
    bad = [
        {**good[0], "id": None},                                  # None
        {**good[0], "id": float("nan")},                          # not orderable
        {**good[0], "id": {"a": 1}},                              # not an id
        {**good[0], "id": object()},                              # not an id
        {**good[0], "y": np.array("a")},                          # == "a", but unhashable
        {k: v for k, v in good[0].items() if k != "id"},          # id_fn raises
    ]
    transform = ContinualERM(block_size=3, base_size=3, rng=ZeroNoise(), end=20.0,
                             id_fn=lambda e: e["id"], **COMMON)
    out = _run(transform, good + [huge] + bad)
    reasons = sorted(r.reason for r in out["invalid"])
    assert len(reasons) == len(bad)
    for fragment in ("id_fn returned None", "non-finite", "id_fn returned dict", "id_fn returned object",
                     "not one of classes", "id_fn raised KeyError"):
        assert sum(fragment in r for r in reasons) == 1, fragment
    ordered = sorted(good, key=lambda e: e["ts"]) + [{**huge, "x": [math.sqrt(2), -math.sqrt(2)]}]
    expected = _reference(mech.ContinualERMMechanism(1.0, 3, 3, 2, ["a", "b"], 2.0, 0.5, rng=ZeroNoise()), ordered)
    got = sorted(out["releases"], key=lambda r: r.t)
    assert [r.t for r in got] == [3, 6, 9]
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a.weights, b.weights, atol=1e-9)


def _streaming(transform, events, late_event):
    """Events in three bursts with watermark advances; ``late_event`` arrives
    after the watermark has passed its step."""
    ev = lambda e: TimestampedValue(e, e["ts"])   # noqa: E731
    first = [e for e in events if e["ts"] < 30]
    second = [e for e in events if 30 <= e["ts"] < 50]
    third = [e for e in events if e["ts"] >= 50]
    random.Random(5).shuffle(first)
    stream = (_TestStream()
              .add_elements([ev(e) for e in first[:7]])
              .add_elements([ev(e) for e in first[7:]])
              .advance_watermark_to(30)
              .add_elements([ev(late_event)] + [ev(e) for e in second])
              .advance_watermark_to(50)
              .add_elements([ev(e) for e in third])
              .advance_watermark_to(third[-1]["ts"] + 2 * STEP)
              .advance_watermark_to_infinity())

    def build(p):
        res = p | stream | "erm" >> transform
        return {"releases": res.releases, "invalid": res.invalid}
    return collect(streaming_options(), build)


def _assert_same_models(streamed, batch):
    # Every release once, in release order (t increases with one release per
    # block for these two transforms), and the same models as the batch run.
    ts = [r.t for r in streamed]
    assert ts == sorted(set(ts)) and len(ts) >= 8
    batch = sorted(batch, key=lambda r: r.t)
    assert [(r.t, r.kind, r.step) for r in streamed] == [(r.t, r.kind, r.step) for r in batch]
    for a, b in zip(streamed, batch):
        assert a.weights == b.weights and a.intercept == b.intercept


def test_streaming_continual_erm_defers_a_late_point_and_matches_the_batch_run():
    events = sorted(_points(40), key=lambda e: e["ts"])
    late = {"ts": 12.5, "x": [0.4, -0.2], "y": "a", "key": "k"}   # step 1, released at watermark 30
    make = lambda: ContinualERM(block_size=3, base_size=6, rng=7, end=70.0, **COMMON)  # noqa: E731
    out = _streaming(make(), events, late)
    assert out["invalid"] == []
    # "defer" counts the late point into the next unreleased step (3), ahead of
    # that step's own points: in batch that is the same point stamped 30.0.
    batch = _run(make(), events + [{**late, "ts": 30.0}])["releases"]
    _assert_same_models(out["releases"], batch)
    assert max(r.t for r in out["releases"]) == 39


def test_streaming_sliding_window_erm_drops_a_late_point_and_matches_the_batch_run():
    events = sorted(_points(40), key=lambda e: e["ts"])
    late = {"ts": 12.5, "x": [0.4, -0.2], "y": "a", "key": "k"}
    make = lambda **kw: SlidingWindowERM(block_size=2, window=6, rng=7, end=70.0, **kw, **COMMON)  # noqa: E731
    out = _streaming(make(late="drop"), events, late)
    (dropped,) = out["invalid"]
    assert "late" in dropped.reason and dropped.count == 1
    batch = _run(make(), events)["releases"]
    _assert_same_models(out["releases"], batch)
    assert [r.t for r in out["releases"]] == list(range(6, 41, 2))


@pytest.mark.parametrize("cls, extra", [(ContinualERM, dict(base_size=4)),
                                        (SlidingWindowERM, dict(window=4)),
                                        (MultiResolutionERM, {})])
def test_a_misspelled_keyword_names_the_public_transform(cls, extra):
    import inspect
    assert not any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls).parameters.values())
    with pytest.raises(TypeError) as info:
        cls(block_size=4, end=40, timestamp=1, **extra, **COMMON)
    assert str(info.value).startswith(f"{cls.__name__}.__init__() got an unexpected keyword")
    assert "'timestamp'" in str(info.value)


#: The transforms' own options, beside the fields of their stream's config.
_TRANSFORM_OPTIONS = {"features_fn", "label_fn", "step", "start", "end", "key_fn", "keys",
                      "timestamp_fn", "id_fn", "allowed_lateness", "late", "rng", "noise_key",
                      "transient_errors", "shards", "label"}


@pytest.mark.parametrize("cls", [ContinualERM, SlidingWindowERM, MultiResolutionERM])
def test_the_transform_takes_its_stream_config_fields_with_the_config_defaults(cls):
    # One parameter list: the transform's keywords are its stream's config fields plus its own
    # options, and the model defaults are the config's, so the two cannot drift.
    config_cls = cls._stream_cls.config_cls
    params = inspect.signature(cls).parameters
    assert set(params) == {f.name for f in dataclasses.fields(config_cls)} | _TRANSFORM_OPTIONS
    for field in dataclasses.fields(config_cls):
        expected = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert params[field.name].default == expected, field.name


def test_the_transform_exposes_the_config_its_streams_are_built_from():
    t = SlidingWindowERM(block_size=4, window=12, rng=ZeroNoise(), end=STEP, **COMMON)
    assert t.config == mech.SlidingWindowERMConfig(epsilon=1.0, block_size=4, window=12, n_features=2,
                                                   classes=["a", "b"], feature_bound=2.0, lam=0.5)
    assert t.stream.config == t.config and t.stream.W == 3


def test_input_in_fixed_windows_releases_what_global_input_releases():
    """The schedule decides the steps, not the input's windows (design D2.1)."""
    events = _points(40) + [{"ts": 3.0, "x": [float("nan"), 0.0], "y": "a", "key": "k"}]
    plain, windowed = global_and_windowed(
        events, lambda e: e["ts"], STEP,
        lambda: dpb.ContinualERM(block_size=8, base_size=16, end=70.0, rng=5, **COMMON))
    assert plain[0] and plain[1] and windowed == plain


# -- the release's per-step work gives the bits of the computations it replaces -------------

KEY = dpb.NoiseKey.from_bytes(bytes(range(32)))


def _spec(cls=mech.ContinualERMMechanism, args=(("block_size", 3), ("base_size", 6))):
    from dp_beam.transforms.erm import ERMReleaseSpec
    return ERMReleaseSpec("erm", STEP, cls, {**MECH_ARGS, **dict(args)}, LedgerEntry(
        transform="erm", unit="event", neighbours="", epsilon=1.0, delta=0.0, rho=0.5,
        mechanism="erm", scope="key", key=None), KEY)


def test_release_order_with_production_tiebreakers_is_that_of_the_noise_key_streams():
    from dp_beam.transforms.release_spec import key_label
    spec = _spec()
    points = [(1.0 + (i // 4), ((), None), (0.1 * (i % 3), -0.2), "ab"[i % 2]) for i in range(24)]
    points += [points[0], points[0]]                       # identical points: occurrences 1, 2
    seen, want = {}, []
    for ts, (event_id, _), features, label in points:
        content = (ts, tuple(features), spec._class_index.get(label, -1))
        occurrence = seen.get(content, 0)
        seen[content] = occurrence + 1
        tiebreak = KEY.stream("erm.tiebreak", "erm", key_label("k"), *content, occurrence).randbits(64)
        want.append((ts, (event_id, tiebreak), features, label))
    assert spec.ordered("k", points) == sorted(want, key=lambda p: (p[0], p[1]))


@pytest.mark.parametrize("cls,args", [
    (mech.ContinualERMMechanism, dict(block_size=3, base_size=6)),
    (mech.SlidingWindowERMMechanism, dict(block_size=2, window=14)),
    (mech.MultiResolutionERMMechanism, dict(block_size=3, max_scale=2)),
])
def test_reseed_in_place_releases_what_the_state_round_trip_releases(cls, args):
    # The release DoFn reseeds at every step: in place now, through the state before.
    from dp_beam.transforms.release_spec import ReleaseSpec
    from dp_beam.mechanisms.noise_key import KeyedNoise
    spec = _spec(cls, args)
    events = _points(60)
    records = {}
    for how in ("in place", "round trip"):
        bag, meta = _Bag(), _Cell()
        mechanism, state, out = None, None, []
        for step in range(12):
            source = KeyedNoise(KEY, ("erm", "k")).for_identity(step, "step")
            if mechanism is None:
                # A firing's first step: the stream opens, or is restored with a new log.
                log = BagLog(bag, meta)
                if state is None:
                    mechanism = spec.new_mechanism(source, log=log)
                else:
                    mechanism = spec.restore(state, source, log=log)
            elif how == "in place":
                mechanism = spec.reseed(mechanism, source, log=mechanism.log)
            else:
                mechanism = ReleaseSpec.reseed(spec, mechanism, source, log=mechanism.log)
            aggregate = [(e["ts"], ((), None), tuple(e["x"]), e["y"]) for e in events[5 * step:5 * step + 5]]
            out += list(spec.release(mechanism, "k", step, aggregate))
            if step % 4 == 3:
                state = mechanism.to_state()
                mechanism.log.flush()
                mechanism = None
        records[how] = out
    assert len(records["in place"]) >= 8
    assert records["in place"] == records["round trip"]


@pytest.mark.parametrize("cls,args", [
    (mech.ContinualERMMechanism, dict(block_size=3, base_size=6)),
    (mech.SlidingWindowERMMechanism, dict(block_size=2, window=14)),
])
def test_a_steps_points_as_a_batch_release_what_the_list_of_them_releases(cls, args, monkeypatch):
    """The sharded batch release receives a step's points as a PointBatch (PackPoints, after
    its wire form crossed the grouping); the per-key path as a list. Both reach the stream in
    the same order with the same values: ties in event time, identical points (production
    tie-breakers from the noise key), ids, steps below and above the array threshold."""
    from dp_beam.mechanisms.noise_key import KeyedNoise
    from dp_beam.transforms import erm_points
    monkeypatch.setattr(erm_points, "PACK_MIN_VALUES", 1)      # every list leaves packed
    spec, fn = _spec(cls, args), erm_points.PackPoints()
    rnd = random.Random(4)
    steps = []
    for size in (1, 3, 9, 2, 12, 0, 8, 5, 17):
        points = [(float(rnd.choice((10, 10, 20))), ((rnd.choice((0, 1)), 1) if rnd.random() < .2 else (),
                                                      None),
                   (rnd.choice((0.25, -0.5, 0.125)), rnd.uniform(-1, 1)), rnd.choice("ab"))
                  for _ in range(size)]
        points += points[:size // 4]                        # identical points
        steps.append(points)
    # Wide steps with no tie-breaker to draw, ordered from the batch's times and order keys
    # alone: distinct times; one time with distinct ids; one time with the test modes'
    # tie-breakers (ints).
    steps.append([(30.0 + i % 5 + i / 10, ((), None), (0.5 - 0.1 * i, 0.25), "ab"[i % 2])
                  for i in range(10)])
    steps.append([(40.0, ((9 - i,), None), (0.1 * i, -0.25), "ab"[i % 3 == 0]) for i in range(9)])
    steps.append([(50.0, ((), 1000 - 7 * i), (0.05 * i, 0.5), "ab"[i % 2])
                  for i in range(9)])
    fast = []
    batch_order = spec._batch_order

    def spy(batch):
        order = batch_order(batch)
        fast.append(order is not None)
        return order

    monkeypatch.setattr(spec, "_batch_order", spy)
    records, states = {}, {}
    for form in ("list", "batch"):
        source = KeyedNoise(KEY, ("erm", "k"))
        mechanism = spec.new_mechanism(source.for_identity(0, "step"))
        out = []
        for step, points in enumerate(steps):
            aggregate = points
            if form == "batch":
                acc = fn.create_accumulator()
                for point in points[:3]:
                    acc = fn.add_input(acc, point)
                rest = fn.create_accumulator()
                for point in points[3:]:
                    rest = fn.add_input(rest, point)
                aggregate = fn.extract_output(fn.merge_accumulators([fn.compact(rest), acc]))
                assert len(points) <= 3 or type(aggregate) is erm_points.PointBatch
            mechanism = spec.reseed(mechanism, source.for_identity(step, "step"))
            out += list(spec.release(mechanism, "k", step, aggregate))
        records[form], states[form] = out, mechanism.to_state()
    assert len(records["list"]) >= 10
    assert sum(fast) == 3 and len(fast) == 7                # 4 wide steps with ties drawn
    assert repr(records["batch"]) == repr(records["list"])
    assert repr(states["batch"]) == repr(states["list"])


def _wide(n, d, seed):
    """n events of d features (norm < 1), 4 to a step: 4·d >= PACK_MIN_VALUES values a step."""
    rng = np.random.default_rng(seed)
    events = []
    for i in range(n):
        x = rng.normal(size=d)
        x = x * (0.9 / np.linalg.norm(x))
        events.append({"ts": 1.0 + i * 2.4, "x": [float(v) for v in x],
                       "y": "a" if x[0] > 0 else "b", "key": "k"})
    return events


def test_the_per_key_path_sends_wide_steps_packed_with_the_records_of_lists(monkeypatch):
    # shards=0 takes the per-key path: a CombinePerKey per (key, step) whose lifted partial
    # combine compacts each bundle's accumulators. With PackPoints a step of 4 points of
    # d = 40 (160 values) crosses the grouping packed; with CollectPoints as a list. The
    # records must be the same. (The streaming runner of these tests does not lift the
    # combine: compact is not called there, and a wide step arrives as the batch its
    # accumulator became.)
    from dp_beam.transforms import erm as erm_module
    from dp_beam.transforms.erm_points import CollectPoints, PackPoints
    compact = PackPoints.compact
    packed_sizes = []        # points per packed accumulator (the runner is in process)

    def spy(self, acc):
        out = compact(self, acc)
        if type(out) is tuple:
            packed_sizes.append(len(out[3]))
        return out

    monkeypatch.setattr(PackPoints, "compact", spy)
    common = dict(COMMON, n_features=40, feature_bound=1.0)
    events = _wide(48, 40, seed=9)

    def run():
        return _run(ContinualERM(block_size=8, base_size=16, rng=7, end=130.0, shards=0,
                                 **common), events)["releases"]

    packed = run()
    assert packed_sizes and max(packed_sizes) >= 4
    monkeypatch.setattr(erm_module, "PackPoints", CollectPoints)
    packed_sizes.clear()
    lists = run()
    assert not packed_sizes
    assert len(packed) >= 5
    assert [(r.t, r.kind, r.step, r.weights, r.intercept) for r in packed] == \
        [(r.t, r.kind, r.step, r.weights, r.intercept) for r in lists]
