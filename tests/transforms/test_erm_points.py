"""The per-event stage of the ERM transforms (erm_points.py) driven directly: validation,
clipping, ids and tie-breakers of single events, and the per-step collection of points."""

import math
import pickle

import numpy as np
import pytest
from apache_beam import coders, pvalue

from dp_beam.transforms.erm_points import (CollectPoints, PackPoints, PointBatch, PreparePoints,
                                           reproducible_tiebreak)
from dp_beam.transforms.events import INVALID
from tests.beam_util import windowed_at

TS = 12.0


def _prepare(**kwargs):
    dofn = PreparePoints("erm", lambda e: e["x"], lambda e: e["y"], 2, ("no", "yes"), 1.0,
                         timestamp_fn=lambda e: e["ts"], **kwargs)
    return lambda element: list(dofn.process(element, windowed=windowed_at()))


def test_a_valid_event_becomes_a_keyed_timestamped_point():
    (out,) = _prepare()({"ts": TS, "x": [0.3, 0.4], "y": "yes"})
    key, (ts, (event_id, tiebreak), features, label) = out.value
    assert out.timestamp.micros == 12_000_000
    assert (key, ts, event_id, tiebreak, features, label) == (None, TS, (), None, (0.3, 0.4), "yes")


def test_features_beyond_the_bound_are_scaled_down_to_it_even_when_infinite_in_norm():
    prepare = _prepare()
    (out,) = prepare({"ts": TS, "x": [3.0, 4.0], "y": "no"})
    assert out.value[1][2] == pytest.approx((0.6, 0.8))
    (out,) = prepare({"ts": TS, "x": [1e308, 1e308], "y": "no"})    # a sum that overflows
    assert math.hypot(*out.value[1][2]) == pytest.approx(1.0)
    (out,) = prepare({"ts": TS, "x": [0.3, 0], "y": "no"})               # an int among floats
    assert out.value[1][2] == (0.3, 0.0) and type(out.value[1][2][1]) is float


@pytest.mark.parametrize("event, reason", [
    ({"ts": TS, "x": [0.1], "y": "no"}, "features"),
    ({"ts": TS, "x": [0.1, float("nan")], "y": "no"}, "NaN"),
    # Plain floats are checked by their sum: each non-finite kind must still be caught.
    ({"ts": TS, "x": [0.1, float("inf")], "y": "no"}, "feature value is infinite"),
    ({"ts": TS, "x": [float("-inf"), float("inf")], "y": "no"}, "feature value is infinite"),
    ({"ts": TS, "x": [True, 0.5], "y": "no"}, "feature not a real number: bool"),
    ({"ts": TS, "x": [0.1, 0.2], "y": "maybe"}, "is not one of classes"),
    ({"ts": TS, "x": [0.1, 0.2], "y": ["no"]}, "is not one of classes"),
])
def test_bad_events_go_to_invalid_with_a_reason(event, reason):
    (out,) = _prepare()(event)
    assert isinstance(out, pvalue.TaggedOutput) and out.tag == INVALID
    assert reason in out.value.reason


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int64", "uint64",
                                   "longdouble"])
def test_array_features_give_the_points_of_their_values_one_by_one(dtype):
    # 1-D arrays of floats and ints take a C conversion instead of a check per NumPy scalar
    # (longdouble keeps the check per scalar): the point must be the one of the values
    # given as a list of those scalars, bit for bit.
    values = np.array([0.3, -0.4] if np.dtype(dtype).kind == "f" else [0, 1], dtype=dtype)
    prepare = _prepare()
    (fast,) = prepare({"ts": TS, "x": values, "y": "yes"})
    (slow,) = prepare({"ts": TS, "x": list(values), "y": "yes"})
    assert fast.value == slow.value
    assert [type(x) for x in fast.value[1][2]] == [float, float]


@pytest.mark.parametrize("x, reason", [
    (np.array([0.1, np.nan], dtype=np.float32), "feature value is NaN"),
    (np.array([0.1, np.inf]), "feature value is infinite"),
    (np.array([np.inf, -np.inf], dtype=np.float16), "feature value is infinite"),
    (np.array([0.1, 0.2, 0.3]), "features_fn returned 3 values, expected 2"),
    (np.array([[0.1, 0.2]]), "features_fn returned 1 values, expected 2"),
    (np.array([True, False]), "feature not a real number: bool"),
    (np.array([1 + 0j, 0j]), "feature not a real number: complex128"),
])
def test_bad_array_features_go_to_invalid_with_the_reason_of_their_values(x, reason):
    (out,) = _prepare()({"ts": TS, "x": x, "y": "no"})
    assert isinstance(out, pvalue.TaggedOutput) and out.tag == INVALID
    assert out.value.reason == reason


