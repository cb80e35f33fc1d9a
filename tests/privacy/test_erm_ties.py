"""Ties in event time: one event's content must not decide where the other events go.

The ERM transforms cut each stream's points, in event-time order, into blocks
of ``block_size``; which block a point joins decides which models it changes.
Points with the same event time used to be ordered by their content (features,
label): replacing one of them (same timestamp and key: the replace-one relation
of these transforms) could move it to the other end of its tie group and shift
every later point across a block boundary, so almost every later model changed
and the stated ε no longer held. Ties are now broken by a public event id
(``id_fn``) or by a tie-breaker drawn at random, independently of the content.

These tests check, with the release code of :mod:`dp_beam.transforms.erm`:

* zero noise: replacing one tied point changes only the models that depend on
  its block (with ``id_fn``, through a pipeline; without it, given injected
  tie-breakers, the same for both neighbours as in the coupling argument);
* with noise: an empirical lower bound on the privacy loss at the outputs
  (Clopper–Pearson, from a threshold event over many noise draws) stays below
  the stated ε;
* planted bug: the same checks, run on the content order (re-implemented
  here), fail.
"""

import math

import apache_beam as beam
import numpy as np
import pytest
from scipy import stats

import dp_beam as dpb
import dp_beam.transforms.erm as transforms_erm
from dp_beam.transforms.erm_points import PointBatch, PreparePoints, reproducible_tiebreak
from dp_beam.mechanisms import SeededNoise, ZeroNoise
from dp_beam.mechanisms import erm as mech
from dp_beam.mechanisms.erm import l2_laplace_noise
from tests.beam_util import batch_options, collect, windowed_at

STEP = 10.0
TS = 5.0            # the event time of every point of the tie group
B = 4               # block size


def _content_order(point):
    """The order before the fix: (event time, features, label). Planted bug."""
    ts, _, features, label = point
    return (ts, features, repr(label))


def _release_into(mechanism, points, order=None, monkeypatch=None):
    """Runs one step's points through :meth:`ERMReleaseSpec.release` (the transform's release
    code) into ``mechanism``; ``order`` replaces its order key (the planted bug)."""
    spec = transforms_erm.ERMReleaseSpec("erm", STEP, None, {}, None)
    if order is not None:
        monkeypatch.setattr(transforms_erm, "_order_key", order)
        # A content order reads the points' features: the batch's order from its times and
        # order keys alone cannot follow it, so the bug takes the path that reads them.
        monkeypatch.setattr(transforms_erm.ERMReleaseSpec, "_batch_order", lambda self, batch: None)
    try:
        return list(spec.release(mechanism, "k", 0, points))
    finally:
        if order is not None:
            monkeypatch.undo()


def _release(cls, args, points, rng, order=None, monkeypatch=None):
    """The models an engine-free ``cls`` stream releases for one step's points."""
    return _release_into(cls(rng=rng, **args), points, order, monkeypatch)


