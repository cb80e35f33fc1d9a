"""The per-event stage of the ERM transforms (erm_points.py) driven directly: validation,
clipping, ids and tie-breakers of single events, and the per-step collection of points."""

import math

import pytest
from apache_beam import pvalue

from dp_beam.transforms.erm_points import CollectPoints, PreparePoints, reproducible_tiebreak
from dp_beam.transforms.events import INVALID

TS = 12.0


def _prepare(**kwargs):
    dofn = PreparePoints("erm", lambda e: e["x"], lambda e: e["y"], 2, ("no", "yes"), 1.0,
                         timestamp_fn=lambda e: e["ts"], **kwargs)
    return lambda element: list(dofn.process(element, timestamp=None))


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
    outs = [list(dofn.process({**point, "ts": ts, "k": k}, timestamp=None))
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
    (bad,) = dofn.process({"ts": 3.0, "k": "a", "x": [0.1], "y": "no"}, timestamp=None)
    assert bad.tag == INVALID
    assert list(dofn.process({**point, "ts": 4.0, "k": "a"}, timestamp=None)) == []
    (last,) = list(dofn.finish_bundle())
    assert last.value == (shard_of("a", 2), [("a", 0, [(4.0, ((), None), (0.1, 0.2), "no")])])