def test_ids_are_checked_and_tie_breakers_are_reproducible_only_in_test_modes():
    with_ids = _prepare(id_fn=lambda e: e["id"])
    (out,) = with_ids({"ts": TS, "x": [0.1, 0.2], "y": "no", "id": 7})
    assert out.value[1][1] == ((0, 7), None)
    (out,) = with_ids({"ts": TS, "x": [0.1, 0.2], "y": "no", "id": object()})
    assert out.tag == INVALID
    (out,) = _prepare(reproducible=True, seed=3)({"ts": TS, "x": [0.1, 0.2], "y": "yes"})
    assert out.value[1][1] == ((), reproducible_tiebreak(3, TS, (0.1, 0.2), 1))


def test_the_reproducible_tiebreak_is_a_64_bit_function_of_seed_and_point():
    draw = reproducible_tiebreak(1, TS, (0.1, 0.2), 0)
    assert 0 <= draw < 2 ** 64
    assert draw == reproducible_tiebreak(1, TS, (0.1, 0.2), 0)
    assert draw != reproducible_tiebreak(2, TS, (0.1, 0.2), 0)
    assert draw != reproducible_tiebreak(1, TS, (0.1, 0.2), 1)


def test_collect_points_keeps_every_point_of_the_step():
    fn = CollectPoints()
    a = fn.add_input(fn.add_input(fn.create_accumulator(), "p1"), "p2")
    b = fn.add_input(fn.create_accumulator(), "p3")
    assert fn.extract_output(fn.merge_accumulators([a, b, fn.create_accumulator()])) == [
        "p1", "p2", "p3"]
    assert fn.merge_accumulators([]) == []
    # Inputs are left as they were.
    assert a == ["p1", "p2"] and b == ["p3"]


def test_point_totals_gather_a_bundles_points_per_key_and_step_by_shard(monkeypatch):
    from dp_beam.transforms import erm_points
    from dp_beam.transforms.stream_keys import shard_of
    monkeypatch.setattr(erm_points, "MAX_BUNDLE_POINTS", 3)
    dofn = erm_points.PreparePointTotals(
        "erm", lambda e: e["x"], lambda e: e["y"], 2, ("no", "yes"), 1.0,
        key_fn=lambda e: e["k"], timestamp_fn=lambda e: e["ts"], step_micros=10_000_000, shards=2)
    dofn.start_bundle()
    point = {"x": [0.1, 0.2], "y": "no"}
    outs = [list(dofn.process({**point, "ts": ts, "k": k}, windowed=windowed_at()))
            for ts, k in ((1.0, "a"), (2.0, "a"), (15.0, "b"))]
    # Nothing leaves before the third point; then the table, one element per shard.
    assert outs[0] == outs[1] == []
    sent = sorted((shard, entry) for wv in outs[2] for shard, entries in [wv.value]
                  for entry in entries)
    assert len(outs[2]) == len({shard_of(k, 2) for k in "ab"})
    assert sent == sorted([
        (shard_of("a", 2), ("a", 0, [(1.0, ((), None), (0.1, 0.2), "no"),
                                     (2.0, ((), None), (0.1, 0.2), "no")])),
        (shard_of("b", 2), ("b", 1, [(15.0, ((), None), (0.1, 0.2), "no")]))])
    # A dead letter leaves at once; the rest waits for the end of the bundle.
    (bad,) = dofn.process({"ts": 3.0, "k": "a", "x": [0.1], "y": "no"}, windowed=windowed_at())
    assert bad.tag == INVALID
    assert list(dofn.process({**point, "ts": 4.0, "k": "a"}, windowed=windowed_at())) == []
    (last,) = list(dofn.finish_bundle())
    assert last.value == (shard_of("a", 2), [("a", 0, [(4.0, ((), None), (0.1, 0.2), "no")])])
    # Wide steps leave packed: here from 4 feature values, two points of d = 2.
    monkeypatch.setattr(erm_points, "PACK_MIN_VALUES", 4)
    monkeypatch.setattr(erm_points, "MAX_BUNDLE_POINTS", 100)
    dofn = erm_points.PreparePointTotals(
        "erm", lambda e: e["x"], lambda e: e["y"], 2, ("no", "yes"), 1.0,
        key_fn=lambda e: e["k"], timestamp_fn=lambda e: e["ts"], step_micros=10_000_000, shards=2)
    dofn.start_bundle()
    for ts in (1.0, 2.0, 15.0):
        assert list(dofn.process({**point, "ts": ts, "k": "a"}, windowed=windowed_at())) == []
    (wv,) = list(dofn.finish_bundle())
    shard, entries = wv.value
    assert shard == shard_of("a", 2) and [type(e[2]) for e in entries] == [tuple, list]
    assert [(key, step, list(erm_points.PackPoints().extract_output(acc)))
            for key, step, acc in entries] == [
        ("a", 0, [(1.0, ((), None), (0.1, 0.2), "no"), (2.0, ((), None), (0.1, 0.2), "no")]),
        ("a", 1, [(15.0, ((), None), (0.1, 0.2), "no")])]