def _tie_group(n, replaced_at=None, d=2):
    """``n`` tied contents in increasing content order; labels alternate per block.

    ``replaced_at``: the neighbour in which that point's content is replaced by
    one that sorts after every other point (and has the other label).
    """
    out = []
    for i in range(n):
        x0 = i / 1000.0
        features = (x0, math.sqrt(1.0 - x0 * x0)) if d == 2 else (0.9 + x0 / 10,)
        out.append((features, 1 if (i // B) % 2 == 0 else 0))
    if replaced_at is not None:
        features = (0.9, math.sqrt(1 - 0.81)) if d == 2 else (0.99,)
        out[replaced_at] = (features, 1 - out[replaced_at][1])
    return out


def _draws(seed, n):
    """``n`` distinct 63-bit tie-breakers (stand-ins for the OS draws, injected)."""
    draws = np.random.default_rng(seed).integers(0, 2**63 - 1, size=n, dtype=np.int64)
    assert len(set(draws.tolist())) == n
    return draws


def _points(contents, tiebreaks, form="list"):
    """Prepared points ``(ts, (id, tiebreak), features, label)``, handed over in scrambled order,
    as a list (the per-key path) or as the sharded batch release gets them (``"batch"``: a
    :class:`~dp_beam.transforms.erm_points.PointBatch` that crossed a grouping)."""
    pts = [(TS, ((), int(t)), f, y) for (f, y), t in zip(contents, tiebreaks)]
    pts = [pts[i] for i in np.random.default_rng(99).permutation(len(pts))]
    if form == "list":
        return pts
    return PointBatch.from_wire(PointBatch.of(pts).wire())


def _vector(record):
    return np.append(np.ravel(record.weights), np.ravel(record.intercept))


def _changed(first, second):
    assert [(r.t, r.kind, r.level) for r in first] == [(r.t, r.kind, r.level) for r in second]
    return [i for i, (a, b) in enumerate(zip(first, second))
            if not np.array_equal(_vector(a), _vector(b))]


def _depending_on(records, position):
    """Models that are a function of the point at 0-based ``position`` (``depends_on``: ranges (a, b])."""
    return {i for i, r in enumerate(records) if any(a < position + 1 <= b for a, b in r.depends_on)}


STREAMS = {
    "continual": (mech.ContinualERMMechanism, dict(base_size=2 * B)),
    "sliding": (mech.SlidingWindowERMMechanism, dict(window=3 * B)),
    "multires": (mech.MultiResolutionERMMechanism, dict()),
}


def _args(extra, d=2, epsilon=1.0, lam=0.5, intercept=True):
    return dict(epsilon=epsilon, block_size=B, n_features=d, classes=[0, 1], feature_bound=1.0,
                lam=lam, fit_intercept=intercept, **extra)


# -- zero noise: what the stream sees, which models a replacement changes ---------------


class _Recorder:
    """Stands for the engine-free stream: records the points the release pushes, in order."""

    block_size = B
    name = "recorder"

    def __init__(self):
        self.pushed = []

    def push(self, features, label):
        self.pushed.append((features, label))
        return []

    def extend(self, X, labels):
        # A step of many points comes as one array: recorded row by row, as pushes would be.
        self.pushed.extend((tuple(float(v) for v in row), label) for row, label in zip(X, labels))
        return []


def _pushed(points, order=None, monkeypatch=None):
    recorder = _Recorder()
    _release_into(recorder, points, order, monkeypatch)
    return recorder.pushed


def _first_release_with(records, position):
    """``t`` of the first model released once the block holding ``position`` is complete."""
    return min(r.t for r in records if r.t >= (position // B + 1) * B)


def _rank(tiebreaks, index):
    """Position of point ``index`` in (ts, tiebreak) order (all points tied)."""
    return int(np.argsort(np.argsort(tiebreaks))[index])


@pytest.mark.parametrize("form", ["list", "batch"])
@pytest.mark.parametrize("replaced", [5, 250])
def test_the_stream_sees_replace_one_neighbours_at_the_tiebreakers_position(replaced, form,
                                                                             monkeypatch):
    # 120 blocks of 4 tied points. Production order, given the tie-breakers (the
    # replacement keeps its event, hence its draw: the coupling of the argument in
    # dp_beam.transforms.erm): the two pushed sequences differ in exactly one
    # position, the rank of the replaced event's draw. The same for the points as the
    # sharded batch release receives them.
    n = 120 * B
    tiebreaks = _draws(3, n)
    first = _pushed(_points(_tie_group(n), tiebreaks, form))
    second = _pushed(_points(_tie_group(n, replaced), tiebreaks, form))
    differ = [i for i in range(n) if first[i] != second[i]]
    assert differ == [_rank(tiebreaks, replaced)]
    # Planted bug: in content order every later point moves up by one.
    first = _pushed(_points(_tie_group(n), tiebreaks, form), _content_order, monkeypatch)
    second = _pushed(_points(_tie_group(n, replaced), tiebreaks, form), _content_order, monkeypatch)
    differ = [i for i in range(n) if first[i] != second[i]]
    assert differ == list(range(replaced, n))


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_zero_noise_a_replaced_tied_point_changes_only_the_models_of_its_block(name, monkeypatch):
    # 120 blocks of 4 tied points; the point at index 5 is replaced. Production
    # order with injected tie-breakers, the same for both neighbours.
    cls, extra = STREAMS[name]
    n, replaced = 120 * B, 5
    tiebreaks = _draws(3, n)
    position = _rank(tiebreaks, replaced)
    runs, pushed = {}, {}
    for order in (None, _content_order):
        runs[order] = [_release(cls, _args(extra), _points(_tie_group(n, r), tiebreaks), ZeroNoise(),
                                order, monkeypatch) for r in (None, replaced)]
        pushed[order] = [_pushed(_points(_tie_group(n, r), tiebreaks), order, monkeypatch)
                         for r in (None, replaced)]

    def training_changed(order):
        (first, second), records = pushed[order], runs[order][0]
        return {i for i, r in enumerate(records)
                if first[r.trained_on[0]:r.trained_on[1]] != second[r.trained_on[0]:r.trained_on[1]]}

    def containing(records, pos):
        return {i for i, r in enumerate(records) if r.trained_on[0] < pos + 1 <= r.trained_on[1]}

    base, other = runs[None]
    # The calls whose training data change are exactly those trained on the point
    # (the ones its privacy cost is charged for) ...
    assert training_changed(None) == containing(base, position) != set()
    # ... and, without noise, the models that change are among those that depend on
    # it through their data or their chain of regularisers (with noise that chain
    # runs through released models: post-processing). The others are bit-identical.
    changed = _changed(base, other)
    assert changed and set(changed) <= _depending_on(base, position)
    assert min(base[i].t for i in changed) == _first_release_with(base, position)
    # Planted bug: in content order, calls that never trained on the replaced point
    # train on changed data: nearly every model of the stream.
    base_c = runs[_content_order][0]
    # (It sits at index 5 in D and last in D'.)
    leaked = training_changed(_content_order) - containing(base_c, replaced) - containing(base_c, n - 1)
    assert len(leaked) >= 0.9 * len(base_c)


def test_zero_noise_with_id_fn_through_the_pipeline_only_the_block_of_the_replaced_event():
    # id_fn: ties are ordered by a public event id that a replacement keeps.
    n = 30 * B
    ids = [int(v) for v in np.random.default_rng(5).permutation(10 * n)[:n]]
    replaced = ids.index(sorted(ids)[50])      # the event whose id ranks 51st (block 13)

    def events(replaced_at=None):
        return [{"ts": TS, "id": i, "x": list(f), "y": y}
                for i, (f, y) in zip(ids, _tie_group(n, replaced_at))]

    def run(evts):
        transform = dpb.ContinualERM(
            features_fn=lambda e: e["x"], label_fn=lambda e: e["y"], classes=(0, 1), n_features=2,
            feature_bound=1.0, lam=0.5, epsilon=1.0, block_size=B, base_size=2 * B, step=STEP,
            start=0.0, end=STEP, timestamp_fn=lambda e: e["ts"], id_fn=lambda e: e["id"],
            rng=ZeroNoise())

        def build(p):
            res = p | beam.Create(evts) | transform
            return {"releases": res.releases, "invalid": res.invalid}
        out = collect(batch_options(), build)
        assert out["invalid"] == []
        return sorted(out["releases"], key=lambda r: (r.t, r.kind, r.level))

    base, other = run(events()), run(events(replaced))
    position = sorted(ids).index(ids[replaced])
    changed = _changed(base, other)
    assert changed and set(changed) <= _depending_on(base, position)
    assert min(base[i].t for i in changed) == _first_release_with(base, position)
    # The order is the id order, whatever the content: the engine-free stream fed
    # in id order gives the same models.
    stream = mech.ContinualERMMechanism(1.0, B, 2 * B, 2, [0, 1], 1.0, 0.5, rng=ZeroNoise())
    ordered = [e for _, e in sorted(zip(ids, events()))]
    expected = stream.extend(np.array([e["x"] for e in ordered]), [e["y"] for e in ordered])
    assert len(expected) == len(base)
    for got, want in zip(base, expected):
        np.testing.assert_allclose(got.weights, want.weights, atol=1e-12)


# -- the tie-breaker itself -------------------------------------------------------------


def _prepare(reproducible=False, seed=None, id_fn=None):
    dofn = PreparePoints(
        "erm", lambda e: e["x"], lambda e: e["y"], 2, (0, 1), 1.0,
        timestamp_fn=lambda e: e["ts"], id_fn=id_fn, reproducible=reproducible, seed=seed)

    def run(element):
        (out,) = list(dofn.process(element, windowed=windowed_at()))
        return out
    return run


def test_production_tiebreakers_are_keyed_and_replay_stable():
    prepare = _prepare()
    points = [prepare({"ts": TS, "x": [0.1, 0.2], "y": 0}).value[1],
              prepare({"ts": TS, "x": [0.9, -0.3], "y": 1}).value[1],
              prepare({"ts": TS, "x": [0.1, 0.2], "y": 0}).value[1]]     # same content as the first
    # The first stage leaves the tie-breaker to the release.
    assert [p[1] for p in points] == [((), None)] * 3
    assert points[0][0] == TS and points[0][2] == (0.1, 0.2)

    def spec(key):
        return transforms_erm.ERMReleaseSpec("erm", 10.0, None, {"classes": [0, 1]}, None, key)

    key = dpb.NoiseKey.from_bytes(bytes(range(32)))
    ordered = spec(key).ordered("A", points)
    breakers = [p[1][1] for p in ordered]
    # Identical points get distinct tie-breakers (their occurrence differs).
    assert len(set(breakers)) == 3 and all(0 <= t < 2**64 for t in breakers)
    # Replay-stable: the same key orders the same step the same way, in any arrival order...
    assert spec(key).ordered("A", list(reversed(points))) == ordered
    # ...while another key or another stream draws other tie-breakers.
    other = dpb.NoiseKey.from_bytes(bytes(range(1, 33)))
    assert [p[1][1] for p in spec(other).ordered("A", points)] != breakers
    assert [p[1][1] for p in spec(key).ordered("B", points)] != breakers


def test_only_tied_points_draw_tie_breakers_and_the_order_is_that_of_drawing_them_all():
    import random

    def spec(key):
        return transforms_erm.ERMReleaseSpec("erm", 10.0, None, {"classes": [0, 1]}, None, key)

    key = dpb.NoiseKey.from_bytes(bytes(range(32)))
    rnd = random.Random(5)
    # A step with lone points, ties in time, ties in (time, id), and identical points.
    points = [(float(rnd.randrange(4)), ((rnd.randrange(2),), None),
               (rnd.randrange(3) / 4, 0.5), rnd.randrange(2)) for _ in range(40)]
    points += [(4.0 + i, ((0,), None), (0.25, 0.5), 1) for i in range(3)]
    rnd.shuffle(points)
    ordered = spec(key).ordered("A", points)
    groups = {}
    for ts, (event_id, _), _, _ in points:
        groups[ts, event_id] = groups.get((ts, event_id), 0) + 1
    for ts, (event_id, tiebreak), _, _ in ordered:
        assert (tiebreak is None) == (groups[ts, event_id] == 1)
    # Every point given the keyed draw of its (time, content, occurrence): the same order.
    seen, everyone = {}, []
    for ts, (event_id, _), features, label in points:
        content = (ts, tuple(features), label)
        occurrence = seen.get(content, 0)
        seen[content] = occurrence + 1
        draw = key.stream("erm.tiebreak", "erm", "A", *content, occurrence).randbits(64)
        everyone.append((ts, (event_id, draw), features, label))
    everyone.sort(key=lambda p: (p[0], p[1]))
    assert [(p[0], p[1][0], p[2], p[3]) for p in ordered] == [
        (p[0], p[1][0], p[2], p[3]) for p in everyone]
    assert sum(n == 1 for n in groups.values()) >= 3 and max(groups.values()) > 2


def test_test_modes_break_ties_reproducibly_and_ids_come_first():
    seeded = _prepare(reproducible=True, seed=7)
    point = {"ts": TS, "x": [0.1, 0.2], "y": 1}
    first = seeded(point).value[1][1][1]
    assert first == seeded(dict(point)).value[1][1][1]
    assert first != _prepare(reproducible=True, seed=8)(point).value[1][1][1]
    assert first == reproducible_tiebreak(7, TS, (0.1, 0.2), 1)
    with_ids = _prepare(id_fn=lambda e: e["id"])
    keys = [transforms_erm._order_key(with_ids({**point, "id": i}).value[1])
            for i in (3, "a", 2.5, b"z", (1, "b"), [1, "a"])]
    # Ids of every accepted kind order against each other (never raising).
    ranked = sorted(keys)
    assert [k[1][0] for k in ranked] == [(0, 2.5), (0, 3), (1, "a"), (2, b"z"), (3, ((0, 1), (1, "a"))),
                                         (3, ((0, 1), (1, "b")))]


# -- with noise: the privacy loss at the outputs ------------------------------------------


def _epsilon_lower_bound(sample_d, sample_d2, statistic, n_pilot=4000, n=20000, alpha=0.05):
    """A (1 − alpha) lower bound on ε from one threshold event ``{statistic > τ}``.

    τ is chosen on pilot draws (the most lopsided threshold with at least 20 pilot
    hits); fresh draws then give Clopper–Pearson bounds, ``alpha/2`` each side:
    ``ε >= ln(lower(P_D[E]) / upper(P_D'[E]))``. The statistic is rounded to 1e-9
    so that floating-point low bits of the samples cannot form the event.
    """
    def stat(w):
        return np.round(statistic(w), 9)
    pilot_d, pilot_d2 = stat(sample_d(n_pilot)), stat(sample_d2(n_pilot))
    best, tau = -math.inf, None
    for cand in np.unique(np.quantile(pilot_d, np.linspace(0.3, 0.999, 300))):
        hits, other = np.sum(pilot_d >= cand), np.sum(pilot_d2 >= cand)
        if hits >= 20 and math.log(hits / max(other, 0.5)) > best:
            best, tau = math.log(hits / max(other, 0.5)), cand
    k1, k2 = int(np.sum(stat(sample_d(n)) >= tau)), int(np.sum(stat(sample_d2(n)) >= tau))
    lower = stats.beta.ppf(alpha / 2, k1, n - k1 + 1) if k1 else 0.0
    upper = stats.beta.ppf(1 - alpha / 2, k2 + 1, n - k2) if k2 < n else 1.0
    return math.log(lower / upper) if lower > 0 else -math.inf


@pytest.mark.parametrize("blocks,epsilon", [(120, 1.0), (60, 2.0)])
def test_empirical_privacy_loss_of_a_tied_replacement_stays_below_epsilon(blocks, epsilon, monkeypatch):
    # MultiResolutionERMMechanism with max_scale = 0: one model per block, each trained from
    # scratch, so a release is the noise-free models plus independent noise (no
    # chain through released models) and every output can be sampled exactly from
    # the models of the release code. One feature without intercept: the L2-Laplace
    # noise is Laplace(b). The event is the likelihood-ratio threshold between the
    # two neighbours (the most powerful one): if the loss at the outputs exceeded ε,
    # this is where it would show.
    n = blocks * B
    args = _args(dict(max_scale=0), d=1, epsilon=epsilon, lam=1.0, intercept=False)
    cls = mech.MultiResolutionERMMechanism
    tiebreaks = _draws(6, n)
    replaced = 2
    results = {}
    for label, order in (("production", None), ("content", _content_order)):
        base = _release(cls, args, _points(_tie_group(n, d=1), tiebreaks), ZeroNoise(), order, monkeypatch)
        other = _release(cls, args, _points(_tie_group(n, replaced, d=1), tiebreaks), ZeroNoise(), order,
                         monkeypatch)
        theta = np.array([r.weights[0] for r in base])
        theta2 = np.array([r.weights[0] for r in other])
        scale = np.array([r.noise_scale for r in base])
        if label == "production":
            # The released model is the noise-free one plus the stream's draw, exactly.
            for seed in (0, 1):
                noisy = _release(cls, args, _points(_tie_group(n, d=1), tiebreaks), SeededNoise(seed))
                source = SeededNoise(seed)
                draws = np.array([l2_laplace_noise(source, b, 1)[0] for b in scale])
                np.testing.assert_array_equal([r.weights[0] for r in noisy], theta + draws)
        rng = np.random.default_rng(7)
        results[label] = _epsilon_lower_bound(
            lambda k: theta + rng.laplace(0.0, 1.0, size=(k, blocks)) * scale,
            lambda k: theta2 + rng.laplace(0.0, 1.0, size=(k, blocks)) * scale,
            lambda w: np.sum((np.abs(w - theta2) - np.abs(w - theta)) / scale, axis=1))
        # The exact loss at the outputs: the noises are independent Laplace, so the
        # largest log-density ratio is Σ_j |θ_j − θ'_j| / b_j.
        results[label + " exact"] = float(np.sum(np.abs(theta - theta2) / scale))
    assert results["production exact"] <= epsilon / 2       # one model; scale-0 calls cost ε/2
    assert results["production"] <= epsilon
    # The estimate is a lower bound: it stays below the exact loss.
    assert results["production"] <= results["production exact"]
    assert results["content"] <= results["content exact"]
    # Planted bug: the content order's loss is many times ε, and the test sees it.
    assert results["content exact"] > 5 * epsilon
    assert results["content"] > epsilon