# Points as PreparePoints makes them: plain (twice), with an id, with a test-mode tie-breaker
# (64 bits, as drawn).
POINTS = [(1.0, ((), None), (0.1, -0.2, 0.0), "no"),
          (1.0, ((), None), (0.1, -0.2, 0.0), "no"),
          (2.5, ((0, 7), None), (1e-300, 0.5, -0.0), "yes"),
          (3.0, ((), 2**63 + 5), (0.3, 0.4, 0.5), "yes")]


def test_a_point_batch_gives_its_points_back_exactly_in_every_form():
    for points in (POINTS, POINTS[:2], POINTS[2:], []):
        batch = PointBatch.of(points)
        assert len(batch) == len(points) and list(batch) == points
        # The wire form is what crosses a grouping: Beam's default coder keeps it exactly.
        wire = coders.FastPrimitivesCoder().decode(coders.FastPrimitivesCoder().encode(batch.wire()))
        again = list(PointBatch.from_wire(wire))
        assert again == points
        # Bits too: the sign of zero and a subnormal-scale value survive.
        assert [math.copysign(1.0, p[2][2]) for p in again] == [math.copysign(1.0, p[2][2])
                                                              for p in points]
        assert all(type(v) is float for p in again for v in p[2])
        assert list(pickle.loads(pickle.dumps(batch))) == points
    assert PointBatch.of(POINTS).matrix().shape == (4, 3) and PointBatch.of([]).matrix().shape == (0, 0)
    # Without ids or test-mode tie-breakers the order keys travel as None.
    assert PointBatch.of(POINTS[:2]).wire()[1] is None and PointBatch.of(POINTS).wire()[1] is not None


def test_extending_a_batch_appends_in_order_and_leaves_the_other_as_it_was():
    plain, marked = PointBatch.of(POINTS[:2]), PointBatch.of(POINTS[2:])
    out = PointBatch.of(POINTS[:1])
    out.extend(marked)
    out.extend(plain)
    assert list(out) == POINTS[:1] + POINTS[2:] + POINTS[:2]
    assert list(plain) == POINTS[:2] and list(marked) == POINTS[2:]


def test_pack_points_packs_wide_lists_and_merges_every_form_in_order_leaving_its_inputs(
        monkeypatch):
    from dp_beam.transforms import erm_points
    monkeypatch.setattr(erm_points, "PACK_MIN_VALUES", 9)     # 3 points of d = 3 and more
    fn = PackPoints()
    a = fn.create_accumulator()
    for point in POINTS[:2]:
        a = fn.add_input(a, point)
    assert a == POINTS[:2]
    # The third point makes 9 values: the accumulator is packed from then on.
    a = fn.add_input(a, POINTS[2])
    assert type(a) is PointBatch and list(a) == POINTS[:3]
    b = fn.add_input(fn.create_accumulator(), POINTS[3])
    wire = fn.compact(a)
    assert type(wire) is tuple and fn.compact(b) is b and fn.compact([]) == []
    assert fn.compact(wire) is wire and fn.compact(POINTS[:3]) == wire
    merged = fn.merge_accumulators([b, wire, fn.create_accumulator(), a])
    assert type(merged) is PointBatch
    assert list(fn.extract_output(merged)) == POINTS[3:] + POINTS[:3] + POINTS[:3]
    assert list(fn.extract_output(wire)) == POINTS[:3] == list(a) and b == POINTS[3:]
    # A packed accumulator takes more points in place, and a wire form as a new batch.
    grown = fn.add_input(fn.compact(a), POINTS[3])
    assert list(grown) == POINTS[:4] and list(fn.extract_output(wire)) == POINTS[:3]
    assert fn.add_input(a, POINTS[3]) is a and list(a) == POINTS[:4]
    # Lists alone stay a list, as CollectPoints merges them.
    assert fn.merge_accumulators([POINTS[:3], b]) == POINTS and fn.merge_accumulators([]) == []
    assert fn.extract_output(b) is b
